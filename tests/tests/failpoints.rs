//! Every fail point fires (issue: "a test fires each one and shows that the other backends
//! lose, skip and duplicate nothing, and the server does not PANIC").
//!
//! The test build has fail points (`queen.failpoint`, src/pg/failpoints.rs) inside every
//! registry update and in the transaction callbacks. Here each one is fired on purpose,
//! in a session of its own, by the call that passes through it:
//! - inside a call's own registry work, the call fails with the point's panic as an ERROR;
//!   its transaction rolls back and the registry is as it was before the call;
//! - inside a transaction callback, the point is armed for two passes: the end is tried
//!   twice, kept, the session is warned, and the end is done at its next queen call. Nothing
//!   raises (an ERROR there would be a PANIC after a commit).
//!
//! After each, another session drains the point's queue and finds exactly the messages the
//! contract says: the committed pushes not yet consumed, once each. Meanwhile the
//! invariants harness runs in the same database (the other backends) and must lose, skip
//! and duplicate nothing. The points that need full tables (evicting a lane, sweeping
//! expired leases, a lease that cannot be put back) fire in a second phase, alone. The
//! server runs with small tables for the whole test (a restart at the start and one at the
//! end, which puts the settings back), so evictions happen all along.
//!
//! The two points in maintenance steps fire in a database's worker. A binary of its own:
//! it restarts the test cluster.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use queen_it::harness::{self, Config, FAIL_POINTS};
use queen_it::{connect_to_retrying, own_database, unique, use_database};

const DEFERRED: &str = "could not take a transaction's end";

fn restart() {
    let dir = std::env::var("QUEEN_TEST_DIR").expect("QUEEN_TEST_DIR (set by make integration)");
    let port = std::env::var("QUEEN_TEST_PORT").expect("QUEEN_TEST_PORT");
    for cmd in ["stop", "start"] {
        let ok = Command::new("bash")
            .args(["scripts/cluster.sh", cmd, &dir, &port])
            .current_dir("..")
            .status()
            .expect("run scripts/cluster.sh");
        assert!(ok.success(), "cluster.sh {cmd}");
    }
}

/// The server runs with `settings` (ALTER SYSTEM, a restart) until this is dropped, even
/// when the test fails.
struct Settings(&'static [(&'static str, &'static str)]);

impl Settings {
    fn apply(dsn: &str, settings: &'static [(&'static str, &'static str)]) -> Settings {
        let mut c = Client::connect(dsn, NoTls).unwrap();
        for (k, v) in settings {
            c.batch_execute(&format!("ALTER SYSTEM SET {k} = {v}")).unwrap();
        }
        restart();
        Settings(settings)
    }
}

impl Drop for Settings {
    fn drop(&mut self) {
        let dsn = std::env::var("QUEEN_TEST_DSN").unwrap();
        let mut c = connect_to_retrying(&dsn, Instant::now() + Duration::from_secs(60));
        for (k, _) in self.0 {
            let _ = c.batch_execute(&format!("ALTER SYSTEM RESET {k}"));
        }
        drop(c);
        restart();
    }
}

/// A session that keeps the warnings it gets.
struct Session {
    c: Client,
    notices: Arc<Mutex<Vec<String>>>,
}

impl Session {
    fn open(dsn: &str) -> Session {
        let notices = Arc::new(Mutex::new(Vec::new()));
        let mut config: postgres::Config = dsn.parse().unwrap();
        let n = notices.clone();
        config.notice_callback(move |e| n.lock().unwrap().push(e.message().to_string()));
        Session { c: config.connect(NoTls).unwrap(), notices }
    }

    fn sql(&mut self, sql: &str) {
        self.c.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }

    fn arm(&mut self, spec: &str) {
        self.sql(&format!("SET queen.failpoint = '{spec}'"));
    }

    fn disarm(&mut self) {
        self.sql("RESET queen.failpoint");
    }

    /// Whether a transaction's end was deferred since the last look.
    fn deferred(&mut self) -> bool {
        std::mem::take(&mut *self.notices.lock().unwrap()).iter().any(|m| m.contains(DEFERRED))
    }

    fn push(&mut self, queue: &str, partition: &str, payload: i32) {
        self.c.execute("SELECT 1 FROM queen.push($1, to_jsonb($2::int), $3)", &[&queue, &payload, &partition]).unwrap();
    }

    /// A push and a pop (they use both registries), so that the ends this session
    /// deferred are done.
    fn settle(&mut self) {
        self.sql("SELECT count(*) FROM queen.push('fp-settle', '0'); SELECT count(*) FROM queen.pop('fp-settle', auto_ack => true)");
        assert!(!self.deferred(), "settled");
    }
}

/// Fails unless `r` is the error of fail point `point`.
fn is_fault<T: std::fmt::Debug>(r: Result<T, postgres::Error>, point: &str) {
    let e = r.expect_err(&format!("fail point {point} armed: the call must fail"));
    let text = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_else(|| e.to_string());
    assert!(text.contains(&format!("queen fail point {point}")), "{point}: {e:?}");
}

/// Every message of `queue` for `group` that a fresh session pops now, as payloads in
/// payload order (auto_ack: consumed; 16 lanes a call, as the lane table is small here).
/// Panics on a payload seen twice.
fn drain(dsn: &str, queue: &str, group: &str) -> Vec<i32> {
    let mut c = Client::connect(dsn, NoTls).unwrap();
    let mut out = Vec::new();
    loop {
        let rows = c
            .query(
                "SELECT (payload)::int FROM queen.pop($1, $2, batch => 1000, max_partitions => 16, auto_ack => true)",
                &[&queue, &group],
            )
            .unwrap();
        if rows.is_empty() {
            break;
        }
        out.extend(rows.iter().map(|r| r.get::<_, i32>(0)));
    }
    let unique: BTreeSet<i32> = out.iter().copied().collect();
    assert_eq!(unique.len(), out.len(), "{queue}/{group} delivered a message twice: {out:?}");
    out.sort();
    out
}

/// Pushes message k to partition `p<k>` of `queue`, k in 1..=n (20 partitions a
/// transaction: the offset registry holds only 32 here).
fn spread(c: &mut Client, queue: &str, n: i32) {
    for from in (1..=n).step_by(20) {
        let to = (from + 19).min(n);
        c.execute(
            "SELECT count(*) FROM queen.push_batch($1, (SELECT jsonb_agg(jsonb_build_object('partition', 'p' || k, 'payload', k)) FROM generate_series($2::int, $3::int) k))",
            &[&queue, &from, &to],
        )
        .unwrap();
    }
}

fn queue_mode(dsn: &str, queue: &str) -> Vec<i32> {
    drain(dsn, queue, "__QUEUE_MODE__")
}

/// Pops of `queue` (queue mode, one partition each, leases of `secs`) until the lease
/// table is full (SQLSTATE 53400) or `n` pops. Returns the partitions leased.
fn fill_leases(c: &mut Client, queue: &str, n: usize, secs: i32) -> Vec<String> {
    let mut leased = Vec::new();
    for _ in 0..n {
        match c.query("SELECT partition FROM queen.pop($1, batch => 1, lease_seconds => $2)", &[&queue, &secs]) {
            Ok(rows) => leased.extend(rows.iter().map(|r| r.get::<_, String>(0))),
            Err(e) if e.code().map(|c| c.code()) == Some("53400") => break,
            Err(e) => panic!("{e:?}"),
        }
    }
    leased
}

struct Run {
    dsn: String,
    fired: BTreeSet<&'static str>,
}

impl Run {
    /// A point fired by a pop of a fresh lane: the pop fails, and nothing moved.
    fn on_pop(&mut self, point: &'static str) {
        let mut s = Session::open(&self.dsn);
        let q = unique("fp");
        for n in 1..=3 {
            s.push(&q, "p", n);
        }
        s.arm(point);
        is_fault(s.c.query("SELECT 1 FROM queen.pop($1, batch => 10)", &[&q]), point);
        s.disarm();
        assert_eq!(queue_mode(&self.dsn, &q), [1, 2, 3], "{point}");
        self.fired.insert(point);
    }

    /// A point fired by a push to a new partition (the offset registry loads it, then
    /// reserves, writes): it fails, and only the pushes that returned are delivered.
    fn on_push(&mut self, point: &'static str) {
        let mut s = Session::open(&self.dsn);
        let q = unique("fp");
        s.push(&q, "a", 1);
        s.arm(point);
        // (With a transaction id: deduplication has the push report what it wrote.)
        let again = "SELECT status FROM queen.push($1, '2', 'p', transaction_id => 'tx2')";
        is_fault(s.c.query(again, &[&q]), point);
        s.disarm();
        // The client's retry is stored: the failed push left no trace.
        assert_eq!(s.c.query_one(again, &[&q]).unwrap().get::<_, String>(0), "queued", "{point}");
        s.push(&q, "p", 3);
        assert_eq!(queue_mode(&self.dsn, &q), [1, 2, 3], "{point}");
        self.fired.insert(point);
    }

    /// A point in the end of a pop that commits: the end is deferred; until the session's
    /// next call its lane stays locked (nobody else gets the messages), then its lease is
    /// in force: the ack commits, and nothing is delivered again.
    fn on_pop_commit(&mut self, point: &'static str) {
        let mut s = Session::open(&self.dsn);
        let q = unique("fp");
        for n in 1..=3 {
            s.push(&q, "p", n);
        }
        s.arm(&format!("{point}:2"));
        let rows = s.c.query("SELECT lease_id FROM queen.pop($1, batch => 10)", &[&q]).unwrap();
        assert_eq!(rows.len(), 3);
        assert!(s.deferred(), "{point}: the end was deferred");
        s.disarm();
        assert_eq!(queue_mode(&self.dsn, &q), Vec::<i32>::new(), "{point}: leased, not delivered again");
        let lease: uuid::Uuid = rows[0].get(0);
        let acked: serde_json::Value = s.c.query_one("SELECT queen.ack($1)", &[&lease]).unwrap().get(0);
        assert_eq!(acked["lanes"].as_array().map(Vec::len), Some(1), "{point}: {acked}");
        assert!(!s.deferred());
        s.push(&q, "p", 4);
        assert_eq!(queue_mode(&self.dsn, &q), [4], "{point}");
        self.fired.insert(point);
    }

    /// A point in the end of a pop that rolls back (the whole transaction, or to a
    /// savepoint): deferred, then put back: every message is delivered.
    fn on_pop_abort(&mut self, point: &'static str, savepoint: bool) {
        let mut s = Session::open(&self.dsn);
        let q = unique("fp");
        for n in 1..=3 {
            s.push(&q, "p", n);
        }
        s.arm(&format!("{point}:2"));
        s.sql("BEGIN");
        if savepoint {
            s.sql("SAVEPOINT a");
        }
        assert_eq!(s.c.query("SELECT 1 FROM queen.pop($1, batch => 10)", &[&q]).unwrap().len(), 3);
        s.sql(if savepoint { "ROLLBACK TO SAVEPOINT a; COMMIT" } else { "ROLLBACK" });
        assert!(s.deferred(), "{point}: the end was deferred");
        s.disarm();
        s.settle();
        assert_eq!(queue_mode(&self.dsn, &q), [1, 2, 3], "{point}");
        self.fired.insert(point);
    }

    /// A point in the end of a push that commits: deferred; until the session's next call
    /// the partition's readable end waits (readers stop before the message, nothing is
    /// skipped), then the message is delivered.
    fn on_push_commit(&mut self, point: &'static str) {
        let mut s = Session::open(&self.dsn);
        let q = unique("fp");
        s.push(&q, "p", 1);
        assert_eq!(queue_mode(&self.dsn, &q), [1]);
        s.arm(&format!("{point}:2"));
        s.push(&q, "p", 2);
        assert!(s.deferred(), "{point}: the end was deferred");
        s.disarm();
        s.push(&q, "p", 3); // settles first
        assert_eq!(queue_mode(&self.dsn, &q), [2, 3], "{point}");
        self.fired.insert(point);
    }

    /// A point in the end of a push that rolls back (the whole transaction, or to a
    /// savepoint while the transaction commits another push).
    fn on_push_abort(&mut self, point: &'static str, savepoint: bool) {
        let mut s = Session::open(&self.dsn);
        let q = unique("fp");
        s.push(&q, "p", 1);
        s.arm(&format!("{point}:2"));
        s.sql("BEGIN");
        if savepoint {
            s.sql("SAVEPOINT a");
        }
        s.push(&q, "p", 2);
        if savepoint {
            s.sql("ROLLBACK TO SAVEPOINT a");
            s.disarm();
            s.push(&q, "p", 3);
            s.sql("COMMIT");
        } else {
            s.sql("ROLLBACK");
            s.disarm();
        }
        assert!(s.deferred(), "{point}: the end was deferred");
        s.settle();
        s.push(&q, "p", 4);
        let want: &[i32] = if savepoint { &[1, 3, 4] } else { &[1, 4] };
        assert_eq!(queue_mode(&self.dsn, &q), want, "{point}");
        self.fired.insert(point);
    }

    /// A point in forgetting a dropped group's lanes at commit: deferred, then done; the
    /// group, created again, starts afresh (a lane left behind would skip its messages).
    fn on_drop_group(&mut self, point: &'static str) {
        let mut s = Session::open(&self.dsn);
        let q = unique("fp");
        for n in 1..=2 {
            s.push(&q, "p", n);
        }
        assert_eq!(drain(&self.dsn, &q, "g"), [1, 2]);
        s.arm(&format!("{point}:2"));
        let dropped: serde_json::Value = s.c.query_one("SELECT queen.drop_group($1, 'g')", &[&q]).unwrap().get(0);
        assert_eq!(dropped["dropped"], true);
        assert!(s.deferred(), "{point}: the end was deferred");
        s.disarm();
        s.settle();
        assert_eq!(drain(&self.dsn, &q, "g"), [1, 2], "{point}: the group starts afresh");
        self.fired.insert(point);
    }

    /// A point in dropping a partition (the offset registry's part of the drop): the drop
    /// fails and the partition stays, with its offsets; dropped later, its name starts
    /// afresh.
    fn on_drop_partition(&mut self, point: &'static str) {
        let mut s = Session::open(&self.dsn);
        let q = unique("fp");
        s.push(&q, "p", 1);
        assert_eq!(queue_mode(&self.dsn, &q), [1]);
        s.arm(point);
        is_fault(s.c.query("SELECT queen.drop_partition($1, 'p')", &[&q]), point);
        s.disarm();
        s.push(&q, "p", 2);
        let offsets = |s: &mut Session| -> Vec<i64> {
            let rows = s.c.query("SELECT msg_offset FROM queen.pop($1, batch => 10, auto_ack => true)", &[&q]).unwrap();
            rows.iter().map(|r| r.get(0)).collect()
        };
        assert_eq!(offsets(&mut s), [2], "{point}: the partition stayed");
        let r: serde_json::Value = s.c.query_one("SELECT queen.drop_partition($1, 'p')", &[&q]).unwrap().get(0);
        assert_eq!(r["dropped"], true, "{r}");
        s.push(&q, "p", 7);
        assert_eq!(offsets(&mut s), [1], "{point}: a new partition");
        self.fired.insert(point);
    }

    /// A point inside removing an entry of a registry's hash table (it fires when the
    /// removal moves a later entry up): new lanes (pops) or new partitions (pushes), one
    /// at a time, past a full table, so that entries are evicted. One call fails; every
    /// other one delivered or stored its messages, and nothing is delivered twice.
    fn on_evictions(&mut self, point: &'static str, lanes: bool) {
        let mut s = Session::open(&self.dsn);
        let q = unique("fp");
        let n = 150;
        if lanes {
            spread(&mut s.c, &q, n);
        }
        s.arm(point);
        let (mut ok, mut failed) = (Vec::new(), Vec::new());
        for k in 1..=n {
            let p = format!("p{k}");
            let r = if lanes {
                s.c.query("SELECT (payload)::int FROM queen.pop($1, 'g', partition => $2, auto_ack => true)", &[&q, &p])
                    .map(|rows| rows.iter().map(|r| r.get::<_, i32>(0)).collect::<Vec<_>>())
            } else {
                s.c.query("SELECT 1 FROM queen.push($1, to_jsonb($2::int), $3)", &[&q, &k, &p]).map(|_| vec![k])
            };
            match r {
                Ok(got) => ok.extend(got),
                Err(e) => {
                    is_fault::<()>(Err(e), point);
                    failed.push(k);
                }
            }
        }
        s.disarm();
        assert_eq!(failed.len(), 1, "{point} fired once in {n} calls: {failed:?}");
        if lanes {
            // The failed pop delivered nothing: its message comes now, the others not again.
            assert_eq!(drain(&self.dsn, &q, "g"), failed, "{point}");
            assert_eq!(ok.len(), n as usize - 1);
        } else {
            let stored: Vec<i32> = (1..=n).filter(|k| !failed.contains(k)).collect();
            assert_eq!(queue_mode(&self.dsn, &q), stored, "{point}");
        }
        self.fired.insert(point);
    }

    /// A point in preparing a transaction that pushed: PREPARE fails, nothing is left
    /// prepared, nothing delivered.
    fn on_prepare(&mut self, point: &'static str) {
        let mut s = Session::open(&self.dsn);
        let q = unique("fp");
        s.push(&q, "p", 1);
        let gid = unique("fp");
        s.arm(point);
        s.sql("BEGIN");
        s.push(&q, "p", 2);
        is_fault(s.c.batch_execute(&format!("PREPARE TRANSACTION '{gid}'")), point);
        let _ = s.c.batch_execute("ROLLBACK");
        s.disarm();
        let left: i64 = s.c.query_one("SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1", &[&gid]).unwrap().get(0);
        assert_eq!(left, 0);
        s.push(&q, "p", 3);
        assert_eq!(queue_mode(&self.dsn, &q), [1, 3], "{point}");
        self.fired.insert(point);
    }

    /// The same point in handing a savepoint's pushes to its transaction (RELEASE, inside
    /// PostgreSQL's subtransaction commit, where an ERROR would not be clean): the release
    /// goes on (the hand-over is skipped; reservations end by subtransaction order), and
    /// what the savepoint pushed commits with the transaction, or rolls back with a
    /// savepoint around it.
    fn on_release(&mut self, point: &'static str) {
        let mut s = Session::open(&self.dsn);
        let q = unique("fp");
        s.push(&q, "p", 1);
        s.sql("BEGIN; SAVEPOINT outer_sp; SAVEPOINT a");
        s.push(&q, "p", 2);
        s.arm(point);
        s.sql("RELEASE SAVEPOINT a");
        s.disarm();
        s.sql("SAVEPOINT b");
        s.push(&q, "p", 3);
        s.sql("RELEASE SAVEPOINT b");
        s.sql("ROLLBACK TO SAVEPOINT outer_sp");
        s.push(&q, "p", 4);
        s.sql("SAVEPOINT c");
        s.push(&q, "p", 5);
        s.arm(point);
        s.sql("RELEASE SAVEPOINT c");
        s.disarm();
        s.sql("COMMIT");
        s.push(&q, "p", 6);
        assert_eq!(queue_mode(&self.dsn, &q), [1, 4, 5, 6], "{point}");
    }
}

/// A fail point in one step of a database's maintenance worker (`retention.queue`,
/// `compaction.partition`), armed for its first two passes through the database's
/// settings: the failing step is counted as an error of its pass (`errors_metric`), and
/// the pass goes on and does its work later: every segment goes (the messages were
/// consumed; retention deletes them, compaction merges them and retention then deletes
/// the merged ones).
fn worker_step_fails_and_recovers(admin_dsn: &str, point: &str, errors_metric: &str) {
    let name = format!("qfp_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut admin = Client::connect(admin_dsn, NoTls).unwrap();
    admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    admin.batch_execute(&format!("ALTER DATABASE {name} SET queen.failpoint = '{point}:2'")).unwrap();
    let mut c = Client::connect(&format!("{admin_dsn} dbname={name}"), NoTls).unwrap();
    // Single pushes go to the fresh tier (compaction's work), and everything is consumed
    // at once (retention's).
    c.batch_execute(
        "CREATE EXTENSION queen;
         SELECT queen.configure('r', retention => 1);
         SELECT count(*) FROM queen.push('r', '1', 'a');
         SELECT count(*) FROM queen.push('r', '2', 'b');
         SELECT count(*) FROM queen.pop('r', batch => 10, max_partitions => 2, auto_ack => true);",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let errors: f64 = c
            .query_opt("SELECT value FROM queen.metrics('maintenance') WHERE metric = $1", &[&errors_metric])
            .unwrap()
            .map_or(0.0, |r| r.get(0));
        let left: i64 = c
            .query_one(
                "SELECT (SELECT count(*) FROM queen.segments) + (SELECT count(*) FROM queen.fresh_segments)",
                &[],
            )
            .unwrap()
            .get(0);
        if errors >= 1.0 && left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{point}: {errors_metric} {errors}, segments left {left}");
        thread::sleep(Duration::from_millis(300));
    }
    drop(c);
    admin.batch_execute(&format!("DROP DATABASE {name}")).unwrap();
}

fn start_time(dsn: &str) -> std::time::SystemTime {
    Client::connect(dsn, NoTls).unwrap().query_one("SELECT pg_postmaster_start_time()", &[]).unwrap().get(0)
}

fn server_panics() -> usize {
    let dir = std::env::var("QUEEN_TEST_DIR").unwrap();
    let log = std::fs::read(format!("{dir}/server.log")).unwrap_or_default();
    String::from_utf8_lossy(&log).lines().filter(|l| l.contains("PANIC:")).count()
}

#[test]
fn every_fail_point_fires_and_nothing_is_lost() {
    let admin_dsn = std::env::var("QUEEN_TEST_DSN").expect("QUEEN_TEST_DSN (set by make integration)");
    let dsn = own_database();
    use_database(dsn.clone());
    let panics = server_panics();

    let _small = Settings::apply(
        &admin_dsn,
        &[
            ("queen.tracked_lanes", "64"),
            ("queen.max_leases", "32"),
            ("queen.tracked_partitions", "32"),
            ("queen.retention_interval", "1"),
        ],
    );
    let started = start_time(&dsn);
    let mut run = Run { dsn: dsn.clone(), fired: BTreeSet::new() };

    // Phase 1: the other backends (the harness) push and consume meanwhile.
    let mut cfg = Config::from_env(0, 2, 0);
    cfg.partitions = 8;
    cfg.batch_max = 20;
    cfg.single_share = 0.3;
    cfg.retention = 1;
    cfg.rollback_acks = true;
    cfg.duration = Some(Duration::from_secs(15));
    cfg.max_backlog = 1_000;
    cfg.deadline = Duration::from_secs(300);
    let others = thread::spawn(move || harness::run(&cfg));

    for p in ["lanes.begin_load", "lanes.finish_load", "lanes.lock", "lanes.set", "lanes.chain", "lanes.cursor"] {
        run.on_pop(p);
    }
    for p in ["offsets.begin_load", "offsets.finish_load", "offsets.reserve", "offsets.wrote"] {
        run.on_push(p);
    }
    for p in ["lanes.unlock", "xact.commit.lanes"] {
        run.on_pop_commit(p);
    }
    run.on_pop_abort("xact.abort.lanes", false);
    run.on_pop_abort("xact.subabort.lanes", true);
    for p in ["offsets.finish", "xact.commit.offsets"] {
        run.on_push_commit(p);
    }
    run.on_push_abort("xact.abort.offsets", false);
    run.on_push_abort("xact.subabort.offsets", true);
    run.on_push_abort("offsets.subxact", true);
    run.on_release("offsets.subxact");
    run.on_prepare("offsets.prepare");
    run.on_drop_group("lanes.forget");
    run.on_drop_partition("offsets.drop");
    run.on_evictions("lanes.remove", true);
    run.on_evictions("offsets.remove", false);
    worker_step_fails_and_recovers(&admin_dsn, "retention.queue", "maintenance_retention_errors");
    run.fired.insert("retention.queue");
    worker_step_fails_and_recovers(&admin_dsn, "compaction.partition", "maintenance_compaction_errors");
    run.fired.insert("compaction.partition");

    let report = others.join().expect("the harness thread");
    eprintln!(
        "harness beside the fail points: {} committed, {} delivered, {} lost, {} skipped, {} duplicated after a commit, {} deferred ends",
        report.committed, report.delivered, report.lost, report.skipped, report.duplicated_after_commit, report.deferred_ends
    );
    report.assert_clean();
    assert!(report.committed > 0);

    // Phase 2, alone: the points that need full tables. The worker's retention passes
    // (retention, rotation, partition expiry) wait meanwhile: only these calls change the
    // tables.
    let mut s = Session::open(&dsn);
    s.sql("ALTER SYSTEM SET queen.retention_interval = 3600");
    s.sql("SELECT pg_reload_conf()");
    thread::sleep(Duration::from_millis(500));

    // lanes.evict: more lanes than the table holds, then one more.
    let q = unique("fp-evict");
    spread(&mut s.c, &q, 80);
    assert_eq!(drain(&dsn, &q, "g").len(), 80);
    s.arm("lanes.evict");
    is_fault(s.c.query("SELECT 1 FROM queen.pop($1, 'h', batch => 1)", &[&q]), "lanes.evict");
    s.disarm();
    assert_eq!(drain(&dsn, &q, "h"), (1..=80).collect::<Vec<_>>(), "lanes.evict");
    assert_eq!(drain(&dsn, &q, "g"), Vec::<i32>::new(), "lanes.evict: g's cursors survived its lanes' evictions");
    run.fired.insert("lanes.evict");

    // lanes.sweep: a table full of leases that have expired; the next lease sweeps them.
    let q = unique("fp-sweep");
    spread(&mut s.c, &q, 40);
    // Every lane of the queue in the registry first (status loads them), so that the pop
    // below loads nothing: no eviction makes room before it.
    s.sql(&format!("SELECT count(*) FROM queen.status('{q}')"));
    // The lease table is the cluster's: something else (another database's worker, a lane
    // forgotten) may free a slot between the fill and the pop. Then
    // the pop finds room without a sweep, takes a 1 s lease, and the round is tried again.
    let mut swept = false;
    for _round in 0..5 {
        let leased = fill_leases(&mut s.c, &q, 40, 1);
        assert!((1..40).contains(&leased.len()), "the lease table filled up: {}", leased.len());
        let free = (1..=40).map(|k| format!("p{k}")).find(|p| !leased.contains(p)).unwrap();
        thread::sleep(Duration::from_millis(1500));
        // A lane with no lease of its own (a lane whose lease expired would give its slot
        // back): its new lease needs the sweep of the others' expired ones.
        s.arm("lanes.sweep");
        let r = s.c.query("SELECT 1 FROM queen.pop($1, batch => 1, partition => $2, lease_seconds => 1)", &[&q, &free]);
        s.disarm();
        match r {
            Ok(_) => thread::sleep(Duration::from_millis(1100)),
            Err(e) => {
                is_fault(Err::<(), _>(e), "lanes.sweep");
                swept = true;
                break;
            }
        }
    }
    assert!(swept, "lanes.sweep: in five rounds, a pop always found a free lease slot");
    assert_eq!(queue_mode(&dsn, &q), (1..=40).collect::<Vec<_>>(), "lanes.sweep");
    run.fired.insert("lanes.sweep");

    // lanes.put_back: a transaction ends its lease (an ack asking for a retry), claims the
    // lane again under a second lease and ends that one too: the first lease has gone
    // with its last lane (an ended lease stays only while its lane is not claimed again),
    // and the second with the second ack. While it is open the lease table fills up; it
    // rolls back, and the first lease cannot be chained again.
    let q = unique("fp-putback");
    s.push(&q, "p", 1);
    const POP: &str = "SELECT lease_id, partition_id, msg_offset FROM queen.pop($1, lease_seconds => 2)";
    const RETRY: &str = "SELECT queen.ack($1, $2, $3, 'retry')";
    let first = s.c.query_one(POP, &[&q]).unwrap();
    let lease: uuid::Uuid = first.get(0);
    s.arm("lanes.put_back:2");
    s.sql("BEGIN");
    s.c.execute(RETRY, &[&lease, &first.get::<_, uuid::Uuid>(1), &first.get::<_, i64>(2)]).unwrap();
    let again = s.c.query_one(POP, &[&q]).unwrap();
    s.c.execute(RETRY, &[&again.get::<_, uuid::Uuid>(0), &again.get::<_, uuid::Uuid>(1), &again.get::<_, i64>(2)])
        .unwrap();
    let mut filler = Client::connect(&dsn, NoTls).unwrap();
    let fq = unique("fp-fill");
    spread(&mut filler, &fq, 40);
    let filled = fill_leases(&mut filler, &fq, 40, 30).len();
    assert!(filled < 40, "the lease table filled up");
    s.sql("ROLLBACK");
    assert!(s.deferred(), "lanes.put_back: the end was deferred");
    s.disarm();
    s.settle();
    // The lane lost its lease (as if it expired): its message is delivered again.
    thread::sleep(Duration::from_millis(2100));
    assert_eq!(queue_mode(&dsn, &q), [1], "lanes.put_back");
    assert_eq!(queue_mode(&dsn, &fq).len(), 40 - filled, "the filler's unleased messages");
    run.fired.insert("lanes.put_back");

    // Every point fired (each scenario adds its point once it saw it fire).
    let all: BTreeSet<&str> = FAIL_POINTS.iter().copied().collect();
    assert_eq!(run.fired, all, "fail points this test does not fire");
    // The server never restarted (a PANIC would have) and logged no PANIC.
    assert_eq!(start_time(&dsn), started, "the server restarted");
    assert_eq!(server_panics(), panics, "PANIC in the server log");
}
