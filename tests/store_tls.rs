//! TLS to every store, against private servers started with throw-away
//! certificates (rcgen): Postgres (`ssl=on`, `hostssl` only, client
//! certificates required), Redis (`--tls-port`, `--tls-auth-clients yes`) and
//! NATS (`tls { verify: true }`). For each, a client with the right CA and
//! certificate connects and works, and a foreign CA, a missing client
//! certificate or plain text is refused with an error that says what failed.
//! Then a pod's own wiring: `check-config`, `migrate` and the readiness probe
//! against the three TLS servers, and a missing CA file refused at boot (64).

use std::collections::HashMap;
use std::process::Output;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use cabine::config::{DEFAULT_TOML, Settings};
use cabine::db::bounded::{self, Bounded};
use cabine::harness::{NatsServer, PostgresServer, RedisServer, TestPki};
use cabine::readiness::DependencyProbe;
use fred::prelude::{ClientLike, KeysInterface};

/// Bound on one connection attempt that is expected to fail.
const REFUSAL_WITHIN: Duration = Duration::from_secs(10);

fn settings(pairs: &[(String, String)]) -> Settings {
    let env: HashMap<String, String> = pairs.iter().cloned().collect();
    Settings::from_sources(DEFAULT_TOML, None, &env).expect("test settings are valid")
}

fn pair(k: &str, v: impl Into<String>) -> (String, String) {
    (k.to_owned(), v.into())
}

/// `CABINE__{SECTION}__{CA,CERT,KEY}_FILE` for `pki`, with or without the client identity.
fn files(section: &str, ca: &TestPki, identity: Option<&TestPki>) -> Vec<(String, String)> {
    let key = |k: &str| format!("CABINE__{section}__{k}");
    let mut out = vec![pair(&key("CA_FILE"), ca.ca.display().to_string())];
    if let Some(id) = identity {
        out.push(pair(&key("CERT_FILE"), id.client_cert.display().to_string()));
        out.push(pair(&key("KEY_FILE"), id.client_key.display().to_string()));
    }
    out
}

fn postgres_settings(pg: &PostgresServer, sslmode: &str, ca: &TestPki, identity: Option<&TestPki>) -> Settings {
    let mut pairs = vec![
        pair("CABINE__POSTGRES__URL", pg.url()),
        pair("CABINE__POSTGRES__SSLMODE", sslmode),
        pair("CABINE__POSTGRES__CREATE_TIMEOUT", "5s"),
    ];
    if sslmode != "disable" {
        pairs.extend(files("POSTGRES", ca, identity));
    }
    settings(&pairs)
}

/// Why a checkout from a fresh pool with these settings fails.
async fn checkout_refusal(s: &Settings) -> String {
    let db = cabine::db::pool(&s.postgres).expect("pool");
    match tokio::time::timeout(REFUSAL_WITHIN, db.get()).await {
        Ok(Ok(_)) => panic!("connected with {:?}", s.postgres.sslmode),
        Ok(Err(e)) => cabine::readiness::error_chain(&e),
        Err(_) => panic!("no answer within {REFUSAL_WITHIN:?}"),
    }
}

#[tokio::test]
async fn postgres_over_tls_verifies_the_server_and_presents_the_client_certificate() {
    cabine::install_crypto_provider();
    let (pki, foreign) = (TestPki::generate().unwrap(), TestPki::generate().unwrap());
    let pg = PostgresServer::start_tls(&pki.server(true)).await.unwrap();

    let db = cabine::db::pool(&postgres_settings(&pg, "verify-full", &pki, Some(&pki)).postgres).unwrap();
    let conn = db.get().await.expect("verify-full with the right CA and a client certificate connects");
    let row = conn.query_one("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await.unwrap();
    assert!(row.get::<_, bool>(0), "the session is encrypted ({:?})", row.get::<_, Option<String>>(1));
    drop(conn);

    let foreign_ca = checkout_refusal(&postgres_settings(&pg, "verify-full", &foreign, Some(&pki))).await;
    assert!(foreign_ca.contains("TLS handshake: invalid peer certificate"), "{foreign_ca}");
    let no_identity = checkout_refusal(&postgres_settings(&pg, "verify-full", &pki, None)).await;
    assert!(no_identity.contains("requires a valid client certificate"), "{no_identity}");
    let plain = checkout_refusal(&postgres_settings(&pg, "disable", &pki, None)).await;
    assert!(plain.contains("no encryption"), "{plain}");
}

/// The statement's own error type for [`bounded::with_conn`].
#[derive(Debug)]
enum Stmt {
    Pool,
    TimedOut,
    Failed,
}

impl Bounded for Stmt {
    fn pool(_: deadpool_postgres::PoolError) -> Self {
        Stmt::Pool
    }
    fn timed_out(_: Duration) -> Self {
        Stmt::TimedOut
    }
}

#[tokio::test]
async fn a_statement_past_its_timeout_is_cancelled_over_tls() {
    cabine::install_crypto_provider();
    let pki = TestPki::generate().unwrap();
    let pg = PostgresServer::start_tls(&pki.server(false)).await.unwrap();
    let db = cabine::db::pool(&postgres_settings(&pg, "verify-full", &pki, None).postgres).unwrap();
    let sleep = bounded::with_conn(&db, Duration::from_millis(500), |conn| async move {
        conn.execute("SELECT pg_sleep(20) /* cabine-cancel-probe */", &[]).await.map_err(|_| Stmt::Failed)
    })
    .await;
    assert!(matches!(sleep, Err(Stmt::TimedOut)), "{sleep:?}");
    let started = Instant::now();
    let probe =
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%cabine-cancel-probe */' AND pid <> pg_backend_pid()";
    loop {
        let running: i64 = db.get().await.unwrap().query_one(probe, &[]).await.unwrap().get(0);
        if running == 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "the statement still runs: its cancel was not sent");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn redis_settings(r: &RedisServer, ca: &TestPki, identity: Option<&TestPki>) -> Settings {
    let mut pairs = files("REDIS", ca, identity);
    pairs.push(pair("CABINE__REDIS__URL", r.url()));
    settings(&pairs)
}

/// Why the first connection of a fresh client with these settings fails.
async fn redis_refusal(s: &Settings) -> String {
    let client = cabine::redis::build(&s.redis).expect("client");
    let first = tokio::time::timeout(REFUSAL_WITHIN, async {
        let _task = client.init().await?;
        let _: String = client.ping(None).await?;
        Ok::<_, fred::error::Error>(())
    })
    .await;
    let _ = client.quit().await;
    match first {
        Ok(Ok(())) => panic!("connected to {}", s.redis.url),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("no answer within {REFUSAL_WITHIN:?}"),
    }
}

#[tokio::test]
async fn redis_over_tls_verifies_the_server_and_presents_the_client_certificate() {
    cabine::install_crypto_provider();
    let (pki, foreign) = (TestPki::generate().unwrap(), TestPki::generate().unwrap());
    let redis = RedisServer::start_tls(&pki.server(true)).await.unwrap();
    assert!(redis.url().starts_with("rediss://"));

    let client = cabine::redis::build(&redis_settings(&redis, &pki, Some(&pki)).redis).unwrap();
    tokio::time::timeout(REFUSAL_WITHIN, client.init()).await.expect("in time").expect("rediss:// connects");
    client.set::<(), _, _>("tls-probe", "over tls", None, None, false).await.unwrap();
    assert_eq!(client.get::<String, _>("tls-probe").await.unwrap(), "over tls");
    client.quit().await.unwrap();

    let foreign_ca = redis_refusal(&redis_settings(&redis, &foreign, Some(&pki))).await;
    assert!(foreign_ca.contains("InvalidCertificate"), "{foreign_ca}");
    let no_identity = redis_refusal(&redis_settings(&redis, &pki, None)).await;
    assert!(no_identity.contains("CertificateRequired"), "{no_identity}");
}

fn nats_settings(n: &NatsServer, ca: &TestPki, identity: Option<&TestPki>) -> Settings {
    let mut pairs = files("NATS", ca, identity);
    pairs.push(pair("CABINE__NATS__URL", n.url()));
    settings(&pairs)
}

async fn nats_refusal(s: &Settings) -> String {
    match tokio::time::timeout(REFUSAL_WITHIN, cabine::bus::connect_now(&s.nats)).await {
        Ok(Ok(_)) => panic!("connected to {}", s.nats.url),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("no answer within {REFUSAL_WITHIN:?}"),
    }
}

#[tokio::test]
async fn nats_over_tls_verifies_the_server_and_presents_the_client_certificate() {
    cabine::install_crypto_provider();
    let (pki, foreign) = (TestPki::generate().unwrap(), TestPki::generate().unwrap());
    let nats = NatsServer::start_tls(&pki.server(true)).await.unwrap();
    assert!(nats.url().starts_with("tls://"));

    let client = cabine::bus::connect_now(&nats_settings(&nats, &pki, Some(&pki)).nats).await.unwrap();
    let js = jetstream::new(client);
    let spec = stream::Config { name: "TLS".into(), subjects: vec!["tls.>".into()], ..Default::default() };
    js.create_stream(spec).await.unwrap();
    let ack = js.publish("tls.probe", "over tls".into()).await.unwrap().await.unwrap();
    assert_eq!((ack.stream.as_str(), ack.sequence), ("TLS", 1));

    let foreign_ca = nats_refusal(&nats_settings(&nats, &foreign, Some(&pki))).await;
    assert!(foreign_ca.contains("invalid peer certificate"), "{foreign_ca}");
    let no_identity = nats_refusal(&nats_settings(&nats, &pki, None)).await;
    assert!(no_identity.contains("alert") && no_identity.contains("Certificate"), "{no_identity}");
}

/// The three servers of one pod, all TLS with client certificates, and the pod's environment.
struct Stores {
    _pg: PostgresServer,
    _redis: RedisServer,
    _nats: NatsServer,
    env: Vec<(String, String)>,
}

async fn stores(pki: &TestPki) -> Stores {
    let tls = pki.server(true);
    let (pg, redis, nats) =
        tokio::join!(PostgresServer::start_tls(&tls), RedisServer::start_tls(&tls), NatsServer::start_tls(&tls));
    let (pg, redis, nats) = (pg.unwrap(), redis.unwrap(), nats.unwrap());
    let mut env = cabine::harness::isolated_env(&cabine::harness::unique_name("store_tls"));
    env.extend([
        pair("CABINE__POSTGRES__URL", pg.url()),
        pair("CABINE__POSTGRES__SSLMODE", "verify-full"),
        pair("CABINE__REDIS__URL", redis.url()),
        pair("CABINE__NATS__URL", nats.url()),
    ]);
    for section in ["POSTGRES", "REDIS", "NATS"] {
        env.extend(files(section, pki, Some(pki)));
    }
    Stores { _pg: pg, _redis: redis, _nats: nats, env }
}

async fn cabine(env: &[(String, String)], args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_cabine"));
    cmd.args(args).envs(env.iter().cloned()).env("RUST_LOG", "warn").kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(30), cmd.output()).await.expect("in time").expect("runs")
}

#[tokio::test]
async fn a_pod_migrates_and_gets_ready_over_tls_to_every_store() {
    cabine::install_crypto_provider();
    let pki = TestPki::generate().unwrap();
    let stores = stores(&pki).await;

    let shown = cabine(&stores.env, &["check-config"]).await;
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    assert!(text.contains("sslmode = \"verify-full\"") && !text.contains("PRIVATE KEY"), "{text}");

    let migrated = cabine(&stores.env, &["migrate"]).await;
    assert!(migrated.status.success(), "migrate over TLS: {}", String::from_utf8_lossy(&migrated.stderr));

    let s = settings(&stores.env);
    let deps = cabine::run::Dependencies::connect(&s).await.unwrap();
    let probe = DependencyProbe::new(deps.redis, deps.postgres, deps.nats.clone(), Duration::from_secs(2));
    let started = Instant::now();
    loop {
        let checks = probe.check_all().await;
        if checks.values().all(|c| c.ok) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "not ready over TLS: {checks:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The same pod with a foreign CA for Postgres and Redis: not ready, and its status says why.
    let foreign = TestPki::generate().unwrap();
    let mut env = stores.env.clone();
    env.extend(files("POSTGRES", &foreign, None).into_iter().chain(files("REDIS", &foreign, None)));
    let wrong = settings(&env);
    let redis = cabine::redis::connect(&wrong.redis).unwrap();
    let postgres = cabine::db::pool(&wrong.postgres).unwrap();
    let probe = DependencyProbe::new(redis, postgres, deps.nats, Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let checks = probe.check_all().await;
    for (store, why) in [("postgres", "invalid peer certificate"), ("redis", "InvalidCertificate")] {
        let c = &checks[store];
        assert!(!c.ok && c.detail.contains(why), "{store}: {c:?}");
    }
}

#[tokio::test]
async fn a_missing_ca_file_is_refused_at_boot_naming_its_key() {
    let env =
        [pair("CABINE__NATS__URL", "tls://127.0.0.1:4443"), pair("CABINE__NATS__CA_FILE", "/nonexistent/nats-ca.pem")];
    let refused = cabine(&env, &["check-config"]).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("nats.ca_file") && stderr.contains("/nonexistent/nats-ca.pem"), "{stderr}");
}
