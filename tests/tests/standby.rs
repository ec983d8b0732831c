//! A hot standby: queen's calls that change state refuse there with 25006, as PostgreSQL
//! refuses a write, before they touch anything; its reads work and stay current as WAL is
//! replayed; and once it is promoted, it carries on where the primary stopped.
//!
//! A standby's shared memory is its own. A lease claimed or a cursor moved there would hold
//! nothing back on the primary, so a pop, push, ack or lease call on a standby must fail
//! rather than appear to work (docs/errors.md, 25006). And the registries are not used
//! there at all (`shmem::in_recovery`): a partition's end cached by a read would go stale,
//! and after a promotion a push would take offsets that are already stored.

use std::time::{Duration, Instant};

use postgres::Client;
use queen_it::{eventually, OwnCluster};

fn connect_within(dsn: &str, secs: u64) -> Client {
    queen_it::connect_to_retrying(dsn, Instant::now() + Duration::from_secs(secs))
}

/// The SQLSTATE and message of `sql`'s error on `c`; panics if it succeeded.
fn refusal(c: &mut Client, sql: &str) -> (String, String) {
    match c.batch_execute(sql) {
        Ok(()) => panic!("{sql}: succeeded on a standby"),
        Err(e) => match e.as_db_error() {
            Some(db) => (db.code().code().to_string(), db.message().to_string()),
            None => panic!("{sql}: {e}"),
        },
    }
}

/// Waits (up to 30 s) until `c` peeks `n` messages of queue `sq`.
fn wait_peek(c: &mut Client, n: i64) {
    eventually(30, || {
        match c.query_one("SELECT count(*) FROM queen.peek('sq', max_messages => 100)", &[]).unwrap().get::<_, i64>(0) {
            got if got == n => Ok(()),
            got => Err(format!("{got} messages to peek, expected {n}")),
        }
    })
}

/// A primary with 5 messages and a lease, and its streaming standby: the standby's reads
/// follow the replay, its calls that change state refuse with queen's own 25006, the
/// primary's lease is untouched, and after a failover the promoted standby pushes at the
/// next offset and delivers what was not acked.
#[test]
fn a_standby_refuses_what_changes_state_reads_current_data_and_carries_on_once_promoted() {
    let primary = OwnCluster::start(5498, "");
    let mut p = connect_within(&primary.dsn("postgres"), 30);
    p.batch_execute("CREATE DATABASE app").unwrap();
    let mut p = connect_within(&primary.dsn("app"), 30);
    p.batch_execute("CREATE EXTENSION queen").unwrap();
    for k in 1..=5 {
        p.execute("SELECT queen.send('sq', $1::text::jsonb)", &[&format!("{{\"k\": {k}}}")]).unwrap();
    }
    // A lease held on the primary (long enough for the whole test): the standby's ack,
    // extend and revoke must not touch it.
    let held = p.query_one("SELECT lease_id, partition_id FROM queen.pop('sq', lease_seconds => 600)", &[]).unwrap();
    let (lease, partition): (uuid::Uuid, uuid::Uuid) = (held.get(0), held.get(1));

    let standby = primary.standby(5499);
    let mut s = connect_within(&standby.dsn("app"), 60);
    assert!(s.query_one("SELECT pg_is_in_recovery()", &[]).unwrap().get::<_, bool>(0), "a standby");
    wait_peek(&mut s, 5);
    // A read there follows the replay: a push on the primary after the standby's first
    // peek shows up in its next ones.
    p.batch_execute("SELECT queen.send('sq', '{\"k\": 6}')").unwrap();
    wait_peek(&mut s, 6);
    let one: i64 = s.query_one("SELECT count(*) FROM queen.get('sq', 'Default', msg_offset => 6)", &[]).unwrap().get(0);
    assert_eq!(one, 1, "get on a standby");
    // Every read docs/functions.md lists for a standby works there.
    for read in [
        "SELECT count(*) FROM queen.status('sq')",
        "SELECT count(*) FROM queen.totals()",
        "SELECT count(*) FROM queen.metrics()",
        "SELECT count(*) FROM queen.dlq('sq')",
    ] {
        s.query_one(read, &[]).unwrap_or_else(|e| panic!("{read} on a standby: {e}"));
    }
    // Each call that changes state refuses with queen's own message (PostgreSQL's
    // read-only check would give 25006 too, but only at a write, after shared memory).
    let item = format!("[{{\"partitionId\": \"{partition}\", \"offset\": 1}}]");
    let refused = [
        ("pop", "SELECT * FROM queen.pop('sq')".to_string()),
        ("pop", "SELECT * FROM queen.pop('sq', auto_ack => true)".into()),
        ("pop", "SELECT * FROM queen.pop('sq', wait_ms => 100)".into()),
        ("push", "SELECT queen.send('sq', '{}')".into()),
        ("push", "SELECT * FROM queen.push('sq', '{}')".into()),
        ("push", "SELECT * FROM queen.push_batch('[{\"queue\": \"sq\", \"payload\": {}}]')".into()),
        ("push", "SELECT * FROM queen.push_batch('sq', '[{\"payload\": {}}]')".into()),
        ("ack", format!("SELECT queen.ack('{lease}')")),
        ("ack", format!("SELECT queen.ack('{lease}', '{item}')")),
        ("ack", format!("SELECT queen.ack('{lease}', '{partition}', 1)")),
        ("extend_lease", format!("SELECT queen.extend_lease('{lease}', 600)")),
        ("revoke_lease", format!("SELECT queen.revoke_lease('{lease}')")),
        ("dlq_replay", format!("SELECT queen.dlq_replay('{partition}', 'tx')")),
        ("dlq_delete", format!("SELECT queen.dlq_delete('{partition}', 'tx')")),
        ("dlq_redrive", "SELECT queen.dlq_redrive('sq')".into()),
    ];
    for (call, sql) in &refused {
        let (code, message) = refusal(&mut s, sql);
        assert_eq!(code, "25006", "{sql} on a standby: {message}");
        assert!(message.starts_with(&format!("queen: {call} ")), "{sql} on a standby: {message}");
    }
    // The primary's lease is as it was: acked there, it moves the cursor.
    let acked: serde_json::Value = p.query_one("SELECT queen.ack($1)", &[&lease]).unwrap().get(0);
    assert_eq!(acked["lanes"][0]["committed"], 1, "the ack on the primary: {acked}");
    let end: String = p.query_one("SELECT pg_current_wal_flush_lsn()::text", &[]).unwrap().get(0);
    drop(p);
    // The standby's status shows the ack as soon as it is replayed (from the journal: the
    // primary's worker copies it into queen.lanes only later).
    eventually(30, || {
        let sql = "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn";
        match s.query_one(sql, &[&end]).unwrap().get::<_, bool>(0) {
            true => Ok(()),
            false => Err(format!("the standby did not replay up to {end}")),
        }
    });
    let committed: i64 = s.query_one("SELECT max(committed) FROM queen.status('sq')", &[]).unwrap().get(0);
    assert_eq!(committed, 1, "the standby's cursor once the ack is replayed");

    // Failover: the standby, once it has replayed everything, becomes the primary. It
    // cached nothing while it was a standby: its next push takes the next offset, and a
    // pop delivers every message the old primary had not acked, in order.
    drop(primary);
    standby.promote();
    let mut s = connect_within(&standby.dsn("app"), 30);
    assert!(!s.query_one("SELECT pg_is_in_recovery()", &[]).unwrap().get::<_, bool>(0), "promoted");
    let offset: i64 = s.query_one("SELECT queen.send('sq', '{\"k\": 7}')", &[]).unwrap().get(0);
    assert_eq!(offset, 7, "the first push after the promotion");
    let rows = s.query("SELECT msg_offset FROM queen.pop('sq', batch => 10)", &[]).unwrap();
    let offsets: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(offsets, vec![2, 3, 4, 5, 6, 7], "after the promotion");
}
