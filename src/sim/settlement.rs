//! The Central Bank's record of each participant's settlement account, as the
//! simulator keeps it — every credit it delivered (an injected pacs.008) and
//! every debit it settled (a pacs.008 accepted from the participant) — and the
//! reporting service on top of it: a `camt.060` asking for a window is
//! answered on the requester's stream with `camt.053` statement pages
//! (`GrpHdr/MsgPgntn`, `GrpHdr/OrgnlBizQry/MsgId` naming the request).
//!
//! The window of a `camt.060` is `RptgPrd/FrToDt/FrDt`+`FrToTm/FrTm` up to
//! `ToDt`+`ToTm` (UTC, ISO 20022 date and time), half-open: `[from, to)`.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use quick_xml::Reader;
use quick_xml::events::Event;
use serde::{Deserialize, Serialize, Serializer};

use super::clock::unix_millis;
use super::generator::{SPI_ISPB, timestamp};
use super::problem::escape;

/// Entries per `camt.053` page.
pub const PAGE_ENTRIES: usize = 200;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Credit,
    Debit,
}

impl Direction {
    fn code(self) -> &'static str {
        match self {
            Direction::Credit => "CRDT",
            Direction::Debit => "DBIT",
        }
    }
}

fn as_str<S: Serializer>(v: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v)
}

/// One movement of a participant's settlement account.
#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    pub seq: u64,
    /// Whose account.
    #[serde(serialize_with = "as_str")]
    pub ispb: Arc<str>,
    pub end_to_end_id: String,
    pub msg_id: String,
    pub direction: Direction,
    /// As on the wire: `123.45`.
    pub amount: String,
    pub settled_at_ms: u64,
}

/// How an injected credit transfer meets the record: the controls that let a
/// test create every discrepancy a reconciliation must find.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SettlementMode {
    /// Recorded and delivered (what the SPI does).
    #[default]
    Settled,
    /// Recorded, never delivered: the money arrived, the participant never heard of it.
    Undelivered,
    /// Delivered, not recorded: a credit the SPI does not know.
    Unrecorded,
    /// Recorded with another amount (one real more) than the message carries.
    Misstated,
    /// Recorded once, delivered twice under two ResourceIds.
    Twice,
}

impl SettlementMode {
    pub fn records(self) -> bool {
        self != SettlementMode::Unrecorded
    }

    /// How many times the message is queued.
    pub fn deliveries(self) -> usize {
        match self {
            SettlementMode::Undelivered => 0,
            SettlementMode::Twice => 2,
            _ => 1,
        }
    }

    /// The amount the record carries for a message of `amount`.
    pub fn recorded_amount(self, amount: &str) -> String {
        if self != SettlementMode::Misstated {
            return amount.to_owned();
        }
        let cents = cents_of(amount).unwrap_or(0) + 100;
        format!("{}.{:02}", cents / 100, cents % 100)
    }
}

/// `123.45` → 12345.
pub fn cents_of(amount: &str) -> Option<u64> {
    let (units, frac) = amount.trim().split_once('.').unwrap_or((amount.trim(), "0"));
    let frac = format!("{frac:0<2}");
    if frac.len() != 2 {
        return None;
    }
    Some(units.parse::<u64>().ok()? * 100 + frac.parse::<u64>().ok()?)
}

/// The window a `camt.060` asks for, or why it cannot be read.
pub fn requested_window(xml: &[u8]) -> Result<(SystemTime, SystemTime), String> {
    let text = std::str::from_utf8(xml).map_err(|e| format!("not UTF-8: {e}"))?;
    let mut reader = Reader::from_str(text);
    let mut path: Vec<String> = Vec::new();
    let mut fields: [Option<String>; 4] = Default::default();
    loop {
        match reader.read_event().map_err(|e| format!("XML error: {e}"))? {
            Event::Start(s) => path.push(AsRef::<str>::as_ref(&s.local_name()).to_owned()),
            Event::End(_) => {
                path.pop();
            }
            Event::Text(t) => {
                let names: Vec<&str> = path.iter().rev().take(2).map(String::as_str).collect();
                let at = match names.as_slice() {
                    ["FrDt", "FrToDt"] => 0,
                    ["FrTm", "FrToTm"] => 1,
                    ["ToDt", "FrToDt"] => 2,
                    ["ToTm", "FrToTm"] => 3,
                    _ => continue,
                };
                fields[at] = Some(t.xml10_content().trim().to_owned());
            }
            Event::Eof => break,
            _ => {}
        }
    }
    let instant = |date: &Option<String>, time: &Option<String>, name: &str| {
        let (Some(d), Some(t)) = (date, time) else { return Err(format!("RptgPrd lacks its {name}")) };
        humantime::parse_rfc3339(&format!("{d}T{t}")).map_err(|e| format!("RptgPrd {name} {d}T{t}: {e}"))
    };
    let from = instant(&fields[0], &fields[1], "start")?;
    let to = instant(&fields[2], &fields[3], "end")?;
    if to < from {
        return Err("RptgPrd ends before it starts".to_owned());
    }
    Ok((from, to))
}

/// What a statement answers: whose, which request, which window.
pub struct Statement<'a> {
    pub ispb: &'a str,
    pub request_msg_id: &'a str,
    pub from: SystemTime,
    pub to: SystemTime,
    pub now: SystemTime,
}

impl Statement<'_> {
    /// The entries of the window, oldest first.
    pub fn select<'e>(&self, record: impl Iterator<Item = &'e Entry>) -> Vec<Entry> {
        let (from, to) = (unix_millis(self.from), unix_millis(self.to));
        record.filter(|e| &*e.ispb == self.ispb && (from..to).contains(&e.settled_at_ms)).cloned().collect()
    }

    /// The `camt.053` pages (one, empty, when the window saw nothing); `next_id` names each page.
    pub fn pages(&self, entries: &[Entry], mut next_id: impl FnMut() -> String) -> Vec<Bytes> {
        let chunks: Vec<&[Entry]> =
            if entries.is_empty() { vec![&[][..]] } else { entries.chunks(PAGE_ENTRIES).collect() };
        let last = chunks.len();
        chunks.iter().enumerate().map(|(i, chunk)| self.page(&next_id(), i + 1, i + 1 == last, chunk)).collect()
    }

    fn page(&self, msg_id: &str, number: usize, last: bool, entries: &[Entry]) -> Bytes {
        let (now, ispb, request) = (timestamp(self.now), escape(self.ispb), escape(self.request_msg_id));
        let mut xml = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Envelope xmlns=\"https://www.bcb.gov.br/pi/camt.053/1.2\">\
<AppHdr><Fr><FIId><FinInstnId><Othr><Id>{SPI_ISPB}</Id></Othr></FinInstnId></FIId></Fr>\
<To><FIId><FinInstnId><Othr><Id>{ispb}</Id></Othr></FinInstnId></FIId></To>\
<BizMsgIdr>{msg_id}</BizMsgIdr><MsgDefIdr>camt.053.spi.1.2</MsgDefIdr><CreDt>{now}</CreDt><Sgntr/></AppHdr>\
<Document><BkToCstmrStmt><GrpHdr><MsgId>{msg_id}</MsgId><CreDtTm>{now}</CreDtTm>\
<MsgPgntn><PgNb>{number}</PgNb><LastPgInd>{last}</LastPgInd></MsgPgntn>\
<OrgnlBizQry><MsgId>{request}</MsgId><MsgNmId>camt.060</MsgNmId></OrgnlBizQry></GrpHdr>\
<Stmt><Id>{request}-{number}</Id><FrToDt><FrDtTm>{}</FrDtTm><ToDtTm>{}</ToDtTm></FrToDt>\
<Acct><Id><Othr><Id>{ispb}</Id></Othr></Id></Acct>",
            timestamp(self.from),
            timestamp(self.to),
        );
        for e in entries {
            let settled = timestamp(std::time::UNIX_EPOCH + std::time::Duration::from_millis(e.settled_at_ms));
            xml.push_str(&format!(
                "<Ntry><Amt Ccy=\"BRL\">{}</Amt><CdtDbtInd>{}</CdtDbtInd><Sts><Cd>BOOK</Cd></Sts>\
<BookgDt><DtTm>{settled}</DtTm></BookgDt><NtryDtls><TxDtls><Refs><MsgId>{}</MsgId>\
<EndToEndId>{}</EndToEndId></Refs></TxDtls></NtryDtls></Ntry>",
                escape(&e.amount),
                e.direction.code(),
                escape(&e.msg_id),
                escape(&e.end_to_end_id),
            ));
        }
        xml.push_str("</Stmt></BkToCstmrStmt></Document></Envelope>");
        Bytes::from(xml)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, ispb: &str, at: u64) -> Entry {
        Entry {
            seq,
            ispb: Arc::from(ispb),
            end_to_end_id: format!("E{seq}"),
            msg_id: format!("M{seq}"),
            direction: Direction::Credit,
            amount: "1.00".into(),
            settled_at_ms: at,
        }
    }

    #[test]
    fn a_window_is_read_from_the_reporting_period() {
        let xml = b"<Envelope><Document><AcctRptgReq><RptgReq><RptgPrd><FrToDt><FrDt>2026-12-04</FrDt>\
<ToDt>2026-12-04</ToDt></FrToDt><FrToTm><FrTm>10:00:00.000Z</FrTm><ToTm>10:10:00.000Z</ToTm></FrToTm>\
</RptgPrd></RptgReq></AcctRptgReq></Document></Envelope>";
        let (from, to) = requested_window(xml).unwrap();
        assert_eq!(to.duration_since(from).unwrap().as_secs(), 600);
        assert!(requested_window(b"<Envelope/>").unwrap_err().contains("start"));
    }

    #[test]
    fn a_statement_selects_its_window_and_pages() {
        let base = 1_700_000_000_000;
        let record: Vec<Entry> =
            (0..450).map(|i| entry(i, if i % 3 == 0 { "B" } else { "A" }, base + i * 10)).collect();
        let at = |ms| std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
        let st = Statement { ispb: "A", request_msg_id: "MREQ", from: at(base), to: at(base + 4000), now: at(base) };
        let picked = st.select(record.iter());
        assert_eq!(picked.len(), 400 - 134);
        let mut n = 0;
        let pages = st.pages(&picked, || {
            n += 1;
            format!("P{n}")
        });
        assert_eq!(pages.len(), 2);
        let last = String::from_utf8(pages[1].to_vec()).unwrap();
        assert!(last.contains("<PgNb>2</PgNb><LastPgInd>true</LastPgInd>") && last.contains("MREQ"));
        assert_eq!(st.pages(&[], || "P".into()).len(), 1);
    }

    #[test]
    fn amounts_in_cents() {
        assert_eq!(cents_of("123.45"), Some(12345));
        assert_eq!(cents_of("7"), Some(700));
        assert_eq!(cents_of("7.5"), Some(750));
        assert_eq!(SettlementMode::Misstated.recorded_amount("1.99"), "2.99");
    }
}
