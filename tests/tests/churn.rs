//! Partition churn is bounded: partitions created, consumed and left idle are dropped by
//! the background worker (`configure(partition_idle_ttl)`), with their lanes, journal and
//! dedup entries, so that after VACUUM queen's tables are back to their size before; and
//! dedup entries expire by time even in a partition that stays.
//! Size: QUEEN_CHURN_PARTITIONS (default 100,000; `make integration` runs 30,000 to keep
//! `make test` within its 20 minutes).

use std::time::{Duration, Instant};

use postgres::Client;

const TABLES: &[&str] = &[
    "partitions",
    "lanes",
    "dedup",
    "segments_0",
    "segments_1",
    "fresh_segments_0",
    "fresh_segments_1",
    "lane_journal_0",
    "lane_journal_1",
];

/// The heap size of each of queen's tables, after a VACUUM FULL.
fn sizes(c: &mut Client) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for t in TABLES {
        // VACUUM FULL: it waits for its lock, where a plain VACUUM gives up truncating when
        // another session wants the table (the worker's compaction reads the fresh tier
        // every second: CI saw 11 MB of empty pages kept for a whole minute that way). The
        // pages a plain VACUUM keeps are free for reuse; what this measures is what holds
        // rows.
        c.batch_execute(&format!("VACUUM FULL queen.{t}")).unwrap();
        let size: i64 = c.query_one(&format!("SELECT pg_relation_size('queen.{t}')"), &[]).unwrap().get(0);
        out.push((t.to_string(), size));
    }
    out
}

fn count(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

#[test]
fn partitions_created_consumed_and_expired_leave_nothing_behind() {
    let n: i64 = std::env::var("QUEEN_CHURN_PARTITIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    queen_it::use_database(queen_it::own_database());
    let mut c = queen_it::connect();
    let before = sizes(&mut c);
    c.batch_execute(
        "SELECT queen.configure('churn', partition_idle_ttl => '1 s', dedup_window => 1);
         SELECT queen.create_group('churn', 'g');",
    )
    .unwrap();
    let t0 = Instant::now();
    // One message per partition, each with a producer transaction id (a dedup entry).
    for chunk in (0..n).step_by(1000) {
        c.execute(
            "SELECT count(*) FROM queen.push_batch('churn', (SELECT jsonb_agg(jsonb_build_object(
                 'partition', 'c' || i, 'payload', i, 'transactionId', 't' || i))
               FROM generate_series($1::int8, least($1::int8 + 999, $2::int8 - 1)) i))",
            &[&chunk, &n],
        )
        .unwrap();
    }
    let pushed = t0.elapsed();
    assert_eq!(count(&mut c, "SELECT count(*) FROM queen.partitions"), n);
    let mut consumed = 0i64;
    // Every pop takes all it may: the worker, checking idle partitions meanwhile, locks
    // the lanes only of those that look consumed, never of one a pop would take (a pop
    // passes over a lane another transaction holds).
    while consumed < n {
        let got = c
            .query(
                "SELECT 1 FROM queen.pop('churn', 'g', batch => 2000, max_partitions => 2000, auto_ack => true)",
                &[],
            )
            .unwrap()
            .len() as i64;
        assert_eq!(got, (n - consumed).min(2000), "a pop with {} left", n - consumed);
        consumed += got;
    }
    let popped = t0.elapsed();
    // The worker drops them all once idle for a second.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let left = count(&mut c, "SELECT count(*) FROM queen.partitions");
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} partitions left");
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("{n} partitions: pushed in {pushed:?}, consumed by {popped:?}, expired by {:?}", t0.elapsed());
    for t in ["queen.lanes", "queen.dedup", "queen.segments", "queen.fresh_segments"] {
        assert_eq!(count(&mut c, &format!("SELECT count(*) FROM {t}")), 0, "{t} keeps rows");
    }
    // The journal empties within a few rounds.
    let deadline = Instant::now() + Duration::from_secs(30);
    while queen_it::journal_entries(&mut c) > 0 {
        assert!(Instant::now() < deadline, "the lane journal kept entries");
        std::thread::sleep(Duration::from_millis(300));
    }
    // VACUUM FULL gives an emptied table's pages back; allow a page or two.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let after = sizes(&mut c);
        let grown: Vec<String> = before
            .iter()
            .zip(&after)
            .filter(|((_, b), (_, a))| *a > *b + 16_384)
            .map(|((t, b), (_, a))| format!("queen.{t}: {a} bytes after, {b} before"))
            .collect();
        if grown.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{}", grown.join("; "));
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The dedup entries `queue` holds.
fn dedup_entries(c: &mut Client, queue: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM queen.dedup d JOIN queen.partitions p USING (partition_id)
           JOIN queen.queues q USING (queue_id) WHERE q.name = $1",
        &[&queue],
    )
    .unwrap()
    .get(0)
}

#[test]
fn dedup_entries_expire_by_time_in_a_partition_that_stays() {
    let mut c = queen_it::connect();
    let queue = queen_it::unique("dd");
    c.execute("SELECT queen.configure($1, dedup_window => 1)", &[&queue]).unwrap();
    c.execute("SELECT count(*) FROM queen.push($1, '1', transaction_id => 'once')", &[&queue]).unwrap();
    let entries = |c: &mut Client| dedup_entries(c, &queue);
    assert_eq!(entries(&mut c), 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while entries(&mut c) > 0 {
        assert!(Instant::now() < deadline, "the dedup entry outlived its window");
        std::thread::sleep(Duration::from_millis(300));
    }
    // The partition (and its message) stays.
    let n = c.query("SELECT 1 FROM queen.pop($1, auto_ack => true)", &[&queue]).unwrap().len();
    assert_eq!(n, 1);
}

#[test]
fn dedup_entries_go_once_the_window_is_set_to_0() {
    // Entries recorded under a window stay useless once dedup is turned off; the worker's
    // expiry visits every queue that holds entries, whatever its window (on the old code
    // it skipped a queue with window 0, and its entries stayed for good).
    let mut c = queen_it::connect();
    let queue = queen_it::unique("dd0");
    c.execute("SELECT queen.configure($1, dedup_window => 3600)", &[&queue]).unwrap();
    c.execute(
        "SELECT count(*) FROM generate_series(1, 20) i, LATERAL queen.push($1, to_jsonb(i), transaction_id => 'id-' || i)",
        &[&queue],
    )
    .unwrap();
    let entries = |c: &mut Client| dedup_entries(c, &queue);
    assert_eq!(entries(&mut c), 20);
    c.execute("SELECT queen.configure($1, dedup_window => 0)", &[&queue]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while entries(&mut c) > 0 {
        assert!(Instant::now() < deadline, "dedup entries stayed after the window was set to 0");
        std::thread::sleep(Duration::from_millis(300));
    }
    let n = c.query("SELECT 1 FROM queen.pop($1, batch => 100, auto_ack => true)", &[&queue]).unwrap().len();
    assert_eq!(n, 20, "the messages stay");
}

/// A queue with more idle partitions that hold messages than one expiry step examines
/// (the worker's page: 1,000 lanes, here one group's) still gets its consumed ones dropped:
/// each step goes on from the last. The worker reads the partitions in id order, so the
/// ones that keep their message are the first `KEPT` by id: on the old code every step
/// read those again and dropped nothing.
#[test]
fn consumed_partitions_behind_many_that_hold_messages_are_dropped() {
    const KEPT: i64 = 1200; // more than a page
    const CONSUMED: i64 = 1300;
    let mut c = queen_it::connect();
    let queue = queen_it::unique("behind");
    let count_partitions = |c: &mut Client| -> i64 {
        c.query_one(
            "SELECT count(*) FROM queen.partitions p JOIN queen.queues q USING (queue_id) WHERE q.name = $1",
            &[&queue],
        )
        .unwrap()
        .get(0)
    };
    c.execute("SELECT queen.configure($1, partition_idle_ttl => '1 s')", &[&queue]).unwrap();
    c.execute("SELECT queen.create_group($1, 'g')", &[&queue]).unwrap();
    c.execute(
        "SELECT count(*) FROM queen.push_batch($1, (SELECT jsonb_agg(jsonb_build_object('partition', 'p' || i, 'payload', i))
           FROM generate_series(1, $2::int8) i))",
        &[&queue, &(KEPT + CONSUMED)],
    )
    .unwrap();
    let consumed: i64 = c
        .query_one(
            "SELECT count(*) FROM (SELECT p.name FROM queen.partitions p JOIN queen.queues q USING (queue_id)
                                    WHERE q.name = $1 ORDER BY p.partition_id OFFSET $2) p,
                    LATERAL queen.pop($1, 'g', partition => p.name, auto_ack => true) m",
            &[&queue, &KEPT],
        )
        .unwrap()
        .get(0);
    assert_eq!(consumed, CONSUMED);
    queen_it::eventually(60, || {
        let left = count_partitions(&mut c);
        assert!(left >= KEPT, "a partition that holds a message was dropped ({left} left)");
        if left == KEPT {
            Ok(())
        } else {
            Err(format!("{left} partitions left, {KEPT} hold messages"))
        }
    });
    // Nothing that was not consumed is lost.
    let rest = c
        .query("SELECT 1 FROM queen.pop($1, 'g', batch => 5000, max_partitions => 5000, auto_ack => true)", &[&queue])
        .unwrap()
        .len() as i64;
    assert_eq!(rest, KEPT);
}

/// Dead letters of a queue with a `dlq_retention` are deleted by the worker once they are
/// older than it, and not before; a queue without one keeps its own.
#[test]
fn dead_letters_go_after_the_dlq_retention_and_not_before() {
    let mut c = queen_it::connect();
    let trimmed = queen_it::unique("dlqr");
    let kept = queen_it::unique("dlqk");
    c.execute("SELECT queen.configure($1, dlq_retention => '3 s')", &[&trimmed]).unwrap();
    let file = |c: &mut Client, queue: &str, n: i64| {
        for i in 0..n {
            c.execute("SELECT count(*) FROM queen.push($1, to_jsonb($2::int8))", &[&queue, &i]).unwrap();
            let acked = c
                .query_one(
                    "SELECT (queen.ack(lease_id, partition_id, msg_offset, 'dlq') -> 'items' -> 0 ->> 'success')::bool
                       FROM queen.pop($1, batch => 1)",
                    &[&queue],
                )
                .unwrap();
            assert!(acked.get::<_, bool>(0));
        }
    };
    let dead = |c: &mut Client, queue: &str| -> i64 {
        c.query_one("SELECT count(*) FROM queen.dlq($1)", &[&queue]).unwrap().get(0)
    };
    let filed = Instant::now();
    file(&mut c, &trimmed, 3);
    file(&mut c, &kept, 2);
    assert_eq!((dead(&mut c, &trimmed), dead(&mut c, &kept)), (3, 2));
    // The worker's expiry runs every second here: within the retention they all stay.
    while filed.elapsed() < Duration::from_millis(2500) {
        assert_eq!(dead(&mut c, &trimmed), 3, "a dead letter went before its queue's dlq_retention");
        std::thread::sleep(Duration::from_millis(200));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while dead(&mut c, &trimmed) > 0 {
        assert!(Instant::now() < deadline, "dead letters outlived their queue's dlq_retention");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(dead(&mut c, &kept), 2, "a queue without a dlq_retention keeps its dead letters");
}
