//! Just enough DER to read the subject common name (CN) of an X.509
//! certificate: the mTLS client's CN is its ISPB.

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const VERSION_TAG: u8 = 0xA0;
/// 2.5.4.3, id-at-commonName.
const COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];

/// One tag-length-value: (tag, content, what follows).
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (t, content, rest) = tlv(input)?;
    (t == tag).then_some((content, rest))
}

/// The subject CN of a DER certificate, when it has one.
pub fn subject_common_name(cert: &[u8]) -> Option<String> {
    let (certificate, _) = expect(cert, SEQUENCE)?;
    let (tbs, _) = expect(certificate, SEQUENCE)?;
    let mut rest = tbs;
    if rest.first() == Some(&VERSION_TAG) {
        rest = tlv(rest)?.2;
    }
    // serialNumber, signature, issuer, validity, then subject.
    for _ in 0..4 {
        rest = tlv(rest)?.2;
    }
    let (subject, _) = expect(rest, SEQUENCE)?;
    common_name_in(subject)
}

fn common_name_in(mut name: &[u8]) -> Option<String> {
    while !name.is_empty() {
        let (rdn, next) = expect(name, SET)?;
        name = next;
        let mut attrs = rdn;
        while !attrs.is_empty() {
            let (attr, more) = expect(attrs, SEQUENCE)?;
            attrs = more;
            let (oid, value) = expect(attr, OID)?;
            if oid == COMMON_NAME {
                let (_, text, _) = tlv(value)?;
                return String::from_utf8(text.to_vec()).ok();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, DnType, KeyPair};

    use super::*;

    #[test]
    fn reads_the_subject_not_the_issuer() {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(DnType::OrganizationName, "cabine");
        ca.distinguished_name.push(DnType::CommonName, "cabine sim CA");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
        leaf.distinguished_name.push(DnType::CommonName, "99999010");
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        assert_eq!(subject_common_name(cert.der()).as_deref(), Some("99999010"));
    }

    #[test]
    fn garbage_has_no_common_name() {
        assert_eq!(subject_common_name(&[]), None);
        assert_eq!(subject_common_name(&[0x30, 0x82, 0xff]), None);
        assert_eq!(subject_common_name(&[0x30, 0x03, 0x30, 0x01, 0x02]), None);
    }
}
