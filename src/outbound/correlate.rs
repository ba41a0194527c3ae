//! The SPI's verdicts on what we sent, read from an inbound pacs.002 or
//! admi.002, as (reference, verdict) pairs for [`OutboundStore::confirm`]:
//! - pacs.002 `OrgnlGrpInfAndSts/OrgnlMsgId` + `GrpSts`, and each
//!   `TxInfAndSts/OrgnlEndToEndId` + `TxSts` (ACSP/ACSC/ACCC/ACCP/ACTC →
//!   confirmed; RJCT → rejected with its reason code; others → no verdict);
//! - admi.002 `RltdRef/Ref` → rejected (the message was refused after storing),
//!   except a duplicate MsgId (`AM05`): that is the SPI refusing our resend of
//!   a message it already holds (a 5xx or a crash after its 201 makes us resend
//!   the same MsgId), and the first copy's own pacs.002 decides — no verdict.
//!   The reference is the refused message's MsgId or the ResourceId its POST
//!   was given (SPI implementations differ): [`ConfirmRef::Related`] matches both.
//!
//! [`OutboundStore::confirm`]: cabine_actors::ports::outbound::OutboundStore::confirm

use cabine_actors::ports::outbound::{ConfirmRef, SpiVerdict};

use super::xml_fields::{self, XmlError};

const WANTED: [&str; 9] = [
    "AppHdr/MsgDefIdr",
    "OrgnlGrpInfAndSts/OrgnlMsgId",
    "OrgnlGrpInfAndSts/GrpSts",
    "TxInfAndSts/OrgnlEndToEndId",
    "TxInfAndSts/TxSts",
    "StsRsnInf/Rsn/Cd",
    "RltdRef/Ref",
    "Rsn/RjctgPtyRsn",
    "Rsn/RsnDesc",
];

/// The SPI's reason code for a MsgId it already holds.
const DUPLICATE_MSG_ID: &str = "AM05";

/// Verdicts carried by `raw`; empty when it is neither a pacs.002 nor an admi.002.
pub fn verdicts(raw: &[u8]) -> Result<Vec<(ConfirmRef, SpiVerdict)>, XmlError> {
    let fields = xml_fields::collect(raw, &WANTED, 200)?;
    let kind = fields.iter().find(|(i, _)| *i == 0).map(|(_, t)| t.as_str()).unwrap_or("");
    Ok(if kind.starts_with("pacs.002") {
        pacs002(&fields)
    } else if kind.starts_with("admi.002") {
        admi002(&fields)
    } else {
        Vec::new()
    })
}

fn pacs002(fields: &[(usize, String)]) -> Vec<(ConfirmRef, SpiVerdict)> {
    // (reference, status, reason code) in document order.
    let mut found: Vec<(ConfirmRef, Option<String>, Option<String>)> = Vec::new();
    for (i, text) in fields {
        match i {
            1 => found.push((ConfirmRef::MsgId(text.clone()), None, None)),
            3 => found.push((ConfirmRef::EndToEndId(text.clone()), None, None)),
            2 | 4 => set_last(&mut found, |f| f.1 = Some(text.clone())),
            5 => set_last(&mut found, |f| f.2 = Some(text.clone())),
            _ => {}
        }
    }
    found.into_iter().filter_map(|(r, status, code)| Some((r, verdict(status.as_deref()?, code)?))).collect()
}

fn set_last<T>(found: &mut [T], f: impl FnOnce(&mut T)) {
    if let Some(last) = found.last_mut() {
        f(last);
    }
}

fn verdict(status: &str, code: Option<String>) -> Option<SpiVerdict> {
    match status {
        "ACSP" | "ACSC" | "ACCC" | "ACCP" | "ACTC" => Some(SpiVerdict::Confirmed),
        "RJCT" => Some(SpiVerdict::Rejected { reason: format!("RJCT {}", code.unwrap_or_default()).trim().to_owned() }),
        _ => None,
    }
}

fn admi002(fields: &[(usize, String)]) -> Vec<(ConfirmRef, SpiVerdict)> {
    let text = |want: usize| fields.iter().find(|(i, _)| *i == want).map(|(_, t)| t.clone());
    let Some(reference) = text(6) else { return Vec::new() };
    if text(7).as_deref() == Some(DUPLICATE_MSG_ID) {
        return Vec::new();
    }
    let reason = [text(7), text(8)].into_iter().flatten().collect::<Vec<_>>().join(": ");
    vec![(
        ConfirmRef::Related(reference),
        SpiVerdict::Rejected { reason: format!("admi.002 {reason}").trim().to_owned() },
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/data/spi/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn a_settled_pacs_002_confirms_by_end_to_end_id() {
        let got = verdicts(&example("pacs.002_SPI_1_msg.xml")).unwrap();
        assert_eq!(
            got,
            vec![(ConfirmRef::EndToEndId("E9999901012341234123412345678900".into()), SpiVerdict::Confirmed)]
        );
    }

    #[test]
    fn a_rejecting_pacs_002_carries_its_reason_code() {
        let got = verdicts(&example("pacs.002_ERRO_1_msg.xml")).unwrap();
        let reason = "RJCT AB03".to_owned();
        assert_eq!(
            got,
            vec![(ConfirmRef::EndToEndId("E9999901012341234123412345678900".into()), SpiVerdict::Rejected { reason })]
        );
    }

    #[test]
    fn an_admi_002_rejects_the_referenced_message() {
        let doc = br#"<Envelope><AppHdr><MsgDefIdr>admi.002.spi.1.3</MsgDefIdr></AppHdr><Document><admi.002.001.01>
            <RltdRef><Ref>M9999901000000000000000000000001</Ref></RltdRef>
            <Rsn><RjctgPtyRsn>SCHEMA</RjctgPtyRsn><RsnDesc>bad amount</RsnDesc></Rsn></admi.002.001.01></Document></Envelope>"#;
        let got = verdicts(doc).unwrap();
        let reason = "admi.002 SCHEMA: bad amount".to_owned();
        assert_eq!(
            got,
            vec![(ConfirmRef::Related("M9999901000000000000000000000001".into()), SpiVerdict::Rejected { reason })]
        );
    }

    #[test]
    fn a_duplicate_refusal_of_a_resend_is_no_verdict() {
        let doc = br#"<Envelope><AppHdr><MsgDefIdr>admi.002.spi.1.3</MsgDefIdr></AppHdr><Document><admi.002.001.01>
            <RltdRef><Ref>M9999901000000000000000000000001</Ref></RltdRef>
            <Rsn><RjctgPtyRsn>AM05</RjctgPtyRsn><RsnDesc>Mensagem duplicada</RsnDesc></Rsn></admi.002.001.01></Document></Envelope>"#;
        assert!(verdicts(doc).unwrap().is_empty());
    }

    #[test]
    fn a_group_status_confirms_by_original_msg_id_and_other_types_say_nothing() {
        let doc = br#"<Envelope><AppHdr><MsgDefIdr>pacs.002.spi.1.17</MsgDefIdr></AppHdr><Document><FIToFIPmtStsRpt>
            <OrgnlGrpInfAndSts><OrgnlMsgId>M1</OrgnlMsgId><GrpSts>ACSC</GrpSts></OrgnlGrpInfAndSts>
            <TxInfAndSts><OrgnlEndToEndId>E1</OrgnlEndToEndId><TxSts>PDNG</TxSts></TxInfAndSts>
            </FIToFIPmtStsRpt></Document></Envelope>"#;
        assert_eq!(verdicts(doc).unwrap(), vec![(ConfirmRef::MsgId("M1".into()), SpiVerdict::Confirmed)]);
        assert!(verdicts(&example("pacs.008_END_1_msg.xml")).unwrap().is_empty());
    }
}
