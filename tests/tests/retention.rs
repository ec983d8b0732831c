//! The maintenance worker: with `shared_preload_libraries = 'queen'` each database where
//! queen is installed has one; it runs a retention pass every `queen.retention_interval`
//! seconds (the test cluster sets 1 second, scripts/test.conf), and compaction passes.
//! Consumed segments older than a queue's retention disappear without anybody calling
//! `queen.retain`; a queue without retention keeps its messages (compaction may merge
//! their segments, so messages stored are counted, not segments); small segments are
//! merged without anybody calling `queen.compact`.

use std::time::{Duration, Instant};

use postgres::Client;
use queen_it::{connect, unique};

/// Messages (offsets) stored for a queue, in segments of both tiers, and how many of those
/// segments are in the fresh tier.
fn stored(c: &mut Client, queue: &str) -> (i64, i64) {
    let row = c
        .query_one(
            "SELECT coalesce(sum(s.last_offset - s.first_offset + 1), 0)::int8, count(*) FILTER (WHERE s.fresh)
               FROM (SELECT partition_id, first_offset, last_offset, false AS fresh FROM queen.segments
                     UNION ALL
                     SELECT partition_id, first_offset, last_offset, true FROM queen.fresh_segments) s
               JOIN queen.partitions p USING (partition_id) JOIN queen.queues q USING (queue_id)
              WHERE q.name = $1",
            &[&queue],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

/// The offsets one auto-ack pop of up to 100 delivers to `group`.
fn auto_acked_offsets(c: &mut Client, queue: &str, group: &str) -> Vec<i64> {
    c.query("SELECT msg_offset FROM queen.pop($1, $2, batch => 100, auto_ack => true)", &[&queue, &group])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn worker_deletes_consumed_segments_past_the_retention() {
    let mut c = connect();
    // The worker starts with the server; until this database exists it exits and is
    // restarted (every 5 s), so give it a moment.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let workers: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE backend_type = 'queen maintenance' AND datname = current_database()",
                &[],
            )
            .unwrap()
            .get(0);
        if workers == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no maintenance worker is running (queen preloaded, scripts/test.conf)");
        std::thread::sleep(Duration::from_millis(200));
    }

    let (short, keep) = (unique("retained"), unique("kept"));
    c.execute("SELECT queen.configure($1, retention => 1)", &[&short]).unwrap();
    for q in [&short, &keep] {
        for i in 0..3 {
            c.execute("SELECT count(*) FROM queen.push($1, to_jsonb($2::int))", &[q, &i]).unwrap();
        }
        let n = c.query("SELECT 1 FROM queen.pop($1, batch => 10, auto_ack => true)", &[q]).unwrap().len();
        assert_eq!(n, 3);
    }
    assert_eq!(stored(&mut c, &short).0, 3);

    let deadline = Instant::now() + Duration::from_secs(30);
    while stored(&mut c, &short).0 > 0 {
        assert!(Instant::now() < deadline, "the worker did not delete the consumed segments within 30 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(stored(&mut c, &keep).0, 3, "a queue without retention keeps its messages");
    // queen.metrics() shows what the worker's passes freed, and when the last one ran.
    let m: Vec<(String, f64)> = c
        .query(
            "SELECT metric, value FROM queen.metrics()
              WHERE metric IN ('retention_freed_bytes_total', 'retention_last_run_timestamp_seconds')",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let get = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    assert!(get("retention_freed_bytes_total").is_some_and(|b| b > 0.0), "{m:?}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(get("retention_last_run_timestamp_seconds").is_some_and(|t| (now - t).abs() < 120.0), "{m:?}");

    // The queue works on: a new message after the deleted ones, and a new group starts
    // after what was deleted.
    c.execute("SELECT count(*) FROM queen.push($1, '42')", &[&short]).unwrap();
    let rows = c
        .query("SELECT msg_offset, payload::text FROM queen.pop($1, 'late', batch => 10, auto_ack => true)", &[&short])
        .unwrap();
    let got: Vec<(i64, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(got, vec![(4, "42".to_string())]);
}

/// Single pushes land in the fresh tier, one small segment each; the worker merges them
/// (after they linger: 10 s for a run this short) into one segment of the durable tier,
/// and a pop reads the same messages at the same offsets.
#[test]
fn worker_compacts_small_segments() {
    let mut c = connect();
    let queue = unique("compacted");
    for i in 0..5 {
        c.execute("SELECT count(*) FROM queen.push($1, to_jsonb($2::int))", &[&queue, &i]).unwrap();
    }
    assert_eq!(stored(&mut c, &queue), (5, 5), "five single pushes, five fresh segments");
    let deadline = Instant::now() + Duration::from_secs(40);
    while stored(&mut c, &queue).1 > 0 {
        assert!(Instant::now() < deadline, "the worker did not compact the fresh tier within 40 s");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(stored(&mut c, &queue), (5, 0));
    let rows = c
        .query("SELECT msg_offset, payload::text FROM queen.pop($1, batch => 10, auto_ack => true)", &[&queue])
        .unwrap();
    let got: Vec<(i64, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(got, (0..5).map(|i| (i as i64 + 1, i.to_string())).collect::<Vec<_>>());
}

/// `retain` decides what to delete from the groups and cursors it reads: under REPEATABLE
/// READ, a group created after the snapshot was invisible to it, and the pass deleted the
/// messages that group still had to read (an outside review reproduced it). It refuses
/// those levels (`0A000`), and the new group gets every message.
#[test]
fn retain_refuses_an_old_snapshot_and_a_group_created_since_keeps_its_messages() {
    let mut c = connect();
    let queue = unique("rr_retain");
    // (Long enough that the worker's own passes, every second, delete nothing before g2
    // exists, even on a slow machine.)
    c.execute("SELECT queen.configure($1, retention => 5)", &[&queue]).unwrap();
    c.execute("SELECT queen.create_group($1, 'g1')", &[&queue]).unwrap();
    for i in 1..=10 {
        c.execute("SELECT count(*) FROM queen.push($1, to_jsonb($2::int))", &[&queue, &i]).unwrap();
    }
    let n = c.query("SELECT 1 FROM queen.pop($1, 'g1', batch => 100, auto_ack => true)", &[&queue]).unwrap().len();
    assert_eq!(n, 10);
    // A snapshot taken while g1 is the only group, then g2 created (from the start): the
    // segments are younger than the retention, so nothing was deleted yet.
    let mut old = connect();
    old.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM queen.groups").unwrap();
    c.execute("SELECT queen.create_group($1, 'g2', 'all')", &[&queue]).unwrap();
    std::thread::sleep(Duration::from_millis(5500)); // past the retention
    let refused = old.query_one("SELECT queen.retain($1)", &[&queue]).unwrap_err();
    assert_eq!(refused.code().map(|s| s.code()), Some("0A000"), "retain under REPEATABLE READ: {refused}");
    old.batch_execute("ROLLBACK").unwrap();
    let got = auto_acked_offsets(&mut c, &queue, "g2");
    assert_eq!(got, (1..=10).collect::<Vec<i64>>(), "the group created after the old snapshot");
}

/// `seek(to_time)` takes the readable end from the offset registry (current) and searches
/// the segments: under REPEATABLE READ it missed messages pushed after the snapshot and put
/// the cursor past them, so they were never delivered (an outside review reproduced it).
/// It refuses those levels (`0A000`), and the messages are delivered.
#[test]
fn seek_refuses_an_old_snapshot_and_messages_pushed_since_are_delivered() {
    let mut c = connect();
    let queue = unique("rr_seek");
    c.execute("SELECT queen.create_group($1, 'g1')", &[&queue]).unwrap();
    for i in 1..=3 {
        c.execute("SELECT count(*) FROM queen.push($1, to_jsonb($2::int))", &[&queue, &i]).unwrap();
    }
    let n = c.query("SELECT 1 FROM queen.pop($1, 'g1', batch => 100, auto_ack => true)", &[&queue]).unwrap().len();
    assert_eq!(n, 3);
    let at: String = c.query_one("SELECT clock_timestamp()::text", &[]).unwrap().get(0);
    let mut old = connect();
    old.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM queen.groups").unwrap();
    for i in 4..=8 {
        c.execute("SELECT count(*) FROM queen.push($1, to_jsonb($2::int))", &[&queue, &i]).unwrap();
    }
    let refused =
        old.query_one("SELECT queen.seek($1, 'g1', to_time => $2::text::timestamptz)", &[&queue, &at]).unwrap_err();
    assert_eq!(refused.code().map(|s| s.code()), Some("0A000"), "seek under REPEATABLE READ: {refused}");
    old.batch_execute("ROLLBACK").unwrap();
    // Under READ COMMITTED the same seek sees them, and they are delivered.
    let moved: serde_json::Value =
        c.query_one("SELECT queen.seek($1, 'g1', to_time => $2::text::timestamptz)", &[&queue, &at]).unwrap().get(0);
    assert_eq!(moved["lanes"][0]["committed"], 3, "{moved}");
    let got = auto_acked_offsets(&mut c, &queue, "g1");
    assert_eq!(got, (4..=8).collect::<Vec<i64>>());
}
