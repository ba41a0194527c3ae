//! The private servers `cabine chaos` restarts under the pods, against the real
//! binaries: a Redis snapshot comes back with a restart and eviction spares the
//! keys without a TTL; a crash-stopped Postgres keeps what was committed; a
//! restarted NATS keeps its JetStream messages on disk.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use cabine::harness::{NatsServer, PostgresServer, RedisServer};

/// GET as a status reply (`+value`, `+nil`): `RedisServer::command` shows only a reply's first line.
async fn get(r: &RedisServer, key: &str) -> String {
    let script = "return {ok = redis.call('GET', KEYS[1]) or 'nil'}";
    r.command(&["EVAL", script, "1", key]).await.unwrap()
}

#[tokio::test]
async fn a_redis_restart_loads_the_last_snapshot_and_eviction_spares_keys_without_a_ttl() {
    let dir = std::env::temp_dir().join(cabine::harness::unique_name("redis_snapshot_test"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut r = RedisServer::start_in(&dir).await.unwrap();
    assert_eq!(r.command(&["SET", "epoch", "e1"]).await.unwrap(), "+OK");
    assert_eq!(r.command(&["SET", "lease", "g1", "PX", "60000"]).await.unwrap(), "+OK");
    r.save().await.unwrap();
    r.command(&["SET", "lease", "g2", "PX", "60000"]).await.unwrap();
    r.command(&["SET", "later", "x"]).await.unwrap();
    r.restart().await.unwrap();
    assert_eq!(get(&r, "lease").await, "+g1", "the snapshot's grant is back");
    assert_eq!(get(&r, "later").await, "+nil", "what came after the snapshot is gone");
    assert_eq!(r.evict_volatile().await.unwrap(), 1);
    assert_eq!((get(&r, "lease").await, get(&r, "epoch").await), ("+nil".to_owned(), "+e1".to_owned()));
    drop(r);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_crash_stopped_postgres_keeps_what_was_committed() {
    let mut pg = PostgresServer::start().await.unwrap();
    let url = pg.url();
    let connect = || async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    };
    let client = connect().await;
    client.batch_execute("CREATE TABLE t (n int); INSERT INTO t VALUES (7)").await.unwrap();
    pg.restart_after(Duration::from_millis(200)).await.unwrap();
    assert!(client.query_one("SELECT 1", &[]).await.is_err(), "the old connection was cut");
    let row = connect().await.query_one("SELECT n FROM t", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 7);
}

#[tokio::test]
async fn a_restarted_nats_keeps_its_jetstream_messages() {
    let mut nats = NatsServer::start().await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = jetstream::new(client.clone());
    let config = stream::Config {
        name: "T".into(),
        subjects: vec!["t.>".into()],
        storage: stream::StorageType::File,
        ..Default::default()
    };
    js.create_stream(config).await.unwrap();
    js.publish("t.a", "one".into()).await.unwrap().await.unwrap();
    nats.restart_after(Duration::from_millis(200)).await.unwrap();
    let mut found = 0;
    for _ in 0..50 {
        if let Ok(mut s) = js.get_stream("T").await
            && let Ok(info) = s.info().await
        {
            found = info.state.messages;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(found, 1, "the message survived the restart");
}
