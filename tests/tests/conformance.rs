//! The client libraries' shared conformance suite (clients/conformance/scenarios.json), run
//! by the Rust crate (`consumer/`), and its README example, run as printed.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queen_consumer::{Builder, Outcome};
use queen_it::{dsn, unique};
use serde_json::{json, Value};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

async fn client() -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(&dsn(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    c
}

/// What an auto-ack pop of `group` gets now: the offsets.
async fn left(c: &tokio_postgres::Client, queue: &str, group: &str) -> Vec<i64> {
    let mut v: Vec<i64> = c
        .query(
            "SELECT msg_offset FROM queen.pop($1, $2, batch => 1000, max_partitions => 100, auto_ack => true)",
            &[&queue, &group],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    v.sort();
    v
}

async fn dead_letters(c: &tokio_postgres::Client, queue: &str) -> Vec<String> {
    c.query("SELECT error_message FROM queen.dlq($1)", &[&queue]).await.unwrap().iter().map(|r| r.get(0)).collect()
}

/// Runs `pool` with the scenario's per-message handler until its shutdown token fires.
async fn run_each(
    pool: queen_consumer::Pool,
    h: Value,
    started: Arc<Mutex<Vec<(String, i64)>>>,
    ended: Arc<Mutex<usize>>,
    failed_once: Arc<Mutex<Vec<i64>>>,
) -> Result<(), tokio_postgres::Error> {
    let (s2, e2, f2) = (started, ended, failed_once);
    pool.run(move |m, _cancel| {
        let (started, ended, failed_once, h) = (s2.clone(), e2.clone(), f2.clone(), h.clone());
        async move {
            started.lock().unwrap().push((m.partition.clone(), m.offset));
            if let Some(ms) = h["sleep_ms"].as_u64() {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let result = {
                let mut once = failed_once.lock().unwrap();
                if h["fail_once_at"].as_i64() == Some(m.offset) && !once.contains(&m.offset) {
                    once.push(m.offset);
                    Err("fails once".to_string())
                } else if let Some(e) = h["always_fail"].as_str() {
                    Err(e.to_string())
                } else {
                    Ok(Outcome::Completed)
                }
            };
            *ended.lock().unwrap() += 1;
            result
        }
    })
    .await
}

async fn run_scenario(s: &Value) {
    let name = s["name"].as_str().unwrap();
    let queue = unique("rs-conf");
    let c = client().await;
    if let Some(limit) = s["queue"]["retry_limit"].as_i64() {
        c.execute("SELECT queen.configure($1, retry_limit => $2)", &[&queue, &(limit as i32)]).await.unwrap();
    }
    let (n, parts) = (s["push"]["messages"].as_i64().unwrap(), s["push"]["partitions"].as_i64().unwrap());
    let items: Vec<Value> =
        (0..n).map(|i| json!({"queue": queue, "payload": i, "partition": format!("p{}", i % parts)})).collect();
    c.execute("SELECT count(*) FROM queen.push_batch($1)", &[&json!(items)]).await.unwrap();

    let h = s["handler"].clone();
    let cfg = &s["consumer"];
    let started: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let ended: Arc<Mutex<usize>> = Arc::default();
    let failed_once: Arc<Mutex<Vec<i64>>> = Arc::default();
    let workers = cfg["workers"].as_u64().unwrap_or(1) as usize;
    let mut b = Builder::new(&queue, "conformance")
        .batch(cfg["batch"].as_i64().unwrap_or(10) as i32)
        .wait(Duration::from_millis(200))
        .check_may_start(cfg["check_may_start"].as_bool().unwrap_or(true));
    if let Some(l) = cfg["lease_seconds"].as_u64() {
        b = b.lease(Duration::from_secs(l));
    }
    let (stop_all, running) = if cfg["batch_handler"].as_bool() == Some(true) {
        // One consumer with a batch handler: it fails every call that holds `fail_when_holds`.
        let (client, connection) = tokio_postgres::connect(&dsn(), tokio_postgres::NoTls).await.unwrap();
        let consumer = b.build_with_connection(client, connection).await.unwrap();
        let stop_all = consumer.shutdown_token();
        let (s2, e2, h2) = (started.clone(), ended.clone(), h.clone());
        let running = tokio::spawn(async move {
            consumer
                .run_batch(move |ms, _cancel| {
                    let (started, ended, h) = (s2.clone(), e2.clone(), h2.clone());
                    async move {
                        started.lock().unwrap().extend(ms.iter().map(|m| (m.partition.clone(), m.offset)));
                        *ended.lock().unwrap() += ms.len();
                        match h["fail_when_holds"].as_i64() {
                            Some(o) if ms.iter().any(|m| m.offset == o) => Err(format!("fails while it holds {o}")),
                            _ => Ok(Outcome::Completed),
                        }
                    }
                })
                .await
        });
        (stop_all, running)
    } else {
        let pool = b.build_pool(&dsn(), workers).await.unwrap();
        (pool.shutdown_token(), tokio::spawn(run_each(pool, h.clone(), started.clone(), ended.clone(), failed_once)))
    };

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut probes: Vec<Vec<i64>> = Vec::new();
    if let Some(at) = s["probe_ms"].as_array() {
        while started.lock().unwrap().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let t0 = Instant::now();
        for ms in at {
            let when = t0 + Duration::from_millis(ms.as_u64().unwrap());
            tokio::time::sleep(when.saturating_duration_since(Instant::now())).await;
            probes.push(left(&c, &queue, "conformance").await);
        }
    }
    let stop = &s["stop"];
    loop {
        let done = if let Some(k) = stop["handled"].as_u64() {
            *ended.lock().unwrap() as u64 >= k
        } else if let Some(k) = stop["started"].as_u64() {
            started.lock().unwrap().len() as u64 >= k
        } else {
            dead_letters(&c, &queue).await.len() as u64 >= stop["dead_letters"].as_u64().unwrap()
        };
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "{name}: stop condition {stop} not reached");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_all.cancel();
    running.await.unwrap().unwrap();

    let e = &s["expect"];
    let started = started.lock().unwrap().clone();
    if let Some(handled) = e["handled"].as_array() {
        let want: Vec<i64> = handled.iter().map(|v| v.as_i64().unwrap()).collect();
        assert_eq!(started.iter().map(|(_, o)| *o).collect::<Vec<_>>(), want, "{name}");
    }
    if let Some(per) = e["handled_per_partition"].as_object() {
        for (p, offsets) in per {
            let want: Vec<i64> = offsets.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
            let got: Vec<i64> = started.iter().filter(|(q, _)| q == p).map(|(_, o)| *o).collect();
            assert_eq!(got, want, "{name}: partition {p}");
        }
    }
    if e["probes_empty"].as_bool() == Some(true) {
        assert!(!probes.is_empty() && probes.iter().all(|p| p.is_empty()), "{name}: probes {probes:?}");
    }
    if let Some(text) = e["dlq_error_contains"].as_str() {
        let errors = dead_letters(&c, &queue).await;
        assert!(!errors.is_empty() && errors.iter().all(|x| x.contains(text)), "{name}: {errors:?}");
    }
    if let Some(want) = e["dlq_payloads"].as_array() {
        let got: Vec<Value> = c
            .query("SELECT data FROM queen.dlq($1) ORDER BY failed_at", &[&queue])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(&got, want, "{name}: dead letters");
    }
    let want: Vec<i64> = e["left"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    assert_eq!(left(&c, &queue, "conformance").await, want, "{name}: left after the stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_scenarios() {
    let suite: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{ROOT}/clients/conformance/scenarios.json")).unwrap())
            .unwrap();
    for s in suite["scenarios"].as_array().unwrap() {
        run_scenario(s).await;
    }
}

#[test]
fn the_readme_shows_the_example_verbatim() {
    let readme = std::fs::read_to_string(format!("{ROOT}/consumer/README.md")).unwrap();
    let example = std::fs::read_to_string(format!("{ROOT}/consumer/examples/readme.rs")).unwrap();
    let block = readme.split("```rust\n").nth(1).and_then(|b| b.split("```").next()).unwrap();
    assert_eq!(block, example);
}

#[test]
fn the_readme_example_runs() {
    let mut c = postgres::Client::connect(&dsn(), postgres::NoTls).unwrap();
    c.execute("SELECT queen.delete_queue('emails')", &[]).unwrap();
    let bin = format!("{ROOT}/target/debug/examples/readme");
    let out = std::process::Command::new(&bin)
        .env("QUEEN_DSN", dsn())
        .output()
        .unwrap_or_else(|e| panic!("{bin}: {e} (make integration builds the examples first)"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "sending to \"ada@example.com\"");
    let left = c.query("SELECT 1 FROM queen.pop('emails', 'mailer', batch => 10, auto_ack => true)", &[]).unwrap();
    assert!(left.is_empty());
}
