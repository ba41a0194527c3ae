//! `cabine sim` as a process: the first stdout line is the JSON of the bound
//! addresses, and the simulator serves on them.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::Value;

const EXE: &str = env!("CARGO_BIN_EXE_cabine");

#[tokio::test]
async fn cabine_sim_prints_its_addresses_first_and_serves() {
    cabine::install_crypto_provider();
    let mut child = Command::new(EXE)
        .args(["sim", "--ispb", "99999010", "--ispb", "99999020"])
        .args([
            "--primary",
            "127.0.0.1:0",
            "--secondary",
            "127.0.0.1:0",
            "--control",
            "127.0.0.1:0",
            "--dict",
            "127.0.0.1:0",
        ])
        .args(["--seed", "3", "--hold", "0s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn cabine sim");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addrs: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert!(line.starts_with("{\"primary\":\"127.0.0.1:"), "{line}");
    let http = reqwest::Client::new();
    let audit: Value = http
        .get(format!("http://{}/sim/audit", addrs["control"].as_str().unwrap()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(audit["seed"], 3);
    assert_eq!(audit["lanes"].as_array().unwrap().len(), 4, "two ISPBs × two channels");
    for listener in ["primary", "secondary"] {
        let url = format!("http://{}/api/v1/out/99999020/stream/start", addrs[listener].as_str().unwrap());
        let r = http.get(url).header("host", "icom").send().await.unwrap();
        assert_eq!(r.status(), 204, "{listener}");
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}
