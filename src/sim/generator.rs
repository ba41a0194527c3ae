//! The message generator: pacs.008 / pacs.002 / admi.002 built from the
//! catalog templates with unique identifiers in the Central Bank's formats —
//! BizMsgIdr/MsgId `M` + ISPB + 23 alphanumerics, EndToEndId `E` + ISPB +
//! yyyyMMddHHmm (UTC) + 11 alphanumerics — deterministic for a given seed and
//! clock. A draft keeps only the variable fields; its bytes are rendered when
//! it is delivered (and re-rendered identically on redelivery).
//!
//! Templates: `pacs.008_END_1_msg.xml`, `pacs.008_CONTA_1_msg.xml` and
//! `pacs.002_SPI_1_msg.xml` are verbatim copies of the catalog examples;
//! `pacs.002_reply.xml` is the SPI example with a `StsRsnInf/AddtlInf` that
//! names the original MsgId (the 1.17 schema has no `OrgnlMsgId` element);
//! `admi.002_reject.xml` is ours (the catalog has no admi.002 example).

use std::time::SystemTime;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::problem::escape;
use super::template::{Slot, Template, TemplateError};

/// The SPI's own ISPB: sender of everything the simulator originates.
pub const SPI_ISPB: &str = "00038166";

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
/// Real ISPBs of large payers, for realistic counterparties.
const PAYERS: [&str; 6] = ["00000000", "00360305", "60701190", "60746948", "90400888", "18236120"];

const APP_HDR: [(&str, Slot); 4] = [
    ("AppHdr/Fr/FIId/FinInstnId/Othr/Id", Slot::From),
    ("AppHdr/To/FIId/FinInstnId/Othr/Id", Slot::To),
    ("AppHdr/BizMsgIdr", Slot::BizMsgId),
    ("AppHdr/CreDt", Slot::Created),
];

const CREDIT_TRANSFER: [(&str, Slot); 7] = [
    ("Document/FIToFICstmrCdtTrf/GrpHdr/MsgId", Slot::MsgId),
    ("Document/FIToFICstmrCdtTrf/GrpHdr/CreDtTm", Slot::Created),
    ("Document/FIToFICstmrCdtTrf/CdtTrfTxInf/PmtId/EndToEndId", Slot::EndToEndId),
    ("Document/FIToFICstmrCdtTrf/CdtTrfTxInf/IntrBkSttlmAmt", Slot::Amount),
    ("Document/FIToFICstmrCdtTrf/CdtTrfTxInf/AccptncDtTm", Slot::AcceptedAt),
    ("Document/FIToFICstmrCdtTrf/CdtTrfTxInf/DbtrAgt/FinInstnId/ClrSysMmbId/MmbId", Slot::PayerIspb),
    ("Document/FIToFICstmrCdtTrf/CdtTrfTxInf/CdtrAgt/FinInstnId/ClrSysMmbId/MmbId", Slot::PayeeIspb),
];

const STATUS_REPORT: [(&str, Slot); 7] = [
    ("Document/FIToFIPmtStsRpt/GrpHdr/MsgId", Slot::MsgId),
    ("Document/FIToFIPmtStsRpt/GrpHdr/CreDtTm", Slot::Created),
    ("Document/FIToFIPmtStsRpt/TxInfAndSts/OrgnlInstrId", Slot::EndToEndId),
    ("Document/FIToFIPmtStsRpt/TxInfAndSts/OrgnlEndToEndId", Slot::EndToEndId),
    ("Document/FIToFIPmtStsRpt/TxInfAndSts/TxSts", Slot::Status),
    ("Document/FIToFIPmtStsRpt/TxInfAndSts/FctvIntrBkSttlmDt/DtTm", Slot::SettledAt),
    ("Document/FIToFIPmtStsRpt/TxInfAndSts/OrgnlTxRef/IntrBkSttlmDt", Slot::SettlementDate),
];

const REJECT: [(&str, Slot); 4] = [
    ("Document/admi.002.001.01/RltdRef/Ref", Slot::RelatedRef),
    ("Document/admi.002.001.01/Rsn/RjctgPtyRsn", Slot::Reason),
    ("Document/admi.002.001.01/Rsn/RjctnDtTm", Slot::RejectedAt),
    ("Document/admi.002.001.01/Rsn/RsnDesc", Slot::Description),
];

/// Every template, compiled once per simulator.
#[derive(Debug)]
pub struct Templates {
    credit_by_key: Template,
    credit_by_account: Template,
    status: Template,
    reply: Template,
    reject: Template,
}

impl Templates {
    pub fn compile() -> Result<Self, TemplateError> {
        let with = |rest: &[(&'static str, Slot)]| -> Vec<(&'static str, Slot)> {
            APP_HDR.iter().chain(rest.iter()).copied().collect()
        };
        let mut reply_slots = with(&STATUS_REPORT);
        reply_slots.push(("Document/FIToFIPmtStsRpt/TxInfAndSts/StsRsnInf/AddtlInf", Slot::Note));
        Ok(Templates {
            credit_by_key: Template::compile(
                "pacs.008_END_1",
                include_str!("templates/pacs.008_END_1_msg.xml"),
                &with(&CREDIT_TRANSFER),
            )?,
            credit_by_account: Template::compile(
                "pacs.008_CONTA_1",
                include_str!("templates/pacs.008_CONTA_1_msg.xml"),
                &with(&CREDIT_TRANSFER),
            )?,
            status: Template::compile(
                "pacs.002_SPI_1",
                include_str!("templates/pacs.002_SPI_1_msg.xml"),
                &with(&STATUS_REPORT),
            )?,
            reply: Template::compile("pacs.002_reply", include_str!("templates/pacs.002_reply.xml"), &reply_slots)?,
            reject: Template::compile(
                "admi.002_reject",
                include_str!("templates/admi.002_reject.xml"),
                &with(&REJECT),
            )?,
        })
    }
}

/// A message waiting to be rendered: only what varies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Draft {
    CreditTransfer(CreditTransfer),
    StatusReport(StatusReport),
    Reject(Reject),
    /// Bytes sent as they are (e.g. an unparseable message).
    Raw(Bytes),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreditTransfer {
    pub to: String,
    pub msg_id: String,
    pub created: String,
    pub end_to_end_id: String,
    pub amount: String,
    pub payer: String,
    pub by_account: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusReport {
    pub to: String,
    pub msg_id: String,
    pub created: String,
    pub end_to_end_id: String,
    pub status: &'static str,
    /// Present on replies to a sent pacs.008: `OrgnlMsgId <MsgId>`.
    pub note: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reject {
    pub to: String,
    pub msg_id: String,
    pub created: String,
    /// The rejected message's MsgId / BizMsgIdr, or its ResourceId when unreadable (escaped).
    pub related: String,
    pub reason: &'static str,
    pub description: &'static str,
}

/// Why a sent message is rejected by an admi.002.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// A MsgId already accepted (ISO code AM05, duplication).
    Duplicate,
    /// Unreadable XML or a missing envelope element (ISO code FF01, invalid format).
    Malformed,
}

impl Draft {
    /// `M…` identifier of the message, when it has one.
    pub fn msg_id(&self) -> Option<&str> {
        match self {
            Draft::CreditTransfer(c) => Some(&c.msg_id),
            Draft::StatusReport(s) => Some(&s.msg_id),
            Draft::Reject(r) => Some(&r.msg_id),
            Draft::Raw(_) => None,
        }
    }

    pub fn render(&self, t: &Templates) -> Bytes {
        match self {
            Draft::CreditTransfer(c) => {
                let template = if c.by_account { &t.credit_by_account } else { &t.credit_by_key };
                template.render(|slot| match slot {
                    Slot::From => SPI_ISPB,
                    Slot::To | Slot::PayeeIspb => &c.to,
                    Slot::BizMsgId | Slot::MsgId => &c.msg_id,
                    Slot::EndToEndId => &c.end_to_end_id,
                    Slot::Amount => &c.amount,
                    Slot::PayerIspb => &c.payer,
                    _ => &c.created,
                })
            }
            Draft::StatusReport(s) => {
                let template = if s.note.is_some() { &t.reply } else { &t.status };
                template.render(|slot| match slot {
                    Slot::From => SPI_ISPB,
                    Slot::To => &s.to,
                    Slot::BizMsgId | Slot::MsgId => &s.msg_id,
                    Slot::EndToEndId => &s.end_to_end_id,
                    Slot::Status => s.status,
                    Slot::SettlementDate => &s.created[..10],
                    Slot::Note => s.note.as_deref().unwrap_or(""),
                    _ => &s.created,
                })
            }
            Draft::Reject(r) => t.reject.render(|slot| match slot {
                Slot::From => SPI_ISPB,
                Slot::To => &r.to,
                Slot::BizMsgId => &r.msg_id,
                Slot::RelatedRef => &r.related,
                Slot::Reason => r.reason,
                Slot::Description => r.description,
                _ => &r.created,
            }),
            Draft::Raw(bytes) => bytes.clone(),
        }
    }
}

/// Draws identifiers and contents from a seeded generator.
#[derive(Debug)]
pub struct Generator {
    rng: StdRng,
}

impl Generator {
    pub fn new(seed: u64) -> Self {
        Generator { rng: StdRng::seed_from_u64(seed) }
    }

    /// An inbound credit transfer to `to`, from a random payer.
    pub fn credit_transfer(&mut self, to: &str, now: SystemTime) -> Draft {
        let payer = PAYERS[self.rng.random_range(0..PAYERS.len())];
        let cents: u64 = self.rng.random_range(1..=500_000);
        Draft::CreditTransfer(CreditTransfer {
            to: to.to_owned(),
            msg_id: self.biz_msg_id(),
            created: timestamp(now),
            end_to_end_id: self.end_to_end_id(payer, now),
            amount: format!("{}.{:02}", cents / 100, cents % 100),
            payer: payer.to_owned(),
            by_account: self.rng.random_bool(0.25),
        })
    }

    /// An inbound status report (ACCC) on a payment `to` made earlier.
    pub fn status_report(&mut self, to: &str, now: SystemTime) -> Draft {
        Draft::StatusReport(StatusReport {
            to: to.to_owned(),
            msg_id: self.biz_msg_id(),
            created: timestamp(now),
            end_to_end_id: self.end_to_end_id(to, now),
            status: "ACCC",
            note: None,
        })
    }

    /// An unparseable message: a credit transfer cut short.
    pub fn malformed(&mut self, to: &str, now: SystemTime, templates: &Templates) -> Draft {
        let whole = self.credit_transfer(to, now).render(templates);
        Draft::Raw(whole.slice(..whole.len() * 3 / 5))
    }

    /// The SPI's acceptance (ACSP) of a credit transfer `to` sent, one per EndToEndId.
    pub fn acceptance(&mut self, to: &str, original_msg_id: &str, end_to_end_id: &str, now: SystemTime) -> Draft {
        Draft::StatusReport(StatusReport {
            to: to.to_owned(),
            msg_id: self.biz_msg_id(),
            created: timestamp(now),
            end_to_end_id: escape(end_to_end_id),
            status: "ACSP",
            note: Some(format!("OrgnlMsgId {}", escape(original_msg_id))),
        })
    }

    /// An admi.002 rejecting what `to` sent.
    pub fn reject(&mut self, to: &str, related: &str, reason: RejectReason, now: SystemTime) -> Draft {
        let (code, description) = match reason {
            RejectReason::Duplicate => ("AM05", "Mensagem duplicada: MsgId ja recebido"),
            RejectReason::Malformed => ("FF01", "Mensagem invalida: XML ou envelope ilegivel"),
        };
        Draft::Reject(Reject {
            to: to.to_owned(),
            msg_id: self.biz_msg_id(),
            created: timestamp(now),
            related: escape(related),
            reason: code,
            description,
        })
    }

    /// A fresh identifier for a message the SPI originates (a statement page).
    pub fn message_id(&mut self) -> String {
        self.biz_msg_id()
    }

    /// `M` + the SPI's ISPB + 23 alphanumerics.
    fn biz_msg_id(&mut self) -> String {
        let mut id = String::with_capacity(32);
        id.push('M');
        id.push_str(SPI_ISPB);
        self.push_alnum(&mut id, 23);
        id
    }

    /// `E` + the payer's ISPB + yyyyMMddHHmm (UTC) + 11 alphanumerics.
    fn end_to_end_id(&mut self, payer: &str, now: SystemTime) -> String {
        let ts = timestamp(now);
        let mut id = String::with_capacity(32);
        id.push('E');
        id.push_str(payer);
        for (from, to) in [(0, 4), (5, 7), (8, 10), (11, 13), (14, 16)] {
            id.push_str(&ts[from..to]);
        }
        self.push_alnum(&mut id, 11);
        id
    }

    fn push_alnum(&mut self, out: &mut String, n: usize) {
        for _ in 0..n {
            out.push(ALNUM[self.rng.random_range(0..ALNUM.len())] as char);
        }
    }
}

/// `2020-01-01T08:30:12.000Z` (the catalog's ISONormalisedDateTime).
pub fn timestamp(now: SystemTime) -> String {
    humantime::format_rfc3339_millis(now).to_string()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn noon() -> SystemTime {
        // 2024-03-01T12:34:56.789Z
        UNIX_EPOCH + Duration::from_millis(1_709_296_496_789)
    }

    fn is_alnum(s: &str) -> bool {
        s.bytes().all(|b| b.is_ascii_alphanumeric())
    }

    #[test]
    fn identifiers_have_the_central_bank_formats() {
        let mut g = Generator::new(7);
        let Draft::CreditTransfer(c) = g.credit_transfer("99999010", noon()) else { panic!("a credit transfer") };
        assert_eq!(c.msg_id.len(), 32);
        assert!(c.msg_id.starts_with("M00038166") && is_alnum(&c.msg_id[9..]), "{}", c.msg_id);
        assert_eq!(c.end_to_end_id.len(), 32);
        assert!(c.end_to_end_id.starts_with(&format!("E{}202403011234", c.payer)), "{}", c.end_to_end_id);
        assert!(is_alnum(&c.end_to_end_id[21..]));
        assert_eq!(c.created, "2024-03-01T12:34:56.789Z");
    }

    #[test]
    fn rendered_messages_carry_their_fields_and_stay_well_formed() {
        let t = Templates::compile().unwrap();
        let mut g = Generator::new(1);
        let draft = g.credit_transfer("99999010", noon());
        let Draft::CreditTransfer(c) = &draft else { panic!() };
        let xml = String::from_utf8(draft.render(&t).to_vec()).unwrap();
        assert!(xml.contains(&format!("<BizMsgIdr>{}</BizMsgIdr>", c.msg_id)));
        assert!(xml.contains(&format!("<MsgId>{}</MsgId>", c.msg_id)));
        assert!(xml.contains(&format!("<EndToEndId>{}</EndToEndId>", c.end_to_end_id)));
        assert!(xml.contains("<MsgDefIdr>pacs.008.spi.1.16</MsgDefIdr>"));
        assert!(xml.contains("<Id>99999010</Id>") && xml.contains("<Id>00038166</Id>"));
        let env = super::super::envelope::read(xml.as_bytes()).unwrap();
        assert_eq!(env.msg_id.as_deref(), Some(c.msg_id.as_str()));

        let reply = g.acceptance("99999010", &c.msg_id, &c.end_to_end_id, noon()).render(&t);
        let reply = String::from_utf8(reply.to_vec()).unwrap();
        assert!(reply.contains("<TxSts>ACSP</TxSts>"));
        assert!(reply.contains(&format!("<OrgnlEndToEndId>{}</OrgnlEndToEndId>", c.end_to_end_id)));
        assert!(reply.contains(&format!("<AddtlInf>OrgnlMsgId {}</AddtlInf>", c.msg_id)));
        assert!(reply.contains("<IntrBkSttlmDt>2024-03-01</IntrBkSttlmDt>"));

        let reject = g.reject("99999010", "M<x>", RejectReason::Duplicate, noon()).render(&t);
        let reject = String::from_utf8(reject.to_vec()).unwrap();
        assert!(reject.contains("<Ref>M&lt;x&gt;</Ref>") && reject.contains("<RjctgPtyRsn>AM05</RjctgPtyRsn>"));
        assert_eq!(super::super::envelope::read(reject.as_bytes()).unwrap().msg_def, "admi.002.spi.1.3");

        let bad = g.malformed("99999010", noon(), &t).render(&t);
        assert!(super::super::envelope::read(&bad).is_err());
    }

    #[test]
    fn the_same_seed_and_clock_give_the_same_messages() {
        let t = Templates::compile().unwrap();
        let run = |seed| {
            let mut g = Generator::new(seed);
            (0..20).map(|_| g.credit_transfer("99999010", noon()).render(&t)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }
}
