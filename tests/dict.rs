//! DICT lookups against the simulated DICT (in-process `cabine sim`, spec
//! 1.8.0) and the real Redis (a key prefix per test): the client's reading of
//! every answer and error, the buckets (the local mirror refuses before the
//! DICT would; a 404 costs more; refill; the Central Bank's state taken),
//! the cache (found and not-found lifetimes, stale copies served only while
//! the DICT is down and only without an open claim), one request for
//! concurrent lookups of a key, and fail-open when Redis is unreachable.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cabine::config::{DEFAULT_TOML, Settings};
use cabine::dict::{DictClient, DictError, DictLookups, Found, LookupError, LookupHeaders, Source};
use cabine::sim::{RunningSim, SimConfig, Simulator};
use serde_json::{Value, json};

const ISPB: &str = "99999010";
const PAYER: &str = "52998224725";
const E2E: &str = "E99999010202612041200abcdefghijk";

struct Rig {
    sim: RunningSim,
    settings: Settings,
    http: reqwest::Client,
}

async fn rig(category: &str, extra: &[(&str, &str)]) -> Rig {
    cabine::install_crypto_provider();
    let mut cfg = SimConfig::new(vec![ISPB.parse().unwrap()]);
    cfg.seed = Some(7);
    cfg.dict_category = category.into();
    let sim = Simulator::start(cfg).await.expect("the simulator starts");
    let prefix = cabine::harness::unique_name("dict");
    let mut env: HashMap<String, String> = [
        ("CABINE__DICT__ENABLED", "true".to_owned()),
        ("CABINE__DICT__BASE_URL", format!("http://{}/api/v1/", sim.dict)),
        ("CABINE__DICT__CATEGORY", category.to_owned()),
        ("CABINE__REDIS__PREFIX", prefix),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let settings = Settings::from_sources(DEFAULT_TOML, None, &env).expect("settings");
    Rig { sim, settings, http: reqwest::Client::new() }
}

impl Rig {
    async fn lookups(&self) -> Arc<DictLookups> {
        let redis = cabine::redis::connect(&self.settings.redis).expect("redis");
        fred::interfaces::ClientLike::wait_for_connect(&redis).await.expect("redis connects");
        cabine::dict::from_settings(&self.settings, redis).expect("the DICT side builds").expect("enabled")
    }

    fn client(&self) -> DictClient {
        DictClient::new(&self.settings.dict, &self.settings.cluster.ispb).expect("client")
    }

    async fn control(&self, path: &str, body: Option<Value>) -> Value {
        let url = format!("http://{}/sim/dict/{path}", self.sim.control);
        let request = match body {
            Some(b) => self.http.post(url).json(&b),
            None => self.http.get(url),
        };
        request.send().await.expect("control API").json().await.expect("control JSON")
    }

    async fn keys(&self, kind: &str, from: usize, count: usize) -> Vec<String> {
        let v = self.control(&format!("keys?type={kind}&from={from}&count={count}"), None).await;
        serde_json::from_value(v).expect("keys")
    }

    async fn audit(&self) -> Value {
        self.control("audit", None).await
    }
}

fn headers() -> LookupHeaders<'static> {
    LookupHeaders { payer_id: PAYER, end_to_end_id: E2E }
}

#[tokio::test]
async fn the_client_reads_every_answer_of_the_dict() {
    let r = rig("F", &[]).await;
    let client = r.client();
    for kind in ["CPF", "CNPJ", "PHONE", "EMAIL", "EVP"] {
        let key = r.keys(kind, 0, 1).await.remove(0);
        let Found::Entry(e) = client.entry(&key, &headers()).await.expect("an answer") else {
            panic!("{key} not found")
        };
        assert_eq!((e.key.as_str(), e.key_type.as_str()), (key.as_str(), kind));
        assert_eq!(e.account.participant, ISPB);
        let owner = if kind == "CNPJ" { "LEGAL_PERSON" } else { "NATURAL_PERSON" };
        assert_eq!(e.owner.kind, owner, "{key}");
        assert_eq!(e.owner.trade_name.is_some(), kind == "CNPJ");
    }
    assert_eq!(client.entry("nobody@exemplo.com.br", &headers()).await.unwrap(), Found::NotFound);
    let bad = LookupHeaders { payer_id: "123", end_to_end_id: E2E };
    assert!(matches!(client.entry("x@y.z", &bad).await, Err(DictError::Malformed(m)) if m.contains("400")));
    let p = client.policies().await.expect("policies");
    assert_eq!(p.category, "F");
    let participant = p.policies.iter().find(|p| p.name == "ENTRIES_READ_PARTICIPANT_ANTISCAN").unwrap();
    assert_eq!((participant.capacity, participant.refill_tokens, participant.refill_period_sec), (1_000, 2, 60));
    assert_eq!(participant.available, 1_000 - 5 - 3, "five answers cost 1, a 404 costs 3");

    r.control("faults", Some(json!({"fail_every": 1}))).await;
    assert!(matches!(client.entry("a@b.c", &headers()).await, Err(DictError::Unavailable(m)) if m.contains("503")));
    r.control("faults", Some(json!({"down": true}))).await;
    assert!(matches!(client.entry("a@b.c", &headers()).await, Err(DictError::Unavailable(_))));
    r.control("faults", Some(json!({"latency_ms": 3000}))).await;
    assert!(matches!(client.entry("a@b.c", &headers()).await, Err(DictError::Unavailable(m)) if m == "timed out"));
    r.control("faults", Some(json!({}))).await;
    r.control("policies", Some(json!({"ispb": ISPB, "participant_tokens": 0}))).await;
    assert!(matches!(client.entry("a@b.c", &headers()).await, Err(DictError::RateLimited(k)) if k == "RateLimited"));
}

#[tokio::test]
async fn the_local_bucket_empties_before_the_dicts_and_a_miss_costs_more() {
    let r = rig("F", &[]).await;
    let lookups = r.lookups().await;
    lookups.sync().await.expect("the Central Bank's state taken");
    // Category F: 1,000 tokens, 2 per minute. Leave 10 on both sides.
    r.control("policies", Some(json!({"ispb": ISPB, "participant_tokens": 10}))).await;
    assert_eq!(lookups.sync().await.unwrap(), 10);
    let keys = r.keys("EVP", 0, 20).await;
    let payers = ["52998224725", "11222333000181", "12345678909", "98765432100"];
    let (mut answered, mut refused) = (0, 0);
    for (i, key) in keys.iter().enumerate() {
        let payer = payers[i % payers.len()];
        match lookups.lookup(&format!("{key}-missing"), payer, E2E).await {
            Ok(a) => {
                assert_eq!((a.source, a.entry), (Source::Dict, None));
                answered += 1;
            }
            Err(LookupError::RateLimited { policy, retry_after }) => {
                assert_eq!(policy, "ENTRIES_READ_PARTICIPANT_ANTISCAN");
                assert!(retry_after >= Duration::from_secs(20), "F refills 2/min: {retry_after:?}");
                refused += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    // Each miss costs 3 of 10 tokens: the fourth is admitted on 1 token, then the mirror refuses.
    assert_eq!((answered, refused), (4, 16));
    let audit = r.audit().await;
    assert_eq!(audit["dict_429_participant"], 0, "the DICT never had to refuse: {audit}");
    assert_eq!(audit["dict_404"], 4);
}

#[tokio::test]
async fn a_payers_bucket_is_refused_locally_before_the_dict_would() {
    let r = rig("A", &[]).await;
    let lookups = r.lookups().await;
    // A natural person's user bucket: 100 tokens, a miss costs 20, our mirror pre-charges it.
    let mut outcomes = Vec::new();
    for i in 0..7 {
        let out = lookups.lookup(&format!("ghost{i}@exemplo.com.br"), PAYER, E2E).await;
        outcomes.push(out.is_ok());
    }
    assert_eq!(outcomes, [true, true, true, true, true, false, false]);
    assert_eq!(r.audit().await["dict_429_user"], 0);
    // Another payer, another bucket; another key type (V2), another bucket.
    assert!(lookups.lookup("ghost@exemplo.com.br", "11222333000181", E2E).await.is_ok());
    assert!(lookups.lookup("00000000000", PAYER, E2E).await.is_ok());
}

#[tokio::test]
async fn found_and_missing_keys_are_cached_for_their_own_lifetimes() {
    let r = rig("A", &[("CABINE__DICT__CACHE_FOUND_TTL", "2s"), ("CABINE__DICT__CACHE_NOT_FOUND_TTL", "500ms")]).await;
    let lookups = r.lookups().await;
    let key = r.keys("PHONE", 3, 1).await.remove(0);
    let first = lookups.lookup(&key, PAYER, E2E).await.unwrap();
    assert_eq!(first.source, Source::Dict);
    let second = lookups.lookup(&key, PAYER, E2E).await.unwrap();
    assert_eq!((second.source, &second.entry), (Source::Cache, &first.entry));
    assert_eq!(lookups.lookup("none@x.y", PAYER, E2E).await.unwrap().source, Source::Dict);
    assert_eq!(lookups.lookup("none@x.y", PAYER, E2E).await.unwrap().source, Source::Cache);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(lookups.lookup("none@x.y", PAYER, E2E).await.unwrap().source, Source::Dict, "not found: 500 ms");
    assert_eq!(lookups.lookup(&key, PAYER, E2E).await.unwrap().source, Source::Cache, "found: 2 s");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(lookups.lookup(&key, PAYER, E2E).await.unwrap().source, Source::Dict);
    assert_eq!(r.audit().await["dict_lookups"], 4);
}

#[tokio::test]
async fn a_dict_outage_serves_stale_copies_only_of_entries_without_an_open_claim() {
    let ttls = [("CABINE__DICT__CACHE_FOUND_TTL", "300ms"), ("CABINE__DICT__CACHE_NOT_FOUND_TTL", "300ms")];
    let r = rig("A", &ttls).await;
    let lookups = r.lookups().await;
    let plain = r.keys("CPF", 0, 1).await.remove(0);
    let claimed = r.keys("CPF", 49, 1).await.remove(0);
    assert!(lookups.lookup(&plain, PAYER, E2E).await.unwrap().entry.is_some());
    let c = lookups.lookup(&claimed, PAYER, E2E).await.unwrap();
    assert!(c.entry.as_ref().is_some_and(|e| e.open_claim_creation_date.is_some()), "entry 49 has an open claim");
    tokio::time::sleep(Duration::from_millis(400)).await;
    r.control("faults", Some(json!({"down": true}))).await;
    let stale = lookups.lookup(&plain, PAYER, E2E).await.expect("the stale copy");
    assert_eq!(stale.source, Source::StaleCache);
    assert!(stale.age_ms >= 300, "{}", stale.age_ms);
    assert!(
        matches!(lookups.lookup(&claimed, PAYER, E2E).await, Err(LookupError::Unavailable(_))),
        "open claim: no stale"
    );
    assert!(matches!(lookups.lookup("never@seen.br", PAYER, E2E).await, Err(LookupError::Unavailable(_))));
    r.control("faults", Some(json!({}))).await;
    assert_eq!(lookups.lookup(&plain, PAYER, E2E).await.unwrap().source, Source::Dict);
}

#[tokio::test]
async fn concurrent_lookups_of_one_key_by_one_payer_make_one_request() {
    let r = rig("A", &[]).await;
    r.control("faults", Some(json!({"latency_ms": 200}))).await;
    let lookups = r.lookups().await;
    let key = r.keys("EMAIL", 5, 1).await.remove(0);
    let all = (0..30).map(|i| {
        let (l, k) = (lookups.clone(), key.clone());
        // Two payers: each is asked about under its own PI-PayerId.
        let payer = if i % 3 == 0 { "11222333000181" } else { PAYER };
        tokio::spawn(async move { l.lookup(&k, payer, E2E).await })
    });
    let answers: Vec<_> = futures::future::join_all(all).await.into_iter().map(|j| j.unwrap().unwrap()).collect();
    assert!(answers.iter().all(|a| a.entry.as_ref().is_some_and(|e| e.key == key)));
    assert_eq!(r.audit().await["dict_lookups"], 2, "30 callers, two payers, two requests");
}

#[tokio::test]
async fn a_cached_answer_still_costs_the_payer_its_anti_scan_tokens() {
    let r = rig("A", &[]).await;
    let lookups = r.lookups().await;
    // A natural person's bucket holds 100 tokens; a key not found costs 20, cached or not.
    let other = "12345678909";
    assert!(lookups.lookup("gone@exemplo.com.br", other, E2E).await.is_ok_and(|a| a.source == Source::Dict));
    let mut sources = Vec::new();
    for _ in 0..6 {
        sources.push(lookups.lookup("gone@exemplo.com.br", PAYER, E2E).await.map(|a| a.source));
    }
    assert!(sources[..5].iter().all(|s| *s == Ok(Source::Cache)), "5 × 20 tokens: {sources:?}");
    assert!(
        matches!(&sources[5], Err(LookupError::RateLimited { policy, .. }) if policy == "ENTRIES_READ_USER_ANTISCAN")
    );
    assert_eq!(r.audit().await["dict_lookups"], 1, "the DICT was asked once");
}

#[tokio::test]
async fn an_unreachable_redis_fails_open() {
    // Nothing listens on port 9 (discard): every bucket and cache call fails at once.
    let r =
        rig("A", &[("CABINE__REDIS__URL", "redis://127.0.0.1:9"), ("CABINE__REDIS__COMMAND_TIMEOUT", "200ms")]).await;
    let redis = cabine::redis::connect(&r.settings.redis).expect("a client");
    let lookups = cabine::dict::from_settings(&r.settings, redis).unwrap().unwrap();
    let key = r.keys("CNPJ", 1, 1).await.remove(0);
    let a = lookups.lookup(&key, PAYER, E2E).await.expect("admitted unchecked");
    assert_eq!(a.source, Source::Dict);
    assert_eq!(r.audit().await["dict_lookups"], 1);
}

#[tokio::test]
async fn a_429_from_the_dict_resynchronises_the_mirror() {
    // Category F: 2 tokens a minute, so the emptied bucket stays empty for the test.
    let r = rig("F", &[]).await;
    let lookups = r.lookups().await;
    // The mirror is full (never synced); the DICT's participant bucket is empty.
    r.control("policies", Some(json!({"ispb": ISPB, "participant_tokens": 0}))).await;
    let first = lookups.lookup("someone@exemplo.com.br", PAYER, E2E).await;
    assert!(
        matches!(&first, Err(LookupError::RateLimited { policy, .. }) if policy == "DICT RateLimited"),
        "{first:?}"
    );
    // The 429 made the pod take the DICT's state: the next lookup is refused here, not there.
    let second = lookups.lookup("someone.else@exemplo.com.br", PAYER, E2E).await;
    assert!(
        matches!(&second, Err(LookupError::RateLimited { policy, .. }) if policy == "ENTRIES_READ_PARTICIPANT_ANTISCAN"),
        "{second:?}"
    );
    let audit = r.audit().await;
    assert_eq!((audit["dict_429_participant"].as_u64(), audit["policy_reads"].as_u64()), (Some(1), Some(1)), "{audit}");
}

#[tokio::test]
async fn the_dict_speaks_mtls_and_knows_who_asks() {
    cabine::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SimConfig::new(vec![ISPB.parse().unwrap(), "99999011".parse().unwrap()]);
    cfg.seed = Some(7);
    cfg.tls =
        Some(cabine::sim::TlsOptions { dir: dir.path().to_owned(), server_key: cabine::sim::ServerKeyKind::Ecdsa });
    let sim = Simulator::start(cfg).await.expect("the simulator starts");
    let files = sim.tls.as_ref().expect("the PKI");
    let mine = files.client(ISPB).expect("our certificate");
    let env = |ispb: &str| -> HashMap<String, String> {
        [
            ("CABINE__DICT__ENABLED", "true".to_owned()),
            ("CABINE__DICT__BASE_URL", format!("https://{}/api/v1/", sim.dict)),
            ("CABINE__DICT__CA_FILE", files.ca_cert.display().to_string()),
            ("CABINE__DICT__CERT_FILE", mine.cert.display().to_string()),
            ("CABINE__DICT__KEY_FILE", mine.key.display().to_string()),
            ("CABINE__CLUSTER__ISPB", ispb.to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    };
    let settings = Settings::from_sources(DEFAULT_TOML, None, &env(ISPB)).expect("settings");
    let client = DictClient::new(&settings.dict, &settings.cluster.ispb).expect("an mTLS client");
    assert!(client.policies().await.is_ok_and(|p| p.category == "A"));
    assert_eq!(client.entry("nobody@exemplo.com.br", &headers()).await.unwrap(), Found::NotFound);
    // Our certificate, another participant's header: 403, an error of ours (never retried as an outage).
    let other = Settings::from_sources(DEFAULT_TOML, None, &env("99999011")).expect("settings");
    let wrong = DictClient::new(&other.dict, &other.cluster.ispb).expect("client");
    assert!(matches!(wrong.entry("a@b.c", &headers()).await, Err(DictError::Malformed(m)) if m.contains("403")));
    // No client certificate: the handshake is refused, the DICT unreachable.
    let plain = DictClient::new(
        &Settings::from_sources(
            DEFAULT_TOML,
            None,
            &[("CABINE__DICT__BASE_URL".to_owned(), format!("http://{}/api/v1/", sim.dict))].into(),
        )
        .unwrap()
        .dict,
        &settings.cluster.ispb,
    )
    .unwrap();
    assert!(matches!(plain.entry("a@b.c", &headers()).await, Err(DictError::Unavailable(_))));
}

#[tokio::test]
async fn the_mirror_refills_at_the_rate_the_dict_reported() {
    use cabine::dict::bucket::{Admission, DictBuckets, PARTICIPANT};
    use std::sync::atomic::Ordering;
    let r = rig("F", &[]).await;
    let redis = cabine::redis::connect(&r.settings.redis).expect("redis");
    fred::interfaces::ClientLike::wait_for_connect(&redis).await.expect("redis connects");
    let (clock, now) = cabine::redis::guard::ScriptClock::pinned(1_000_000);
    let buckets = DictBuckets::new(redis, cabine::harness::unique_name("dict_refill"), "A", clock);
    // The DICT's state wins over the configured category: 3 tokens of 1,000, 2 per minute.
    buckets.set_participant(3.0, 1000.0, 2.0).await.unwrap();
    assert!(matches!(buckets.admit("EVP", PAYER).await, Admission::Admitted { participant_left: 0, .. }));
    let refused = buckets.admit("EVP", PAYER).await;
    assert_eq!(refused, Admission::Refused { policy: PARTICIPANT, retry_after: Duration::from_secs(30) });
    now.fetch_add(29_000, Ordering::SeqCst);
    assert!(matches!(buckets.admit("EVP", PAYER).await, Admission::Refused { .. }), "29 s: not yet one token");
    now.fetch_add(1_000, Ordering::SeqCst);
    let Admission::Admitted { epoch, .. } = buckets.admit("EVP", PAYER).await else { panic!("30 s: one token") };
    // A found entry gives back what the 404's pre-charge took beyond its cost.
    buckets.refund("EVP", PAYER, (2.0, 19.0), epoch).await;
    assert_eq!(buckets.participant_tokens().await.unwrap(), 0, "1 - 3 + 2");
    // The DICT's state taken while a lookup is out: its refund is not added to the DICT's figure.
    buckets.set_participant(10.0, 1000.0, 2.0).await.unwrap();
    let Admission::Admitted { epoch: before, .. } = buckets.admit("EVP", PAYER).await else { panic!("admitted") };
    buckets.set_participant(10.0, 1000.0, 2.0).await.unwrap();
    buckets.refund("EVP", PAYER, (2.0, 19.0), before).await;
    assert_eq!(buckets.participant_tokens().await.unwrap(), 10, "the DICT's figure already holds that lookup");
}
