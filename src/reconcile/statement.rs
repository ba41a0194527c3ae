//! Reads the Central Bank's statement (`camt.053`, one or more pages) as it
//! arrives in the inbox, and the amounts of our own pacs.008: the few fields
//! a reconciliation needs, through the bounded [`xml_fields`] reader.
//!
//! A page names the request it answers (`GrpHdr/OrgnlBizQry/MsgId`), its
//! number and whether it is the last (`GrpHdr/MsgPgntn`); each `Ntry` gives
//! an amount, `CRDT`/`DBIT`, the booking time and the transaction's
//! `Refs/MsgId` and `Refs/EndToEndId`.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use crate::outbound::xml_fields::{self, XmlError};

/// Most entries one page may carry (a bound on hostile input).
const MAX_PAGE_ENTRIES: usize = 10_000;
/// Most transactions one pacs.008 carries.
const MAX_TRANSACTIONS: usize = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Credit,
    Debit,
}

impl Direction {
    pub fn label(self) -> &'static str {
        match self {
            Direction::Credit => "credit",
            Direction::Debit => "debit",
        }
    }
}

/// One movement the Central Bank booked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatementEntry {
    pub end_to_end_id: String,
    pub msg_id: Option<String>,
    pub direction: Direction,
    /// As written.
    pub amount: String,
    pub amount_cents: Option<u64>,
    pub settled_at: SystemTime,
}

/// One page of a statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub request_msg_id: String,
    pub number: u32,
    pub last: bool,
    pub entries: Vec<StatementEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatementError {
    #[error(transparent)]
    Xml(#[from] XmlError),
    #[error("statement page without {0}")]
    Missing(&'static str),
    #[error("statement entry {index}: {reason}")]
    Entry { index: usize, reason: String },
}

const PAGE_FIELDS: [&str; 8] = [
    "OrgnlBizQry/MsgId",
    "MsgPgntn/PgNb",
    "MsgPgntn/LastPgInd",
    "Ntry/Amt",
    "Ntry/CdtDbtInd",
    "BookgDt/DtTm",
    "Refs/MsgId",
    "Refs/EndToEndId",
];

/// An entry being read: amount, direction, booking time, MsgId, EndToEndId.
#[derive(Default)]
struct Partial([Option<String>; 5]);

impl Partial {
    fn finish(self, index: usize) -> Result<StatementEntry, StatementError> {
        let bad = |reason: &str| StatementError::Entry { index, reason: reason.to_owned() };
        let [amount, direction, booked, msg_id, e2e] = self.0;
        let amount = amount.ok_or_else(|| bad("no Amt"))?;
        let direction = match direction.as_deref() {
            Some("CRDT") => Direction::Credit,
            Some("DBIT") => Direction::Debit,
            other => return Err(bad(&format!("CdtDbtInd {other:?}"))),
        };
        let booked = booked.ok_or_else(|| bad("no BookgDt/DtTm"))?;
        let settled_at = humantime::parse_rfc3339(&booked).map_err(|e| bad(&format!("BookgDt {booked}: {e}")))?;
        Ok(StatementEntry {
            end_to_end_id: e2e.ok_or_else(|| bad("no EndToEndId"))?,
            msg_id,
            direction,
            amount_cents: cents_of(&amount),
            amount,
            settled_at,
        })
    }
}

/// Reads one statement page.
pub fn read_page(raw: &[u8]) -> Result<Page, StatementError> {
    let values = xml_fields::collect(raw, &PAGE_FIELDS, MAX_PAGE_ENTRIES * 5 + 3)?;
    let (mut request, mut number, mut last) = (None, None, None);
    let mut entries = Vec::new();
    let mut current: Option<Partial> = None;
    for (field, text) in values {
        match field {
            0 => request = Some(text),
            1 => number = text.trim().parse::<u32>().ok(),
            2 => last = Some(text.trim() == "true"),
            3 => {
                if let Some(done) = current.replace(Partial::default()) {
                    entries.push(done.finish(entries.len())?);
                }
                if let Some(p) = current.as_mut() {
                    p.0[0] = Some(text);
                }
            }
            i => {
                let p =
                    current.as_mut().ok_or(StatementError::Entry { index: entries.len(), reason: "no Amt".into() })?;
                p.0[i - 3] = Some(text);
            }
        }
    }
    if let Some(done) = current {
        entries.push(done.finish(entries.len())?);
    }
    Ok(Page {
        request_msg_id: request.ok_or(StatementError::Missing("GrpHdr/OrgnlBizQry/MsgId"))?,
        number: number.ok_or(StatementError::Missing("GrpHdr/MsgPgntn/PgNb"))?,
        last: last.ok_or(StatementError::Missing("GrpHdr/MsgPgntn/LastPgInd"))?,
        entries,
    })
}

/// The pages of one statement as they arrive; whole once the last page and every one before it are in.
#[derive(Default)]
pub struct Pages {
    pages: BTreeMap<u32, Vec<StatementEntry>>,
    last: Option<u32>,
}

impl Pages {
    pub fn add(&mut self, page: Page) {
        if page.last {
            self.last = Some(page.number);
        }
        self.pages.insert(page.number, page.entries);
    }

    pub fn is_whole(&self) -> bool {
        self.last.is_some_and(|last| (1..=last).all(|n| self.pages.contains_key(&n)))
    }

    pub fn entries(self) -> Vec<StatementEntry> {
        self.pages.into_values().flatten().collect()
    }
}

/// `123.45` → 12345; `None` when it is not a plain amount.
pub fn cents_of(amount: &str) -> Option<u64> {
    let (units, frac) = amount.trim().split_once('.').unwrap_or((amount.trim(), ""));
    if frac.len() > 2 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac = format!("{frac:0<2}");
    units.parse::<u64>().ok()?.checked_mul(100)?.checked_add(frac.parse().ok()?)
}

/// What a pacs.008 says of one transaction: its amount, and when the payer's PSP accepted it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transaction {
    pub amount_cents: Option<u64>,
    pub accepted_at: Option<SystemTime>,
}

/// The transactions of a pacs.008, by EndToEndId (`PmtId/EndToEndId`, then
/// `IntrBkSttlmAmt` and `AccptncDtTm` of the same `CdtTrfTxInf`).
pub fn transactions(raw: &[u8]) -> Result<HashMap<String, Transaction>, XmlError> {
    let wanted = ["PmtId/EndToEndId", "CdtTrfTxInf/IntrBkSttlmAmt", "CdtTrfTxInf/AccptncDtTm"];
    let values = xml_fields::collect(raw, &wanted, MAX_TRANSACTIONS * 3)?;
    let mut out: HashMap<String, Transaction> = HashMap::new();
    let mut e2e: Option<String> = None;
    for (field, text) in values {
        match field {
            0 => {
                out.entry(text.clone()).or_default();
                e2e = Some(text);
            }
            _ => {
                let Some(tx) = e2e.as_ref().and_then(|id| out.get_mut(id)) else { continue };
                if field == 1 {
                    tx.amount_cents = cents_of(&text);
                } else {
                    tx.accepted_at = humantime::parse_rfc3339_weak(text.trim()).ok();
                }
            }
        }
    }
    Ok(out)
}

/// The amount of each transaction of a pacs.008, by EndToEndId.
pub fn amounts(raw: &[u8]) -> Result<HashMap<String, u64>, XmlError> {
    Ok(transactions(raw)?.into_iter().filter_map(|(id, tx)| tx.amount_cents.map(|c| (id, c))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "<Envelope><AppHdr/><Document><BkToCstmrStmt><GrpHdr><MsgId>P</MsgId>\
<MsgPgntn><PgNb>2</PgNb><LastPgInd>true</LastPgInd></MsgPgntn><OrgnlBizQry><MsgId>MREQ</MsgId></OrgnlBizQry></GrpHdr>\
<Stmt><Ntry><Amt Ccy=\"BRL\">10.50</Amt><CdtDbtInd>CRDT</CdtDbtInd><BookgDt><DtTm>2026-12-04T10:00:00.000Z</DtTm></BookgDt>\
<NtryDtls><TxDtls><Refs><MsgId>M1</MsgId><EndToEndId>E1</EndToEndId></Refs></TxDtls></NtryDtls></Ntry>\
<Ntry><Amt Ccy=\"BRL\">3</Amt><CdtDbtInd>DBIT</CdtDbtInd><BookgDt><DtTm>2026-12-04T10:00:01.000Z</DtTm></BookgDt>\
<NtryDtls><TxDtls><Refs><EndToEndId>E2</EndToEndId></Refs></TxDtls></NtryDtls></Ntry></Stmt></BkToCstmrStmt></Document></Envelope>";

    #[test]
    fn a_page_is_read_with_its_entries() {
        let page = read_page(PAGE.as_bytes()).unwrap();
        assert_eq!((page.request_msg_id.as_str(), page.number, page.last), ("MREQ", 2, true));
        assert_eq!(page.entries.len(), 2);
        assert_eq!(page.entries[0].amount_cents, Some(1050));
        assert_eq!(page.entries[0].msg_id.as_deref(), Some("M1"));
        assert_eq!((page.entries[1].direction, page.entries[1].amount_cents), (Direction::Debit, Some(300)));
        let mut pages = Pages::default();
        pages.add(page);
        assert!(!pages.is_whole(), "page 1 is missing");
    }

    #[test]
    fn broken_pages_say_why() {
        let no_e2e = PAGE.replace("<EndToEndId>E2</EndToEndId>", "");
        assert!(matches!(read_page(no_e2e.as_bytes()), Err(StatementError::Entry { index: 1, .. })));
        let no_request = PAGE.replace("<MsgId>MREQ</MsgId>", "");
        assert_eq!(read_page(no_request.as_bytes()), Err(StatementError::Missing("GrpHdr/OrgnlBizQry/MsgId")));
        assert!(matches!(read_page(b"<a><b></a>"), Err(StatementError::Xml(_))));
    }

    #[test]
    fn each_transaction_of_a_ten_transaction_message_is_read() {
        let xml = include_str!("../../tests/data/spi/pacs.008_END_10_msg.xml");
        let txs = transactions(xml.as_bytes()).unwrap();
        assert_eq!(txs.len(), 10);
        assert!(txs.values().all(|t| t.amount_cents.is_some() && t.accepted_at.is_some()), "{txs:?}");
    }

    #[test]
    fn amounts_of_a_credit_transfer() {
        let xml = include_str!("../sim/templates/pacs.008_END_1_msg.xml");
        let amounts = amounts(xml.as_bytes()).unwrap();
        assert_eq!(amounts.get("E9999901012341234123412345678900"), Some(&100_000));
        let tx = transactions(xml.as_bytes()).unwrap()["E9999901012341234123412345678900"];
        assert_eq!(tx.accepted_at, humantime::parse_rfc3339("2020-01-01T08:30:00.000Z").ok());
        assert_eq!(cents_of("1.2.3"), None);
        assert_eq!(cents_of("7.5"), Some(750));
    }
}
