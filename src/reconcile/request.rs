//! The reporting request (`camt.060`) the Reconciler sends for a window: an
//! ICOM envelope from us to the SPI asking for the statement (`camt.053`,
//! all entries) of our settlement account over `[from, to)`, the period as
//! `RptgPrd/FrToDt` (dates) and `FrToTm` (times), UTC.

use std::time::SystemTime;

use rand::Rng;

/// The SPI's ISPB: the addressee of every request to the Central Bank.
pub const SPI_ISPB: &str = "00038166";

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// `M` + our ISPB + 23 alphanumerics: the catalog's MsgId format.
pub fn new_msg_id(ispb: &str) -> String {
    let mut rng = rand::rng();
    let mut id = format!("M{ispb}");
    id.extend((0..23).map(|_| ALNUM[rng.random_range(0..ALNUM.len())] as char));
    id
}

/// `(date, time)`: `2026-12-04`, `10:00:00.000Z`.
fn date_and_time(at: SystemTime) -> (String, String) {
    let stamp = humantime::format_rfc3339_millis(at).to_string();
    let (date, time) = stamp.split_once('T').unwrap_or((&stamp, ""));
    (date.to_owned(), time.to_owned())
}

/// The camt.060 from `ispb` asking for its statement over `[from, to)`.
pub fn reporting_request(ispb: &str, msg_id: &str, from: SystemTime, to: SystemTime, now: SystemTime) -> String {
    let now = humantime::format_rfc3339_millis(now);
    let ((from_date, from_time), (to_date, to_time)) = (date_and_time(from), date_and_time(to));
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Envelope xmlns=\"https://www.bcb.gov.br/pi/camt.060/1.2\">\
<AppHdr><Fr><FIId><FinInstnId><Othr><Id>{ispb}</Id></Othr></FinInstnId></FIId></Fr>\
<To><FIId><FinInstnId><Othr><Id>{SPI_ISPB}</Id></Othr></FinInstnId></FIId></To>\
<BizMsgIdr>{msg_id}</BizMsgIdr><MsgDefIdr>camt.060.spi.1.2</MsgDefIdr><CreDt>{now}</CreDt><Sgntr/></AppHdr>\
<Document><AcctRptgReq><GrpHdr><MsgId>{msg_id}</MsgId><CreDtTm>{now}</CreDtTm></GrpHdr>\
<RptgReq><Id>{msg_id}</Id><ReqdMsgNmId>camt.053</ReqdMsgNmId><Acct><Id><Othr><Id>{ispb}</Id></Othr></Id></Acct>\
<AcctOwnr><Agt><FinInstnId><ClrSysMmbId><MmbId>{ispb}</MmbId></ClrSysMmbId></FinInstnId></Agt></AcctOwnr>\
<RptgPrd><FrToDt><FrDt>{from_date}</FrDt><ToDt>{to_date}</ToDt></FrToDt>\
<FrToTm><FrTm>{from_time}</FrTm><ToTm>{to_time}</ToTm></FrToTm><Tp>ALLL</Tp></RptgPrd></RptgReq>\
</AcctRptgReq></Document></Envelope>"
    )
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::icom::envelope;

    #[test]
    fn the_request_reads_as_an_envelope_with_its_period() {
        let from = UNIX_EPOCH + Duration::from_millis(1_764_842_400_000);
        let to = from + Duration::from_secs(600);
        let id = new_msg_id("99999010");
        assert_eq!(id.len(), 32);
        let xml = reporting_request("99999010", &id, from, to, to);
        let env = envelope::read(xml.as_bytes()).unwrap();
        assert_eq!((env.msg_def.as_str(), env.msg_id.as_deref()), ("camt.060.spi.1.2", Some(id.as_str())));
        assert!(xml.contains("<FrDt>2025-12-04</FrDt>") && xml.contains("<FrTm>10:00:00.000Z</FrTm>"));
        assert!(xml.contains("<ToTm>10:10:00.000Z</ToTm>"));
    }
}
