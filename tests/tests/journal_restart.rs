//! The lane journal across an immediate stop: a lane acked without pause never has its
//! `queen.lanes` row updated (its newest cursor is always in the current journal table).
//! After a crash the registry starts empty and the worker goes on rotating the journal;
//! the cursor must survive those rotations although no session touches the lane until
//! they are done, and an ack rolled back to a savepoint must leave cursor and lease as
//! they were. A paused queue stays paused.

use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;
use queen_it::harness::cluster_immediate_restart;
use queen_it::{connect_retrying, unique};

fn committed(c: &mut Client, queue: &str) -> i64 {
    c.query_one("SELECT committed FROM queen.status($1)", &[&queue]).unwrap().get(0)
}

#[test]
fn a_hot_lanes_cursor_survives_a_crash_and_the_rotations_after_it() {
    let queue = unique("journal");
    let mut c = connect_retrying();
    c.execute(
        "SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', $1::text, 'payload', i))
                                                   FROM generate_series(1, 20000) i))",
        &[&queue],
    )
    .unwrap();
    // Ack 10 at a time, 50 times a second, for 7 s: several journal rounds (2 s each) with the lane never quiet.
    let t0 = Instant::now();
    let mut acked = 0i64;
    while t0.elapsed() < Duration::from_secs(7) {
        let rows = c.query("SELECT lease_id, msg_offset FROM queen.pop($1, batch => 10)", &[&queue]).unwrap();
        assert!(!rows.is_empty(), "the backlog lasts the whole test");
        let lease: uuid::Uuid = rows[0].get(0);
        c.execute("SELECT queen.ack($1)", &[&lease]).unwrap();
        acked = rows.iter().map(|r| r.get::<_, i64>(1)).max().unwrap();
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(committed(&mut c, &queue), acked);
    let row: i64 = c
        .query_one(
            "SELECT l.committed FROM queen.lanes l JOIN queen.queues q ON q.queue_id = l.queue_id WHERE q.name = $1",
            &[&queue],
        )
        .unwrap()
        .get(0);
    assert!(row < acked, "the hot lane's row was updated ({row} of {acked}): the test would prove nothing");
    // A paused queue (docs/functions.md#pause) stays paused across the crash.
    let paused = unique("paused");
    c.execute("SELECT * FROM queen.push($1, '1')", &[&paused]).unwrap();
    c.execute("SELECT queen.pause($1)", &[&paused]).unwrap();
    drop(c);

    cluster_immediate_restart();
    // Nobody uses the lane while the worker rotates the journal: both tables retire once.
    thread::sleep(Duration::from_secs(10));
    let mut c = connect_retrying();
    assert_eq!(committed(&mut c, &queue), acked, "the cursor went back after the crash");
    let next: i64 =
        c.query_one("SELECT msg_offset FROM queen.pop($1, batch => 1, auto_ack => true)", &[&queue]).unwrap().get(0);
    assert_eq!(next, acked + 1);
    let held = c.query("SELECT * FROM queen.pop($1, batch => 10, auto_ack => true)", &[&paused]).unwrap();
    assert!(held.is_empty(), "a queue paused before the crash delivered after it");
    let flag: bool = c.query_one("SELECT paused FROM queen.totals($1)", &[&paused]).unwrap().get(0);
    assert!(flag, "totals does not show the pause after the crash");
    c.execute("SELECT queen.resume($1)", &[&paused]).unwrap();
    let got = c.query("SELECT * FROM queen.pop($1, batch => 10, auto_ack => true)", &[&paused]).unwrap();
    assert_eq!(got.len(), 1, "the resumed queue delivers its message");

    // An ack of a lease's only lane, rolled back to a savepoint: nothing moved, the lease
    // is still live and its ack works afterwards.
    let acked = next;
    let mut tx = c.transaction().unwrap();
    let lease: uuid::Uuid =
        tx.query_one("SELECT DISTINCT lease_id FROM queen.pop($1, batch => 5)", &[&queue]).unwrap().get(0);
    let mut sp = tx.transaction().unwrap();
    sp.execute("SELECT queen.ack($1)", &[&lease]).unwrap();
    sp.rollback().unwrap();
    tx.commit().unwrap();
    let (cursor, live): (i64, Option<uuid::Uuid>) = {
        let r = c.query_one("SELECT committed, lease_id FROM queen.status($1)", &[&queue]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((cursor, live), (acked, Some(lease)), "a rolled-back ack changed the lane");
    let released: bool =
        c.query_one("SELECT (queen.ack($1) -> 'lanes' -> 0 ->> 'leaseReleased')::bool", &[&lease]).unwrap().get(0);
    assert!(released);
    assert_eq!(committed(&mut c, &queue), acked + 5);
}

/// A crash of a server with the library preloaded, then a restart without it (as an
/// operator might do after that crash), then a crash and a restart with it again: no ack
/// is undone, and no seek either. Without preloading there is no registry and no worker to save the journal, so
/// the first pop (or cursor change) saves it into `queen.lanes` (`rows::settle_journal`).
#[test]
fn restarts_without_and_with_preloading_after_crashes_undo_no_ack_and_no_seek() {
    // No retention pass by the worker: the test runs one itself, after the restart.
    let cluster = queen_it::OwnCluster::start(5489, "queen.retention_interval = 0\n");
    let dsn = cluster.dsn("postgres");
    let connect = || connect_to(&dsn);
    let mut c = connect();
    c.batch_execute("CREATE EXTENSION queen").unwrap();
    c.batch_execute("CREATE DATABASE d2").unwrap();
    // In a database of its own (its own journal): a seek back that only the journal holds,
    // the row having the cursor from before it.
    let d2 = cluster.dsn("d2");
    let mut c2 = connect_to(&d2);
    c2.batch_execute(
        "CREATE EXTENSION queen;
         SELECT queen.configure('j2', retention => 1);
         SELECT queen.create_group('j2', 'g');
         SELECT count(*) FROM queen.push_batch('j2', (SELECT jsonb_agg(jsonb_build_object('payload', i))
                                                        FROM generate_series(1, 100) i));
         SELECT count(*) FROM queen.pop('j2', 'g', batch => 100, auto_ack => true);",
    )
    .unwrap();
    let row = |c: &mut Client| -> i64 { c.query_one("SELECT committed FROM queen.lanes", &[]).unwrap().get(0) };
    queen_it::eventually(60, || match row(&mut c2) {
        100 => Ok(()),
        r => Err(format!("the worker saved cursor {r} of 100 into the row")),
    });
    c2.execute("SELECT queen.seek('j2', 'g', to_offset => 11)", &[]).unwrap();
    c.execute(
        "SELECT count(*) FROM queen.push_batch('j', (SELECT jsonb_agg(jsonb_build_object('payload', i))
                                                       FROM generate_series(1, 100) i))",
        &[],
    )
    .unwrap();
    for _ in 0..3 {
        c.execute("SELECT queen.ack((SELECT lease_id FROM queen.pop('j', batch => 10) LIMIT 1))", &[]).unwrap();
    }
    assert_eq!(committed(&mut c, "j"), 30);
    let row_j: i64 = c.query_one("SELECT committed FROM queen.lanes", &[]).unwrap().get(0);
    assert!(row_j < 30, "the lane's row holds the newest cursor already: the test would prove nothing");
    assert_eq!(committed(&mut c2, "j2"), 10);
    assert_eq!(row(&mut c2), 100, "the row has the seek already: the test would prove nothing");
    drop((c, c2));
    cluster.crash();
    cluster.start_again("shared_preload_libraries = ''");
    // Retention first: it must keep what the seek rewound to.
    let mut c2 = connect_to(&d2);
    c2.execute("SELECT queen.retain('j2')", &[]).unwrap();
    let next: Vec<i64> = c2
        .query("SELECT msg_offset FROM queen.pop('j2', 'g', batch => 1, auto_ack => true)", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(next, [11], "retention deleted what a seek rewound to");
    drop(c2);
    let mut c = connect();
    // A transaction that saves the journal (its first pop) and rolls back: the journal is
    // back, and this session's next pop saves it again.
    let mut tx = c.transaction().unwrap();
    let first: i64 = tx.query_one("SELECT msg_offset FROM queen.pop('j', batch => 1)", &[]).unwrap().get(0);
    assert_eq!(first, 31, "an ack was undone by the restart without preloading");
    // (A second pop in it finds the journal empty, by its own doing; the lane is leased.)
    assert!(tx.query("SELECT 1 FROM queen.pop('j')", &[]).unwrap().is_empty());
    // Another session's pop meanwhile does not wait for that transaction (it would fail
    // here, at its lock_timeout): it claims nothing.
    let mut other = connect();
    other.batch_execute("SET lock_timeout = '2s'").unwrap();
    assert!(other.query("SELECT 1 FROM queen.pop('j')", &[]).unwrap().is_empty());
    tx.rollback().unwrap();
    let next: i64 =
        c.query_one("SELECT msg_offset FROM queen.pop('j', batch => 1, auto_ack => true)", &[]).unwrap().get(0);
    assert_eq!(next, 31, "an ack was undone by a rolled-back transaction that had saved the journal");
    let left = queen_it::journal_entries(&mut c);
    // (How: the journal was saved into the rows and emptied.)
    assert_eq!(left, 0, "the journal was not emptied");
    // A seek back, without the registry; then a crash and a restart with the library
    // preloaded: the registry loads the lane from the row and the journal (the newest).
    c.execute("SELECT queen.seek('j', '__QUEUE_MODE__', to_offset => 20)", &[]).unwrap();
    assert_eq!(committed(&mut c, "j"), 19, "the next pop delivers offset 20");
    drop(c);
    cluster.crash();
    cluster.start_again("shared_preload_libraries = 'queen'");
    let mut c = connect();
    assert_eq!(committed(&mut c, "j"), 19, "the seek was undone by the restart with preloading");
    let next: i64 =
        c.query_one("SELECT msg_offset FROM queen.pop('j', batch => 1, auto_ack => true)", &[]).unwrap().get(0);
    assert_eq!(next, 20);
}

fn connect_to(dsn: &str) -> Client {
    queen_it::connect_to_retrying(dsn, Instant::now() + Duration::from_secs(30))
}
