//! Commit durability (README, "Durability"): a pop that takes a lease writes nothing to
//! wait for (with preloading its lease lives in shared memory; without, its writes commit
//! without waiting for the WAL flush); a push, an ack, an auto-ack pop (it moves the
//! cursor), a pop that creates its consumer group (its cursor start must survive a crash)
//! and any transaction that also wrote something else wait for it. Counted with the
//! cluster's WAL fsyncs (`pg_stat_wal.wal_sync`). This file is its own test binary, so no
//! other test of the suite runs beside it, but the count is off by a few either way. The
//! WAL writer and the maintenance worker may add a sync or two. And another process's
//! flush (the maintenance worker's, the checkpointer's, the WAL writer's) may cover one
//! of our commit records before our session flushes it, while that process has not
//! reported its `wal_sync` yet (the maintenance worker reports when it exits): then our
//! commit waited, but the count misses its sync. Hence the margins, far apart: `WAITED`
//! for calls that wait, `N / 4` for a leasing pop, which does not (it shows 0 to 2).

use postgres::Client;
use queen_it::{connect, unique};

const N: i64 = 20;
/// Fewest syncs that count as "each of the N commits waited for its flush": another
/// process's unreported flush may cover one of ours (CI saw 19 of 20 for pops that wait).
/// A call that stopped waiting would stop waiting every time, and show 0 to 2.
const WAITED: i64 = N - 3;

/// Cluster-wide WAL fsyncs so far, including this session's own.
fn wal_syncs(c: &mut Client) -> i64 {
    c.batch_execute("SELECT pg_stat_force_next_flush()").unwrap();
    c.batch_execute("SELECT 1").unwrap(); // the flush happens at the end of a statement
    c.batch_execute("SELECT pg_stat_clear_snapshot()").unwrap();
    c.query_one("SELECT wal_sync FROM pg_stat_wal", &[]).unwrap().get(0)
}

/// `n` messages over N partitions, so that N leases can be held at once.
fn fill(c: &mut Client, queue: &str, n: i64) {
    c.execute(
        "SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object(
             'queue', $1::text, 'partition', 'p' || i % $3::int8, 'payload', i))
           FROM generate_series(1, $2::int8) i))",
        &[&queue, &n, &N],
    )
    .unwrap();
}

/// Runs `each` N times and returns how many WAL fsyncs the cluster did meanwhile.
fn syncs_during(c: &mut Client, mut each: impl FnMut(&mut Client)) -> i64 {
    let before = wal_syncs(c);
    for _ in 0..N {
        each(c);
    }
    wal_syncs(c) - before
}

fn pop_one(c: &mut Client, queue: &str, auto_ack: bool) -> Option<uuid::Uuid> {
    pop_group(c, queue, "__QUEUE_MODE__", auto_ack)
}

fn pop_group(c: &mut Client, queue: &str, group: &str, auto_ack: bool) -> Option<uuid::Uuid> {
    let rows = c.query("SELECT lease_id FROM queen.pop($1, $2, auto_ack => $3)", &[&queue, &group, &auto_ack]).unwrap();
    assert_eq!(rows.len(), 1, "a message was available");
    rows[0].get(0)
}

#[test]
fn leasing_pop_alone_commits_without_flush_wait_everything_else_waits() {
    let mut c = connect();
    let queue = unique("durable");
    fill(&mut c, &queue, 10 * N);
    c.batch_execute("CREATE TABLE IF NOT EXISTS durability_side (n int)").unwrap();
    pop_one(&mut c, &queue, true); // creates the group outside the measurements

    // An auto-ack pop alone moves the cursor: it waits for its flush, as an ack does
    // (after a crash the cursor never moves back).
    let auto = syncs_during(&mut c, |c| {
        pop_one(c, &queue, true);
    });
    assert!(auto >= WAITED, "auto-ack pops waited for only {auto} WAL flushes out of {N}");
    // A leasing pop: no flush wait.
    let mut leases = Vec::new();
    let leased = syncs_during(&mut c, |c| leases.push(pop_one(c, &queue, false).unwrap()));
    assert!(leased <= N / 4, "leasing pops waited for {leased} WAL flushes out of {N}");

    // An ack is durable when it returns.
    let mut it = leases.into_iter();
    let acks = syncs_during(&mut c, |c| {
        c.execute("SELECT queen.ack($1)", &[&it.next().unwrap()]).unwrap();
    });
    assert!(acks >= WAITED, "acks waited for only {acks} WAL flushes out of {N}");

    // A pop in a transaction that wrote something else, before or after it: the user's
    // write keeps its durability.
    let after = syncs_during(&mut c, |c| {
        let mut tx = c.transaction().unwrap();
        tx.query("SELECT 1 FROM queen.pop($1, auto_ack => true)", &[&queue]).unwrap();
        tx.execute("INSERT INTO durability_side VALUES (1)", &[]).unwrap();
        tx.commit().unwrap();
    });
    assert!(after >= WAITED, "pop then insert waited for only {after} WAL flushes out of {N}");
    let before = syncs_during(&mut c, |c| {
        let mut tx = c.transaction().unwrap();
        tx.execute("INSERT INTO durability_side VALUES (2)", &[]).unwrap();
        tx.query("SELECT 1 FROM queen.pop($1, auto_ack => true)", &[&queue]).unwrap();
        tx.commit().unwrap();
    });
    assert!(before >= WAITED, "insert then pop waited for only {before} WAL flushes out of {N}");

    // A pop that creates its group waits: a group forgotten in a crash would be created
    // again later (a 'new' one at a later end, skipping what came between).
    let mut g = 0;
    let creating = syncs_during(&mut c, |c| {
        g += 1;
        pop_group(c, &queue, &format!("new{g}"), false);
    });
    assert!(creating >= WAITED, "group-creating pops waited for only {creating} WAL flushes out of {N}");
    let setting: String = c.query_one("SHOW synchronous_commit", &[]).unwrap().get(0);
    assert_eq!(setting, "on", "the session's synchronous_commit is left as it was");
}
