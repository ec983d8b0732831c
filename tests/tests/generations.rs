//! The segment generations (issue 13): while a snapshot holds the xmin horizon back,
//! retention's rotations keep the segment tables bounded, and a rotation never changes what
//! an offset holds, for readers whose snapshot began before it either. Each test has a
//! database of its own (the generations are per database), whose maintenance worker does
//! not rotate (`queen.rotation_min_size = -1` for the database): the rotations are the
//! test's own `queen.retain()` calls, with the default minimum.

use std::time::Duration;

use postgres::{Client, NoTls};
use queen_it::harness::{run, Config};
use queen_it::own_database_with;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// A database of the test's own where only the test's sessions rotate (see above).
fn database_without_worker_rotation() -> String {
    own_database_with(&["queen.rotation_min_size = -1"])
}

/// A session of that database that rotates at the default minimum, written out: `SET ...
/// TO DEFAULT` would give the database's -1. Keep it equal to `MIN_ROTATE_BYTES` in
/// `core/src/generations.rs`.
fn connect_to(dsn: &str) -> Client {
    let mut c = Client::connect(dsn, NoTls).expect("connect to the test's own database");
    c.batch_execute("SET queen.rotation_min_size = '1MB'").unwrap();
    c
}

/// Bytes of every segment table (both tiers, both generations: heap, TOAST, indexes).
fn segment_bytes(c: &mut Client) -> i64 {
    c.query_one(
        "SELECT sum(pg_total_relation_size(c.oid))::int8 FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'queen' AND c.relkind = 'r' AND c.relname ~ '^(fresh_)?segments_[01]$'",
        &[],
    )
    .unwrap()
    .get(0)
}

/// `n` items for `push_batch`, numbered from `from`, each with ~2 kB of payload that does
/// not compress much.
fn items(queue: &str, from: i64, n: i64, rng: &mut impl Rng) -> Value {
    Value::Array(
        (from..from + n)
            .map(|i| {
                let pad: String = (0..2000).map(|_| char::from(b'a' + rng.gen_range(0..26u8))).collect();
                json!({"queue": queue, "payload": {"i": i, "pad": pad}})
            })
            .collect(),
    )
}

fn push(c: &mut Client, items: &Value) {
    c.execute("SELECT count(*) FROM queen.push_batch($1)", &[items]).unwrap();
}

/// Pops `group`'s messages of `queue` until none is left; returns their numbers in order.
fn drain(c: &mut Client, queue: &str, group: &str) -> Vec<i64> {
    let mut got = Vec::new();
    loop {
        let rows = c
            .query(
                "SELECT (payload->>'i')::int8 FROM queen.pop($1, $2, batch => 500, auto_ack => true)",
                &[&queue, &group],
            )
            .unwrap();
        if rows.is_empty() {
            return got;
        }
        got.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
    }
}

fn rotate(c: &mut Client) -> bool {
    c.query_one("SELECT (queen.retain()->>'generationRotated')::bool", &[]).unwrap().get(0)
}

/// Retention passes until one rotates the generations (20 s at most): a swap that finds
/// the oldest generation's tables busy for 150 ms (the worker's compaction, autovacuum)
/// backs off, as the worker's does, and a later pass rotates.
fn rotates_soon(c: &mut Client, which: &str) {
    queen_it::eventually(20, || if rotate(c) { Ok(()) } else { Err(format!("no {which}")) });
}

/// Ten rounds of ~3 MB pushed, consumed and past retention, while a REPEATABLE READ
/// transaction stays open: every round's rotation frees the round before last, so the
/// tables stay near two rounds' size. Without rotations (or with retention's DELETEs
/// alone) they would hold all ten: nothing deleted can be vacuumed under the snapshot.
#[test]
fn rotations_keep_the_segment_tables_bounded_under_a_held_snapshot() {
    let dsn = database_without_worker_rotation();
    let mut c = connect_to(&dsn);
    let mut held = connect_to(&dsn);
    held.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM queen.queues").unwrap();
    c.execute("SELECT queen.configure('bounded', retention => 1)", &[]).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let (rounds, per_round) = (10i64, 1500i64);
    let mut sizes = Vec::new();
    let mut rotations = 0;
    for round in 0..rounds {
        for k in 0..3 {
            push(&mut c, &items("bounded", round * per_round + k * 500 + 1, 500, &mut rng));
        }
        let got = drain(&mut c, "bounded", "g");
        let want: Vec<i64> = (round * per_round + 1..=(round + 1) * per_round).collect();
        assert_eq!(got, want, "round {round}: every message once, in order");
        // Past the queue's retention, then one retention pass (and rotation) over every queue.
        std::thread::sleep(Duration::from_millis(1100));
        rotations += usize::from(rotate(&mut c));
        sizes.push(segment_bytes(&mut c));
    }
    println!("segment tables after each round (bytes): {sizes:?}; rotations: {rotations}");
    assert!(rotations as i64 >= rounds - 1, "only {rotations} rotations in {rounds} rounds");
    // The snapshot is still held: nothing deleted could be vacuumed.
    let xmin_held: bool = c
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE state = 'idle in transaction' AND backend_xmin IS NOT NULL
                              AND datname = current_database())",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(xmin_held, "the snapshot was not held to the end");
    let round_bytes = sizes[0];
    let last = *sizes.last().unwrap();
    assert!(
        last <= 3 * round_bytes,
        "the segment tables grew to {last} bytes after {rounds} rounds of ~{round_bytes} bytes each"
    );
    let steady = sizes[3..].iter().max().unwrap();
    assert!(*steady <= 3 * round_bytes, "the tables kept growing: {sizes:?}");
    held.batch_execute("COMMIT").unwrap();
}

/// A REPEATABLE READ transaction whose snapshot predates a rotation sees the rotated
/// generation empty and the rows copied out of it not yet: its pop must not skip them
/// (it stops, as at any offset its snapshot cannot see), and a later transaction delivers
/// every message once, in order. `queen.seek` and `queen.compact` refuse to run under such
/// a snapshot, and an ack that dead-letters a message there fails with `40001`.
#[test]
fn a_snapshot_older_than_a_rotation_skips_nothing() {
    let dsn = database_without_worker_rotation();
    let mut c = connect_to(&dsn);
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    c.execute("SELECT queen.configure('churn', retention => 1)", &[]).unwrap();
    c.execute("SELECT queen.configure('keep')", &[]).unwrap();
    // 'keep' (no retention, never consumed yet): single pushes (the fresh tier) and a batch.
    for i in 1..=10i64 {
        c.execute("SELECT count(*) FROM queen.push('keep', jsonb_build_object('i', $1::int8))", &[&i]).unwrap();
    }
    let batch: Value = Value::Array((11..=110).map(|i| json!({"queue": "keep", "payload": {"i": i}})).collect());
    push(&mut c, &batch);
    // Compaction merges keep's single pushes once they are 10 s old (a slow machine gets
    // there before the old snapshot below), into the generation current then; a merged
    // row committed before that snapshot is not in the generation the second rotation
    // empties, stays visible to it, and its pop rightly delivers it. Holding keep's
    // partition row, as compaction and retention lock it (they skip a locked one), keeps
    // compaction off until the snapshot is taken.
    let mut hold = connect_to(&dsn);
    hold.batch_execute(
        "BEGIN; SELECT 1 FROM queen.partitions p JOIN queen.queues q USING (queue_id)
                 WHERE q.name = 'keep' FOR NO KEY UPDATE OF p",
    )
    .unwrap();
    // 'churn': ~3 MB, consumed and past retention.
    let churn = |c: &mut Client, rng: &mut rand::rngs::StdRng, from: i64| {
        for k in 0..3 {
            push(c, &items("churn", from + k * 500, 500, rng));
        }
        assert_eq!(drain(c, "churn", "g").len(), 1500);
        std::thread::sleep(Duration::from_millis(1100));
    };
    churn(&mut c, &mut rng, 1);
    // The first rotation only moves on (the other generation is empty): 'keep' and the
    // dead 'churn' rows stay where they are.
    rotates_soon(&mut c, "first rotation");
    // 111..120 come after it, in the new current generation: the old snapshot below sees
    // them (they committed before it), but not 1..110 once the second rotation has moved
    // them. A pop that stepped over what it cannot see would deliver these.
    for i in 111..=120i64 {
        c.execute("SELECT count(*) FROM queen.push('keep', jsonb_build_object('i', $1::int8))", &[&i]).unwrap();
    }
    let mut old = connect_to(&dsn);
    old.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM queen.queues").unwrap();
    hold.batch_execute("COMMIT").unwrap();
    churn(&mut c, &mut rng, 1501);
    // The second empties the generation holding 'keep': its rows are copied forward.
    rotates_soon(&mut c, "second rotation");
    let copied: i64 = c
        .query_one(
            "SELECT count(*) FROM queen.segments s JOIN queen.partitions p USING (partition_id)
               JOIN queen.queues q USING (queue_id) WHERE q.name = 'keep'",
            &[],
        )
        .unwrap()
        .get(0);
    let fresh: i64 = c
        .query_one(
            "SELECT count(*) FROM queen.fresh_segments s JOIN queen.partitions p USING (partition_id)
               JOIN queen.queues q USING (queue_id) WHERE q.name = 'keep'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(copied + fresh > 0, "keep's segments are gone");
    let generations: Vec<i16> = c
        .query(
            "SELECT DISTINCT s.generation FROM (SELECT partition_id, generation FROM queen.segments
                                                 UNION ALL SELECT partition_id, generation FROM queen.fresh_segments) s
               JOIN queen.partitions p USING (partition_id) JOIN queen.queues q USING (queue_id)
              WHERE q.name = 'keep'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(generations.len(), 1, "keep's rows are in one generation after the copy: {generations:?}");
    // The old snapshot cannot see 1..110 any more: its pop delivers nothing (it stops at
    // offset 1), and in particular not 111..120, which it can see.
    let early: Vec<i64> = old
        .query("SELECT (payload->>'i')::int8 FROM queen.pop('keep', 'g', batch => 1000, auto_ack => true)", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(early.is_empty(), "the old snapshot's pop stepped over moved rows: {early:?}");
    // A seek by time must find its message: under this snapshot it refuses, rather than
    // put the cursor past unread messages.
    old.batch_execute("SAVEPOINT s").unwrap();
    let seek = old.execute("SELECT queen.seek('keep', 'g', to_time => now() - interval '1 hour')", &[]).unwrap_err();
    assert_eq!(seek.code().map(|c| c.code()), Some("0A000"), "seek under REPEATABLE READ: {seek}");
    old.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    // An ack that dead-letters must find the message it files: under this snapshot offset 1
    // looks like a gap (its rows moved), and passing it as one would lose it for the group.
    // The lease is another group's, taken now by a session that sees the moved rows.
    let (lease, partition): (uuid::Uuid, uuid::Uuid) = c
        .query_one("SELECT lease_id, partition_id FROM queen.pop('keep', 'h', batch => 1)", &[])
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    let dead = old
        .execute("SELECT queen.ack($1, $2, 1, 'dlq', 'boom')", &[&lease, &partition])
        .expect_err("a dead-lettering ack under a snapshot older than the rotation");
    assert_eq!(dead.code().map(|c| c.code()), Some("40001"), "dead-lettering ack under REPEATABLE READ: {dead}");
    let said = dead.as_db_error().map(|e| e.message().to_string()).unwrap_or_default();
    assert!(said.contains("generations were rotated"), "the 40001 is the rotation's: {said}");
    old.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    let compact = old.execute("SELECT queen.compact()", &[]).unwrap_err();
    assert_eq!(compact.code().map(|c| c.code()), Some("0A000"), "compact under REPEATABLE READ: {compact}");
    old.batch_execute("ROLLBACK").unwrap();
    // A new transaction delivers all of it, every message once, in order.
    let all = drain(&mut c, "keep", "g");
    assert_eq!(all, (1..=120).collect::<Vec<_>>());
}

/// A pop whose messages were all in the fresh tier locks that tier alone; a later read of
/// the durable tier in the same transaction (here a later pop's) takes that tier's locks
/// after the fresh tier's, the opposite of a rotation's swap (durable, then fresh). When
/// the swap waits for the fresh tier meanwhile, the two wait for each other: the swap
/// gives up (at its `deadlock_timeout`, 50 ms, when it finds the cycle; at its
/// `lock_timeout`, 150 ms, at the latest) and the pop goes on. Nothing fails, and every
/// message is delivered once.
#[test]
fn a_pop_reading_the_durable_tier_after_the_fresh_one_outlasts_a_swap() {
    let dsn = database_without_worker_rotation();
    let mut c = connect_to(&dsn);
    let mut rng = rand::rngs::StdRng::seed_from_u64(19);
    // 'cold': a batch of 100, a durable segment of its own. 'filler': ~3 MB in the current
    // generation, so that a rotation is due. 'hot': single pushes, in the fresh tier (last,
    // so that compaction, which waits 10 s for runs this short, has not merged them).
    let batch: Value = Value::Array((1..=100).map(|i| json!({"queue": "cold", "payload": {"i": i}})).collect());
    push(&mut c, &batch);
    for k in 0..3 {
        push(&mut c, &items("filler", k * 500 + 1, 500, &mut rng));
    }
    for i in 1..=5i64 {
        c.execute("SELECT count(*) FROM queen.push('hot', jsonb_build_object('i', $1::int8))", &[&i]).unwrap();
    }
    let mut popper = connect_to(&dsn);
    popper.batch_execute("BEGIN").unwrap();
    assert_eq!(drain(&mut popper, "hot", "g"), (1..=5).collect::<Vec<_>>());
    let popper_pid: i32 = popper.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let durable_locks: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
              WHERE l.pid = $1 AND c.relname ~ '^segments'",
            &[&popper_pid],
        )
        .unwrap()
        .get(0);
    assert_eq!(durable_locks, 0, "a pop served by the fresh tier locked the durable tier");
    // The swap, in a session of its own: it locks the oldest generation's durable table,
    // then waits for its fresh table, which the pop's transaction holds. (It may wait
    // a moment for the durable table too, while the worker's compaction reads it.)
    let rotator = {
        let dsn = dsn.clone();
        std::thread::spawn(move || rotate(&mut connect_to(&dsn)))
    };
    let swap_waits = |c: &mut Client| -> bool {
        c.query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                             WHERE NOT l.granted AND l.mode = 'AccessExclusiveLock' AND c.relname ~ '^fresh_segments_[01]$'
                               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
            &[],
        )
        .unwrap()
        .get(0)
    };
    let started = std::time::Instant::now();
    let mut waits = false;
    while !waits && started.elapsed() < Duration::from_secs(20) && !rotator.is_finished() {
        waits = swap_waits(&mut c);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(waits, "the swap waited for the fresh tier, which the pop's transaction holds");
    // The durable tier now: this waits for the swap, until the swap gives up.
    let before = std::time::Instant::now();
    assert_eq!(drain(&mut popper, "cold", "g"), (1..=100).collect::<Vec<_>>());
    println!("the durable read took {:?} (the swap gives up at 50 ms, or at 150 ms)", before.elapsed());
    popper.batch_execute("COMMIT").unwrap();
    assert!(!rotator.join().unwrap(), "the swap gave up: the pop's transaction held the fresh tier");
    // With the pop's transaction over, the rotation goes through, and a new group gets
    // every message once.
    rotates_soon(&mut c, "rotation once the pop is over");
    for (queue, n) in [("hot", 5), ("cold", 100)] {
        assert!(drain(&mut c, queue, "g").is_empty(), "{queue}: group g took everything");
        assert_eq!(drain(&mut c, queue, "h"), (1..=n).collect::<Vec<_>>(), "{queue}: every message once, in order");
    }
}

/// The invariants harness while a REPEATABLE READ transaction holds the xmin horizon back
/// and a session rotates the generations as often as they are due
/// (`queen.rotation_min_size = 0`, `retention => 1`): live segments are copied forward
/// while pushes, pops, acks and compaction run. No loss, no skip, no duplicate beyond the
/// documented causes.
#[test]
fn the_invariants_hold_while_the_generations_rotate() {
    queen_it::use_database(database_without_worker_rotation());
    let mut cfg = Config::from_env(6_000, 3, 0);
    cfg.batch_max = 8;
    cfg.compactor = true;
    cfg.held_snapshot = true;
    cfg.retention = 1;
    cfg.rotator = true;
    let report = run(&cfg);
    println!("{report:#?}");
    assert!(report.pushed >= cfg.messages, "every pusher finished its share");
    assert!(report.rotations >= 2, "the segment generations rotated {} times during the run", report.rotations);
}
