//! A scripted raw HTTP/1.1 server that records the exact bytes of every
//! request head, so tests see what the client really puts on the wire (no HTTP
//! library between the socket and the assertion).

use std::collections::{BTreeMap, VecDeque};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Captured {
    pub request_line: String,
    /// Header lines in wire order, names as sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Captured {
    /// Headers by lowercase name; panics on a repeated header.
    pub fn header_map(&self) -> BTreeMap<String, String> {
        let mut map = BTreeMap::new();
        for (name, value) in &self.headers {
            let previous = map.insert(name.to_ascii_lowercase(), value.clone());
            assert!(previous.is_none(), "header {name} sent twice");
        }
        map
    }
}

/// What the script answers to one request.
pub enum Step {
    /// Raw response bytes.
    Reply(Vec<u8>),
    /// Read the request, then never answer (until the client gives up).
    Hang,
}

/// A response with a Content-Length.
pub fn response(status: &str, headers: &[(&str, &str)], body: &[u8]) -> Step {
    let mut out = format!("HTTP/1.1 {status}\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    Step::Reply(bytes)
}

/// Serves `script` over as many connections as the client opens; returns the
/// captured requests and how many TCP connections were accepted.
pub async fn serve(listener: TcpListener, script: Vec<Step>) -> (Vec<Captured>, usize) {
    let mut script: VecDeque<Step> = script.into();
    let mut captured = Vec::new();
    let mut connections = 0;
    while !script.is_empty() {
        let Ok((stream, _)) = listener.accept().await else { break };
        connections += 1;
        serve_connection(stream, &mut script, &mut captured).await;
    }
    (captured, connections)
}

/// Answers requests on one connection until the script or the connection ends.
pub async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    script: &mut VecDeque<Step>,
    captured: &mut Vec<Captured>,
) {
    let mut stream = BufReader::new(stream);
    while let Some(step) = script.pop_front() {
        let Ok(Some(request)) = read_request(&mut stream).await else { return };
        captured.push(request);
        match step {
            Step::Reply(bytes) => {
                if stream.get_mut().write_all(&bytes).await.is_err() || stream.get_mut().flush().await.is_err() {
                    return;
                }
            }
            Step::Hang => {
                let mut sink = Vec::new();
                let _ = stream.read_to_end(&mut sink).await;
                return;
            }
        }
    }
}

/// Reads one request head and its Content-Length body; `None` at a clean EOF.
pub async fn read_request<S: AsyncRead + Unpin>(stream: &mut BufReader<S>) -> std::io::Result<Option<Captured>> {
    let mut line = String::new();
    if stream.read_line(&mut line).await? == 0 {
        return Ok(None);
    }
    let request_line = line.trim_end().to_owned();
    let mut headers = Vec::new();
    loop {
        line.clear();
        stream.read_line(&mut line).await?;
        let l = line.trim_end_matches(['\r', '\n']);
        if l.is_empty() {
            break;
        }
        let (name, value) = l.split_once(':').expect("a header line");
        headers.push((name.to_owned(), value.trim().to_owned()));
    }
    let length = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map_or(0, |(_, v)| v.parse::<usize>().expect("a numeric content-length"));
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await?;
    Ok(Some(Captured { request_line, headers, body }))
}
