//! A hot standby: queen's calls that change state refuse there with 25006, as PostgreSQL
//! refuses a write, before they touch anything; reads work; the primary loses nothing.
//!
//! A standby's shared memory is its own. A lease claimed there, or a cursor moved there,
//! would hold nothing back on the primary, so a pop, push, ack or lease call on a standby
//! must fail rather than appear to work (docs/errors.md, 25006).

use std::process::Command;
use std::time::{Duration, Instant};

use postgres::Client;
use queen_it::OwnCluster;

/// A streaming standby of `primary` (pg_basebackup -R), on `port`, in a directory of its
/// own; stopped and removed when dropped (as an OwnCluster).
fn standby_of(primary: &OwnCluster, port: u16) -> OwnCluster {
    let dir = format!("/tmp/queen-own-{port}");
    let standby = OwnCluster { dir: dir.clone(), port: port.to_string() };
    standby.run("stop");
    let _ = std::fs::remove_dir_all(&dir);
    let ok = Command::new("runuser")
        .args(["-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_basebackup"])
        .args(["-h", &format!("{}/sock", primary.dir), "-p", &primary.port, "-U", "postgres"])
        .args(["-D", &dir, "-R", "-X", "stream", "-c", "fast"])
        .status()
        .expect("run pg_basebackup");
    assert!(ok.success(), "pg_basebackup of the primary");
    // The copy carries the primary's port and socket directory: the standby gets its own.
    let conf_path = format!("{dir}/postgresql.conf");
    let conf = std::fs::read_to_string(&conf_path).unwrap();
    let conf: String = conf
        .lines()
        .filter(|l| !l.starts_with("port =") && !l.starts_with("unix_socket_directories ="))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&conf_path, format!("{conf}port = {port}\nunix_socket_directories = '{dir}/sock'\n")).unwrap();
    let _ = std::fs::remove_dir_all(format!("{dir}/sock"));
    std::fs::create_dir_all(format!("{dir}/sock")).unwrap();
    let ok = Command::new("chown").args(["-R", "postgres:postgres", &dir]).status().unwrap();
    assert!(ok.success());
    standby.run("start");
    standby
}

fn connect_within(dsn: &str, secs: u64) -> Client {
    queen_it::connect_to_retrying(dsn, Instant::now() + Duration::from_secs(secs))
}

/// The SQLSTATE of `sql`'s error on `c`; panics if it succeeded.
fn sqlstate(c: &mut Client, sql: &str) -> String {
    match c.batch_execute(sql) {
        Ok(()) => panic!("{sql}: succeeded on a standby"),
        Err(e) => e.code().map(|s| s.code().to_string()).unwrap_or_else(|| format!("no SQLSTATE: {e}")),
    }
}

#[test]
fn a_standby_refuses_what_changes_state_and_the_primary_loses_nothing() {
    let primary = OwnCluster::start(5494, "wal_level = replica\nmax_wal_senders = 4\n");
    let mut p = connect_within(&primary.dsn("postgres"), 30);
    p.batch_execute("CREATE DATABASE app").unwrap();
    let mut p = connect_within(&primary.dsn("app"), 30);
    p.batch_execute("CREATE EXTENSION queen").unwrap();
    for k in 0..5 {
        p.execute("SELECT queen.send('sq', $1::text::jsonb)", &[&format!("{{\"k\": {k}}}")]).unwrap();
    }
    // A lease held on the primary: the standby's ack, extend and revoke must not touch it.
    let held = p.query_one("SELECT lease_id, partition_id FROM queen.pop('sq')", &[]).unwrap();
    let (lease, partition): (uuid::Uuid, uuid::Uuid) = (held.get(0), held.get(1));

    let standby = standby_of(&primary, 5495);
    let mut s = connect_within(&standby.dsn("app"), 60);
    assert!(s.query_one("SELECT pg_is_in_recovery()", &[]).unwrap().get::<_, bool>(0), "a standby");
    // Reads work there, and see the primary's messages once replayed.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = s.query_one("SELECT count(*) FROM queen.peek('sq', max_messages => 10)", &[]).unwrap().get(0);
        if n == 5 {
            break;
        }
        assert!(Instant::now() < deadline, "the standby shows {n} of the 5 messages");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every read of the contract works there (docs/functions.md, "Errors any call may raise").
    let one: i64 = s.query_one("SELECT count(*) FROM queen.get('sq', 'Default', msg_offset => 3)", &[]).unwrap().get(0);
    assert_eq!(one, 1, "get on a standby");
    for read in [
        "SELECT count(*) FROM queen.status('sq')",
        "SELECT count(*) FROM queen.totals()",
        "SELECT count(*) FROM queen.metrics()",
        "SELECT count(*) FROM queen.dlq('sq')",
    ] {
        s.query_one(read, &[]).unwrap_or_else(|e| panic!("{read} on a standby: {e}"));
    }
    let refused = [
        "SELECT * FROM queen.pop('sq')".to_string(),
        "SELECT * FROM queen.pop('sq', auto_ack => true)".into(),
        "SELECT * FROM queen.pop('sq', wait_ms => 100)".into(),
        "SELECT queen.send('sq', '{}')".into(),
        "SELECT * FROM queen.push('sq', '{}')".into(),
        "SELECT * FROM queen.push_batch('[{\"queue\": \"sq\", \"payload\": {}}]')".into(),
        format!("SELECT queen.ack('{lease}')"),
        format!("SELECT queen.ack('{lease}', '[{{\"partitionId\": \"{partition}\", \"offset\": 1}}]')"),
        format!("SELECT queen.extend_lease('{lease}', 600)"),
        format!("SELECT queen.revoke_lease('{lease}')"),
    ];
    for sql in &refused {
        assert_eq!(sqlstate(&mut s, sql), "25006", "{sql} on a standby");
    }
    // The primary's lease is as it was, and every message is there: the one leased is
    // acked under it, the other four come to the next pop.
    let acked: serde_json::Value = p.query_one("SELECT queen.ack($1)", &[&lease]).unwrap().get(0);
    assert_eq!(acked["lanes"][0]["committed"], 1, "the ack on the primary: {acked}");
    let rows = p.query("SELECT msg_offset FROM queen.pop('sq', batch => 10)", &[]).unwrap();
    let offsets: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(offsets, vec![2, 3, 4, 5]);
    drop(s);
    drop(standby);
}
