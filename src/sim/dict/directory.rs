//! The simulated DICT's entries: keys of every type (CPF, CNPJ, PHONE, EMAIL,
//! EVP) generated deterministically from the seed, each with its account and
//! owner. Every 50th entry carries an open claim (its owner may change).

use std::collections::HashMap;

use serde::Serialize;

/// Key types of the DICT (spec 1.8.0 `KeyType`).
pub const KEY_TYPES: [&str; 5] = ["CPF", "CNPJ", "PHONE", "EMAIL", "EVP"];

/// One entry as the DICT answers it.
#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    pub key: String,
    pub key_type: &'static str,
    pub participant: String,
    pub branch: String,
    pub account_number: String,
    pub account_type: &'static str,
    pub owner_type: &'static str,
    pub tax_id: String,
    pub name: String,
    pub trade_name: Option<String>,
    pub open_claim: bool,
}

/// Every key the simulated DICT knows.
pub struct Directory {
    entries: HashMap<String, Entry>,
    by_type: HashMap<&'static str, Vec<String>>,
}

fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `n` digits of `v`, zero-padded.
fn digits(v: u64, n: usize) -> String {
    format!("{:0n$}", v % 10u64.pow(n as u32))
}

/// The two check digits of a CPF (9 digits) or CNPJ (12 digits), by the modulo-11 rule.
fn check_digits(base: &str, weights: &[u32]) -> String {
    let mut all: Vec<u32> = base.bytes().map(|b| u32::from(b - b'0')).collect();
    for _ in 0..2 {
        let offset = weights.len() + 1 - all.len();
        let sum: u32 = all.iter().zip(&weights[offset - 1..]).map(|(d, w)| d * w).sum();
        let rest = sum % 11;
        all.push(if rest < 2 { 0 } else { 11 - rest });
    }
    all[all.len() - 2..].iter().map(|d| char::from(b'0' + *d as u8)).collect()
}

pub fn cpf(v: u64) -> String {
    let base = digits(v, 9);
    let check = check_digits(&base, &[11, 10, 9, 8, 7, 6, 5, 4, 3, 2]);
    format!("{base}{check}")
}

pub fn cnpj(v: u64) -> String {
    let base = format!("{}0001", digits(v, 8));
    let check = check_digits(&base, &[6, 5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2]);
    format!("{base}{check}")
}

fn key_of(kind: &str, i: u64, v: u64) -> String {
    match kind {
        "CPF" => cpf(v),
        "CNPJ" => cnpj(v),
        "PHONE" => format!("+55{}9{}", 11 + v % 89, digits(v >> 8, 8)),
        "EMAIL" => format!("cliente{i}.{:04x}@exemplo.com.br", v & 0xffff),
        _ => {
            let w = mix(v);
            format!(
                "{:08x}-{:04x}-4{:03x}-{:x}{:03x}-{:012x}",
                v >> 32,
                (v >> 16) & 0xffff,
                v & 0xfff,
                8 + (w & 3),
                (w >> 4) & 0xfff,
                (w >> 16) & 0xffff_ffff_ffff
            )
        }
    }
}

impl Directory {
    /// `per_type` keys of each type from `seed`, held by `participant`'s accounts.
    pub fn new(seed: u64, per_type: usize, participant: &str) -> Directory {
        let mut entries = HashMap::with_capacity(per_type * KEY_TYPES.len());
        let mut by_type: HashMap<&'static str, Vec<String>> = HashMap::new();
        for (t, kind) in KEY_TYPES.iter().enumerate() {
            let keys = by_type.entry(kind).or_default();
            let (mut i, mut draw) = (0u64, 0u64);
            while keys.len() < per_type {
                draw += 1;
                let v = mix(seed ^ mix(((t as u64) << 32) | draw));
                let key = key_of(kind, i, v);
                if entries.contains_key(&key) {
                    continue; // 10^8 CNPJ roots: a repeat is likely among thousands, and each key is distinct.
                }
                let legal = *kind == "CNPJ";
                let entry = Entry {
                    key: key.clone(),
                    key_type: kind,
                    participant: participant.to_owned(),
                    branch: digits(v >> 3, 4),
                    account_number: digits(v >> 7, 10),
                    account_type: if legal { "CACC" } else { ["CACC", "SVGS", "TRAN"][(v % 3) as usize] },
                    owner_type: if legal { "LEGAL_PERSON" } else { "NATURAL_PERSON" },
                    tax_id: if *kind == "CPF" || legal { key.clone() } else { cpf(v >> 5) },
                    name: if legal { format!("Empresa {i} Ltda") } else { format!("Cliente {i}") },
                    trade_name: legal.then(|| format!("Loja {i}")),
                    open_claim: i % 50 == 49,
                };
                keys.push(key.clone());
                entries.insert(key, entry);
                i += 1;
            }
        }
        Directory { entries, by_type }
    }

    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Keys of one type, `from` `count` of them (for tests and benches).
    pub fn keys(&self, kind: &str, from: usize, count: usize) -> Vec<String> {
        self.by_type.get(kind).map(|k| k.iter().skip(from).take(count).cloned().collect()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tax_ids_carry_valid_check_digits() {
        // Known valid numbers: 529.982.247-25 and 11.222.333/0001-81.
        assert_eq!(check_digits("529982247", &[11, 10, 9, 8, 7, 6, 5, 4, 3, 2]), "25");
        assert_eq!(check_digits("112223330001", &[6, 5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2]), "81");
    }

    #[test]
    fn the_same_seed_gives_the_same_keys_of_every_type() {
        let (a, b) = (Directory::new(7, 60, "99999010"), Directory::new(7, 60, "99999010"));
        for kind in KEY_TYPES {
            let keys = a.keys(kind, 0, 60);
            assert_eq!(keys.len(), 60, "{kind}");
            assert_eq!(keys, b.keys(kind, 0, 60));
            assert!(keys.iter().all(|k| a.get(k).is_some_and(|e| e.key_type == kind)));
        }
        assert!(a.keys("EVP", 0, 60).iter().all(|k| k.len() == 36 && k.as_bytes()[14] == b'4'));
        assert!(a.keys("PHONE", 0, 60).iter().all(|k| k.starts_with("+55") && k.len() == 14));
        assert!(a.keys("CPF", 0, 1).iter().all(|k| a.get(k).is_some_and(|e| !e.open_claim)));
        assert!(a.get(&a.keys("CPF", 49, 1)[0]).is_some_and(|e| e.open_claim));
    }

    #[test]
    fn every_key_is_distinct_though_cnpj_roots_repeat() {
        let d = Directory::new(1, 10_000, "99999010");
        assert_eq!(d.entries.len(), 50_000);
        assert!(KEY_TYPES.iter().all(|k| d.keys(k, 0, 10_000).len() == 10_000));
    }
}
