//! Pushes under REPEATABLE READ whose snapshot predates a `delete_queue` or a
//! `drop_partition` that committed since: the transaction's lookups still find the queue
//! and the partition, so the push must look again before it writes, and fail with `40001`
//! (retry the transaction) rather than store a message nobody can read, or look the
//! partition up again for ever. (Found by a review; reproduced on the code before the fix.)

use postgres::Client;
use queen_it::{connect, unique};

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
    old.query("SELECT * FROM queen.pop($1, 'g')", &[&queue]).unwrap();
    let e = old.execute("SELECT count(*) FROM queen.push($1, '2', 'p1')", &[&queue]).unwrap_err();
    assert_eq!(sqlstate(&e), Some("40001"), "a push into the deleted queue: {e}");
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
