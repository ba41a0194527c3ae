//! Helpers shared by the simulator tests: an in-process simulator on port 0,
//! plain reqwest requests with a bare Host, multipart responses read with
//! multer, raw HTTP/1.1 over TCP when headers must be exact.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use cabine::sim::{RunningSim, SimConfig, Simulator};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const ISPB: &str = "99999010";
pub const OTHER: &str = "99999020";

pub struct TestSim {
    pub sim: RunningSim,
    pub http: reqwest::Client,
    pub primary: String,
    pub secondary: String,
    pub control: String,
}

/// A simulator for ISPB (seed 1, hold 200 ms) after `tweak`.
pub async fn start(tweak: impl FnOnce(&mut SimConfig)) -> TestSim {
    cabine::install_crypto_provider();
    let mut cfg = SimConfig::new(vec![ISPB.parse().unwrap()]);
    cfg.hold = Duration::from_millis(200);
    cfg.seed = Some(1);
    tweak(&mut cfg);
    let sim = Simulator::start(cfg).await.expect("simulator starts");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(15)).build().unwrap();
    TestSim {
        primary: format!("http://{}", sim.primary),
        secondary: format!("http://{}", sim.secondary),
        control: format!("http://{}", sim.control),
        sim,
        http,
    }
}

pub fn start_path(ispb: &str) -> String {
    format!("/api/v1/out/{ispb}/stream/start")
}

pub fn send_path(ispb: &str) -> String {
    format!("/api/v1/in/{ispb}/msgs")
}

impl TestSim {
    /// A request to the primary listener with `Host: icom` (no port).
    pub fn icom(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.primary)).header("host", "icom")
    }

    /// `GET …/stream/start` accepting multipart.
    pub fn open(&self) -> reqwest::RequestBuilder {
        self.icom(reqwest::Method::GET, &start_path(ISPB)).header("accept", "multipart/mixed")
    }

    /// `GET` on a pull-next accepting multipart.
    pub fn next(&self, pull_next: &str) -> reqwest::RequestBuilder {
        self.icom(reqwest::Method::GET, pull_next).header("accept", "multipart/mixed")
    }

    /// `POST …/msgs` with one XML message.
    pub fn send_xml(&self, xml: impl Into<String>) -> reqwest::RequestBuilder {
        self.icom(reqwest::Method::POST, &send_path(ISPB))
            .header("content-type", "application/xml; charset=utf-8")
            .body(xml.into())
    }

    pub async fn inject(&self, count: usize, kind: &str) -> Vec<String> {
        self.inject_json(json!({ "count": count, "kind": kind })).await
    }

    pub async fn inject_json(&self, body: Value) -> Vec<String> {
        let r = self.http.post(format!("{}/sim/inject", self.control)).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "inject {body}");
        let v: Value = r.json().await.unwrap();
        v["ids"].as_array().unwrap().iter().map(|i| i.as_str().unwrap().to_owned()).collect()
    }

    pub async fn faults(&self, patch: Value) -> Value {
        let r = self.http.post(format!("{}/sim/faults", self.control)).json(&patch).send().await.unwrap();
        assert_eq!(r.status(), 200, "faults {patch}");
        r.json().await.unwrap()
    }

    pub async fn control_get(&self, path: &str) -> Value {
        let r = self.http.get(format!("{}{path}", self.control)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        r.json().await.unwrap()
    }

    /// The audit of (ispb, channel).
    pub async fn audit_of(&self, ispb: &str, channel: &str) -> Value {
        let all = self.control_get("/sim/audit").await;
        all["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["ispb"] == ispb && l["channel"] == channel)
            .cloned()
            .expect("lane in the audit")
    }

    pub async fn audit(&self) -> Value {
        self.audit_of(ISPB, "cpm").await
    }
}

/// A stream response, read apart.
#[derive(Debug)]
pub struct Read {
    pub status: u16,
    pub pull_next: Option<String>,
    pub headers: reqwest::header::HeaderMap,
    /// (PI-ResourceId, body) of each message.
    pub messages: Vec<(String, String)>,
}

impl Read {
    pub fn ids(&self) -> Vec<String> {
        self.messages.iter().map(|(id, _)| id.clone()).collect()
    }

    pub fn pull_next(&self) -> &str {
        self.pull_next.as_deref().expect("PI-Pull-Next")
    }
}

/// Sends and reads a stream response: multipart parts with multer, gzip with flate2.
pub async fn read(req: reqwest::RequestBuilder) -> Read {
    let resp = req.send().await.expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let pull_next = headers.get("pi-pull-next").map(|v| v.to_str().unwrap().to_owned());
    let raw = resp.bytes().await.unwrap();
    let body = if headers.get("content-encoding").is_some_and(|v| v == "gzip") { gunzip(&raw) } else { raw };
    let content_type = headers.get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let messages = if status != 200 {
        Vec::new()
    } else if content_type.starts_with("multipart/mixed") {
        parts(body, &content_type).await
    } else {
        let id = headers.get("pi-resourceid").expect("PI-ResourceId on a single message").to_str().unwrap();
        vec![(id.to_owned(), String::from_utf8(body.to_vec()).unwrap())]
    };
    Read { status, pull_next, headers, messages }
}

/// The parts of a multipart/mixed body, each checked for its own headers.
pub async fn parts(body: Bytes, content_type: &str) -> Vec<(String, String)> {
    // multer::parse_boundary insists on form-data: take the parameter by hand.
    let boundary = content_type.split("boundary=").nth(1).expect("boundary").trim_matches('"').to_owned();
    let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
    let mut mp = multer::Multipart::new(stream, boundary);
    let mut out = Vec::new();
    while let Some(field) = mp.next_field().await.expect("well-formed multipart") {
        assert_eq!(field.headers().get("content-type").unwrap(), "application/xml; charset=utf-8");
        let id = field.headers().get("pi-resourceid").expect("PI-ResourceId per part").to_str().unwrap().to_owned();
        out.push((id, field.text().await.unwrap()));
    }
    out
}

pub fn gunzip(data: &[u8]) -> Bytes {
    use std::io::Read as _;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data).read_to_end(&mut out).expect("gzip");
    Bytes::from(out)
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

/// A raw HTTP/1.1 exchange (the request should say `Connection: close`): (status, head, body).
pub async fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String, Vec<u8>) {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut buf)).await.expect("response in time").unwrap();
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status");
    (status, head, buf[split + 4..].to_vec())
}

/// A pacs.008 a participant would send: `msg_id` and one EndToEndId per entry of `e2e`.
pub fn pacs008(msg_id: &str, e2e: &[&str]) -> String {
    let txs: String = e2e
        .iter()
        .map(|id| format!("<CdtTrfTxInf><PmtId><EndToEndId>{id}</EndToEndId></PmtId><IntrBkSttlmAmt Ccy=\"BRL\">10.00</IntrBkSttlmAmt></CdtTrfTxInf>"))
        .collect();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Envelope xmlns=\"https://www.bcb.gov.br/pi/pacs.008/1.16\"><AppHdr><Fr><FIId><FinInstnId><Othr><Id>{ISPB}</Id></Othr></FinInstnId></FIId></Fr><To><FIId><FinInstnId><Othr><Id>00038166</Id></Othr></FinInstnId></FIId></To><BizMsgIdr>{msg_id}</BizMsgIdr><MsgDefIdr>pacs.008.spi.1.16</MsgDefIdr><CreDt>2024-03-01T12:00:00.000Z</CreDt><Sgntr/></AppHdr><Document><FIToFICstmrCdtTrf><GrpHdr><MsgId>{msg_id}</MsgId><CreDtTm>2024-03-01T12:00:00.000Z</CreDtTm><NbOfTxs>{}</NbOfTxs></GrpHdr>{txs}</FIToFICstmrCdtTrf></Document></Envelope>",
        e2e.len()
    )
}

/// A unique MsgId: `M` + ISPB + 23 characters.
pub fn msg_id(n: u64) -> String {
    format!("M{ISPB}{:023}", n + std::process::id() as u64 * 1_000_000)
}

/// A multipart/mixed body with one part per message.
pub fn multipart(boundary: &str, messages: &[String]) -> String {
    let mut body = String::new();
    for m in messages {
        body.push_str(&format!("--{boundary}\r\nContent-Type: application/xml; charset=utf-8\r\n\r\n{m}\r\n"));
    }
    body.push_str(&format!("--{boundary}--\r\n"));
    body
}
