//! Pushes under REPEATABLE READ whose snapshot predates a `delete_queue` or a
//! `drop_partition` that committed since: the transaction's lookups still find the queue
//! and the partition, so the push must look again before it writes, and fail with `40001`
//! (retry the transaction) rather than store a message nobody can read, or look the
//! partition up again for ever. (Found by a review; reproduced on the code before the fix.)
//!
//! And a pop under REPEATABLE READ whose snapshot predates a compaction: it must still read
//! the fresh segments its snapshot sees, even when the offsets registry, reloaded since,
//! says the fresh tier holds nothing of the partition.
//!
//! And a dead-lettering ack under REPEATABLE READ whose snapshot predates the message: it
//! cannot read the message it is to file, so it fails with `40001` rather than take the
//! offset for a gap and move the cursor past a message it never filed. (Found by a
//! review; reproduced on the code before the fix.)

use postgres::{Client, NoTls};
use queen_it::{connect, unique, OwnCluster};

/// A session in a REPEATABLE READ transaction whose snapshot is taken now.
fn old_snapshot() -> Client {
    let mut old = connect();
    old.batch_execute(
        "BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL statement_timeout = '20s';
         SELECT count(*) FROM queen.queues",
    )
    .unwrap();
    old
}

fn sqlstate(e: &postgres::Error) -> Option<&str> {
    e.code().map(|c| c.code())
}

#[test]
fn a_push_into_a_queue_deleted_after_the_snapshot_is_a_serialization_failure() {
    let mut c = connect();
    let (queue, other) = (unique("rr_deleted"), unique("rr_other"));
    for q in [&queue, &other] {
        c.execute("SELECT count(*) FROM queen.push($1, '1', 'p1')", &[q]).unwrap();
    }
    // A group of the first queue, so that a pop of it below needs no group created.
    c.execute("SELECT count(*) FROM queen.pop($1, 'g', auto_ack => true)", &[&queue]).unwrap();
    let mut old = old_snapshot();
    c.execute("SELECT queen.delete_queue($1)", &[&queue]).unwrap();
    // A push to another queue first: its queue lock takes the delete's invalidation, so
    // that only a lookup made afresh can tell the first queue is gone. Then a pop of the
    // deleted queue, which reads with the snapshot's view and takes its queue lock: the
    // push after it finds that lock held.
    old.execute("SELECT count(*) FROM queen.push($1, '2', 'p1')", &[&other]).unwrap();
    // (Another invalidation of `queen.queues` between the two calls, from a test running
    // beside this one, makes the pop look the queue up afresh too, and it then raises the
    // same 40001 itself: the transaction ends there, and nothing was pushed either way.)
    match old.query("SELECT * FROM queen.pop($1, 'g')", &[&queue]) {
        Ok(_) => {
            let e = old.execute("SELECT count(*) FROM queen.push($1, '2', 'p1')", &[&queue]).unwrap_err();
            assert_eq!(sqlstate(&e), Some("40001"), "a push into the deleted queue: {e}");
        }
        Err(e) => assert_eq!(sqlstate(&e), Some("40001"), "a pop of the deleted queue: {e}"),
    }
    old.batch_execute("ROLLBACK").unwrap();
    let left: i64 = c.query_one("SELECT count(*) FROM queen.queues WHERE name = $1", &[&queue]).unwrap().get(0);
    assert_eq!(left, 0, "the queue stays deleted");
}

#[test]
fn a_push_into_a_partition_dropped_after_the_snapshot_is_a_serialization_failure() {
    let mut c = connect();
    let queue = unique("rr_dropped");
    c.execute("SELECT count(*) FROM queen.push($1, '1', 'pa')", &[&queue]).unwrap();
    c.execute("SELECT count(*) FROM queen.push($1, '1', 'pb')", &[&queue]).unwrap();
    let n = c
        .query("SELECT 1 FROM queen.pop($1, batch => 10, partition => 'pa', auto_ack => true)", &[&queue])
        .unwrap()
        .len();
    assert_eq!(n, 1);
    let mut old = old_snapshot();
    let dropped: serde_json::Value = c.query_one("SELECT queen.drop_partition($1, 'pa')", &[&queue]).unwrap().get(0);
    assert_eq!(dropped["dropped"], true, "{dropped}");
    // Before the fix this looked the partition up again for ever (until the timeout).
    let e = old.execute("SELECT count(*) FROM queen.push($1, '2', 'pa')", &[&queue]).unwrap_err();
    assert_eq!(sqlstate(&e), Some("40001"), "a push into the dropped partition: {e}");
    old.batch_execute("ROLLBACK").unwrap();
    // A new transaction creates the partition anew and pushes there.
    let (offset,): (i64,) =
        c.query_one("SELECT msg_offset FROM queen.push($1, '3', 'pa')", &[&queue]).map(|r| (r.get(0),)).unwrap();
    assert_eq!(offset, 1, "the new partition starts at offset 1");
}

/// A pop under REPEATABLE READ reads the fresh tier whatever the offsets registry says.
/// The registry's note of the fresh tier (`fresh_max`) is reloaded with a snapshot taken
/// now when a partition's slot comes back after an eviction; after a compaction that is
/// "nothing in the fresh tier". A snapshot older than the compaction still sees the small
/// segments and not the merged one: a read that skipped the fresh tier found neither, took
/// the offsets for gaps (a segment its snapshot sees holds them), and the auto-ack moved
/// the cursor over 301 messages. (Found by a review; the test fails when the read trusts
/// the registry under REPEATABLE READ.)
#[test]
fn a_pop_under_an_old_snapshot_reads_the_fresh_tier_after_a_compaction_and_a_registry_reload() {
    // Its own cluster: a small offsets registry (16 partitions) to evict the slot from,
    // and no background compaction, which would merge before the snapshot.
    let cluster = OwnCluster::start(5481, "queen.tracked_partitions = 16\nqueen.compaction_interval = 0\n");
    let mut admin = Client::connect(&cluster.dsn("postgres"), NoTls).unwrap();
    admin.batch_execute("CREATE DATABASE rr_fresh").unwrap();
    let dsn = cluster.dsn("rr_fresh");
    let mut c = Client::connect(&dsn, NoTls).unwrap();
    c.batch_execute("CREATE EXTENSION queen").unwrap();
    // Offset 1, then 300 more in five fresh segments (a push of fewer than 64 offsets to
    // one partition writes a small segment): a run long enough to merge at once.
    c.batch_execute(
        "SELECT count(*) FROM queen.push('rrq', '0'::jsonb, 'p');
         DO $$ BEGIN FOR i IN 1..5 LOOP
           PERFORM queen.push_batch('rrq', (SELECT jsonb_agg(jsonb_build_object('payload', i * 100 + j, 'partition', 'p'))
                                            FROM generate_series(1, 60) j));
         END LOOP; END $$;",
    )
    .unwrap();
    let fresh =
        |c: &mut Client| -> i64 { c.query_one("SELECT count(*) FROM queen.fresh_segments", &[]).unwrap().get(0) };
    assert_eq!(fresh(&mut c), 6, "six small segments before the snapshot");

    let mut old = Client::connect(&dsn, NoTls).unwrap();
    old.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM queen.queues").unwrap();

    let merged: serde_json::Value = c.query_one("SELECT queen.compact('rrq')", &[]).unwrap().get(0);
    assert_eq!(merged["messages"], 301, "{merged}");
    assert_eq!(fresh(&mut c), 0, "compaction emptied the fresh tier");
    // Pushes to 64 partitions of another queue: the registry's clock hand evicts every idle
    // slot, the partition's among them. The pop below loads it again, with a snapshot
    // taken then: the fresh tier holds nothing of it.
    for k in 0..64 {
        c.execute("SELECT count(*) FROM queen.push('rr_other', '1'::jsonb, $1)", &[&format!("o{k}")]).unwrap();
    }

    let offsets = |rows: Vec<postgres::Row>| rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<i64>>();
    let first =
        offsets(old.query("SELECT msg_offset FROM queen.pop('rrq', 'g', batch => 10, auto_ack => true)", &[]).unwrap());
    old.batch_execute("COMMIT").unwrap();
    assert_eq!(first, (1..=10).collect::<Vec<i64>>(), "the old snapshot's pop delivers what its fresh segments hold");
    let rest =
        offsets(c.query("SELECT msg_offset FROM queen.pop('rrq', 'g', batch => 1000, auto_ack => true)", &[]).unwrap());
    assert_eq!(rest, (11..=301).collect::<Vec<i64>>(), "a later pop delivers the rest, none skipped");
}

#[test]
fn a_dead_lettering_ack_under_an_old_snapshot_is_a_serialization_failure() {
    let mut c = connect();
    let queue = unique("rr_dlq_ack");
    c.execute("SELECT count(*) FROM queen.push($1, '1', 'p1')", &[&queue]).unwrap();
    // The group, past offset 1, before the snapshot.
    c.execute("SELECT count(*) FROM queen.pop($1, 'g', auto_ack => true)", &[&queue]).unwrap();
    let mut old = old_snapshot();
    // Offset 2, pushed and leased after the snapshot.
    c.execute("SELECT count(*) FROM queen.push($1, '2', 'p1')", &[&queue]).unwrap();
    let row = c.query_one("SELECT lease_id, partition_id, msg_offset FROM queen.pop($1, 'g')", &[&queue]).unwrap();
    let (lease, partition, offset): (uuid::Uuid, uuid::Uuid, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(offset, 2);
    // (A rotation of the segment generations committed after the snapshot, by a test
    // beside this one, raises the same 40001 one step earlier.)
    let e = old
        .query_one("SELECT queen.ack($1, $2, $3, 'dlq', 'boom')::text", &[&lease, &partition, &offset])
        .expect_err("the message is not in the snapshot: the ack cannot file it");
    assert_eq!(sqlstate(&e), Some("40001"), "{e}");
    old.batch_execute("ROLLBACK").unwrap();
    // Nothing moved: the cursor is before the message, and nothing was filed.
    let committed: i64 =
        c.query_one("SELECT committed FROM queen.status($1) WHERE consumer_group = 'g'", &[&queue]).unwrap().get(0);
    assert_eq!(committed, 1, "the cursor did not pass the message");
    // The same ack, retried as the 40001 asks, files it.
    c.query_one("SELECT queen.ack($1, $2, $3, 'dlq', 'boom')::text", &[&lease, &partition, &offset]).unwrap();
    let filed: Vec<(String, String)> = c
        .query("SELECT data::text, error_message FROM queen.dlq($1, 'g')", &[&queue])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(filed, vec![("2".to_string(), "boom".to_string())], "the dead letter holds the message");
}

/// The other side: a gap for good (a push that rolled back) is passed by a dead-lettering
/// ack under REPEATABLE READ as under READ COMMITTED: nothing to file, the cursor moves.
#[test]
fn a_dead_lettering_ack_under_repeatable_read_passes_a_gap() {
    let mut c = connect();
    let queue = unique("rr_dlq_gap");
    c.execute("SELECT count(*) FROM queen.push($1, '1', 'p1')", &[&queue]).unwrap();
    c.batch_execute("BEGIN").unwrap();
    c.execute("SELECT count(*) FROM queen.push($1, '2', 'p1')", &[&queue]).unwrap();
    c.batch_execute("ROLLBACK").unwrap();
    c.execute("SELECT count(*) FROM queen.push($1, '3', 'p1')", &[&queue]).unwrap();
    let rows =
        c.query("SELECT lease_id, partition_id, msg_offset FROM queen.pop($1, 'g', batch => 10)", &[&queue]).unwrap();
    let offsets: Vec<i64> = rows.iter().map(|r| r.get(2)).collect();
    assert_eq!(offsets, vec![1, 3], "offset 2 is a gap");
    let (lease, partition): (uuid::Uuid, uuid::Uuid) = (rows[0].get(0), rows[0].get(1));
    let mut rr = old_snapshot();
    let report: serde_json::Value =
        rr.query_one("SELECT queen.ack($1, $2, 2::int8, 'dlq', 'boom')", &[&lease, &partition]).unwrap().get(0);
    rr.batch_execute("COMMIT").unwrap();
    let item = &report["items"][0];
    assert_eq!(item["success"], serde_json::Value::Bool(true), "{report}");
    assert!(item["error"].as_str().is_some_and(|e| e.starts_with("no message at this offset")), "{report}");
    let committed: i64 =
        c.query_one("SELECT committed FROM queen.status($1) WHERE consumer_group = 'g'", &[&queue]).unwrap().get(0);
    assert_eq!(committed, 2, "the cursor passed the gap");
    let filed: i64 = c.query_one("SELECT count(*) FROM queen.dlq($1, 'g')", &[&queue]).unwrap().get(0);
    assert_eq!(filed, 0, "nothing was filed for a gap");
}
