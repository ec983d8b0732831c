//! Prometheus: a real `prometheus-postgres-exporter` (Debian's 0.11) runs queen's queries
//! (prometheus/queen.yaml) against the test database; `make integration` starts it and
//! passes its URL in QUEEN_TEST_METRICS_URL. The test scrapes `/metrics` over HTTP with curl
//! after a known push, pop, ack and dead-letter sequence, and checks the series' values.

use std::process::Command;

use queen_it::{connect, unique};

/// One scrape in which the exporter reached the database (`pg_up 1`). Other tests of the
/// suite restart the server; the exporter's first scrape after that finds its connection
/// gone and reconnects for the next one, as it would in production.
fn scrape() -> String {
    let url = std::env::var("QUEEN_TEST_METRICS_URL")
        .expect("QUEEN_TEST_METRICS_URL is not set: run these tests with `make integration`");
    let mut last = String::new();
    for _ in 0..20 {
        let out = Command::new("curl").args(["-sSf", "--max-time", "30", &url]).output().expect("run curl");
        assert!(out.status.success(), "scrape {url}: {}", String::from_utf8_lossy(&out.stderr));
        last = String::from_utf8(out.stdout).unwrap();
        if last.lines().any(|l| l == "pg_up 1") {
            return last;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    panic!("the exporter never reached the database: {last}");
}

/// The value of the series `name` whose labels include every `label="value"` given.
fn value(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, v) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name && labels.iter().all(|(k, val)| rest.contains(&format!("{k}=\"{val}\"")))).then(|| v.parse().ok())?
    })
}

#[test]
fn the_exporter_serves_queen_series_after_a_known_sequence() {
    let mut c = connect();
    let queue = unique("metrics");
    for n in 1..=3 {
        c.execute("SELECT 1 FROM queen.push($1, jsonb_build_object('n', $2::int))", &[&queue, &n]).unwrap();
    }
    // Group g leases 1..2 and dead-letters 1: its cursor moves to 1 and the lease ends.
    let rows = c.query("SELECT lease_id, partition_id FROM queen.pop($1, 'g', batch => 2)", &[&queue]).unwrap();
    let (lease, pid): (uuid::Uuid, uuid::Uuid) = (rows[0].get(0), rows[0].get(1));
    c.execute("SELECT queen.ack($1, $2, 1, 'dlq', 'bad')", &[&lease, &pid]).unwrap();
    // Then it leases 2, fails it once (one retry spent; the lease ends), and leases 2..3
    // again, keeping that lease.
    let rows = c.query("SELECT lease_id FROM queen.pop($1, 'g', batch => 1)", &[&queue]).unwrap();
    let lease2: uuid::Uuid = rows[0].get(0);
    c.execute("SELECT queen.ack($1, $2, 2, 'failed', 'flaky')", &[&lease2, &pid]).unwrap();
    c.query("SELECT 1 FROM queen.pop($1, 'g', batch => 2)", &[&queue]).unwrap();
    // Group h has read everything.
    c.query("SELECT 1 FROM queen.pop($1, 'h', batch => 10, auto_ack => true)", &[&queue]).unwrap();

    let page = scrape();
    let q = [("queue", queue.as_str())];
    let g = [("queue", queue.as_str()), ("consumer_group", "g")];
    let h = [("queue", queue.as_str()), ("consumer_group", "h")];
    assert_eq!(value(&page, "queen_queue_partitions", &q), Some(1.0), "{page}");
    assert_eq!(value(&page, "queen_queue_messages", &q), Some(3.0));
    let segments = value(&page, "queen_queue_segments", &q).unwrap();
    assert!((1.0..=3.0).contains(&segments), "{segments}");
    assert!(value(&page, "queen_queue_bytes", &q).unwrap() > 0.0);
    assert_eq!(value(&page, "queen_group_lag_messages", &g), Some(2.0));
    assert_eq!(value(&page, "queen_group_leases_live", &g), Some(1.0));
    assert_eq!(value(&page, "queen_group_leases_expired", &g), Some(0.0));
    assert_eq!(value(&page, "queen_group_retries", &g), Some(1.0));
    let age = value(&page, "queen_group_lag_seconds", &g).unwrap();
    assert!((0.0..600.0).contains(&age), "{age}");
    assert_eq!(value(&page, "queen_dead_letters_count", &g), Some(1.0));
    assert_eq!(value(&page, "queen_group_lag_messages", &h), Some(0.0));
    assert_eq!(value(&page, "queen_group_lag_seconds", &h), Some(0.0));
    assert_eq!(value(&page, "queen_dead_letters_count", &h), None, "h has no dead letters");
    assert!(value(&page, "queen_retention_runs", &[]).is_some(), "the retention series are served");
    assert_eq!(value(&page, "queen_queue_paused", &q), Some(0.0));
    assert_eq!(value(&page, "queen_group_paused", &g), Some(0.0));
    // A group paused (queen.pause): its series says so, and the queue's does not.
    c.execute("SELECT queen.pause($1, 'g')", &[&queue]).unwrap();
    let paused = scrape();
    assert_eq!(value(&paused, "queen_group_paused", &g), Some(1.0), "{paused}");
    assert_eq!(value(&paused, "queen_group_paused", &h), Some(0.0));
    assert_eq!(value(&paused, "queen_queue_paused", &q), Some(0.0));
    c.execute("SELECT queen.resume($1, 'g')", &[&queue]).unwrap();

    // This database's maintenance worker: it runs, and its retention pass (every second
    // here, scripts/test.conf) has run and succeeded lately. (Another test may have just
    // restarted the server: the counters start again from zero, so wait a little.)
    let r = [("pass", "retention")];
    let mut page = page;
    for _ in 0..30 {
        if value(&page, "queen_maintenance_runs", &r).is_some_and(|v| v > 0.0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        page = scrape();
    }
    assert_eq!(value(&page, "queen_maintenance_worker_running", &[]), Some(1.0), "{page}");
    assert!(value(&page, "queen_maintenance_runs", &r).is_some_and(|v| v > 0.0), "{page}");
    let age = value(&page, "queen_maintenance_age_seconds", &r).unwrap();
    assert!((0.0..60.0).contains(&age), "retention last succeeded {age} s ago");
    assert_eq!(value(&page, "queen_maintenance_errors", &[("pass", "compaction")]), Some(0.0), "{page}");

    // An expired lease shows as awaiting reclaim.
    c.execute("SELECT queen._expire_lease(lease_id) FROM queen.status($1) WHERE consumer_group = 'g'", &[&queue])
        .unwrap();
    let page = scrape();
    assert_eq!(value(&page, "queen_group_leases_live", &g), Some(0.0));
    assert_eq!(value(&page, "queen_group_leases_expired", &g), Some(1.0));

    // Every series the Grafana dashboard plots is one the exporter serves.
    let dash: serde_json::Value =
        serde_json::from_str(include_str!("../../prometheus/grafana-queen.json")).expect("dashboard JSON");
    let mut names = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(i) = rest.find("queen_") {
                let name: String = rest[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                rest = &rest[i + name.len()..];
                names.push(name);
            }
        }
    }
    assert!(names.len() >= 8, "{names:?}");
    for n in names {
        assert!(page.lines().any(|l| l.starts_with(&format!("{n}{{")) || l.starts_with(&format!("{n} "))), "{n}");
    }
}
