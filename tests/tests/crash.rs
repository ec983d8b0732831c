//! Crash: `pg_ctl stop -m immediate` in the middle of pushes, pops and acks, then restart.
//! After recovery every push that returned to its client is present, offsets have no
//! gaps, and the group's cursor is one that an ack call set (never one nobody asked for).

use std::collections::{BTreeSet, HashSet};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use queen_it::{dsn, unique};

fn try_connect() -> Option<Client> {
    Client::connect(&dsn(), NoTls).ok()
}

fn connect_retrying() -> Client {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(c) = try_connect() {
            return c;
        }
        assert!(Instant::now() < deadline, "the server did not come back");
        thread::sleep(Duration::from_millis(50));
    }
}

fn cluster(cmd: &str) {
    let dir = std::env::var("QUEEN_TEST_DIR").expect("QUEEN_TEST_DIR (set by make integration)");
    let port = std::env::var("QUEEN_TEST_PORT").expect("QUEEN_TEST_PORT");
    let ok = match cmd {
        "crash" => Command::new("runuser")
            .args(["-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "-D", &dir, "stop", "-m", "immediate"])
            .status(),
        _ => Command::new("bash").args(["scripts/cluster.sh", "start", &dir, &port]).current_dir("..").status(),
    }
    .expect("run pg_ctl");
    assert!(ok.success(), "pg_ctl {cmd} failed");
}

/// The tests of this file crash the one test cluster: one at a time.
static CRASHING: Mutex<()> = Mutex::new(());

#[test]
fn immediate_stop_loses_nothing_that_returned() {
    let _one = CRASHING.lock().unwrap_or_else(|e| e.into_inner());
    let queue = unique("crash");
    let stop = Arc::new(AtomicBool::new(false));
    let confirmed = Arc::new(Mutex::new(BTreeSet::<(u64, u64)>::new()));
    let acked_cursors = Arc::new(Mutex::new(HashSet::<i64>::from([0])));

    let pushers: Vec<_> = (0..2u64)
        .map(|p| {
            let (queue, stop, confirmed) = (queue.clone(), stop.clone(), confirmed.clone());
            thread::spawn(move || {
                let mut c = connect_retrying();
                let mut s = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    s += 1;
                    let r = c.execute(
                        "SELECT * FROM queen.push($1, jsonb_build_object('p', $2::int8, 's', $3::int8))",
                        &[&queue, &(p as i64), &(s as i64)],
                    );
                    match r {
                        Ok(_) => {
                            confirmed.lock().unwrap().insert((p, s));
                        }
                        Err(_) => c = connect_retrying(),
                    }
                }
            })
        })
        .collect();
    let consumer = {
        let (queue, stop, acked) = (queue.clone(), stop.clone(), acked_cursors.clone());
        thread::spawn(move || {
            let mut c = connect_retrying();
            while !stop.load(Ordering::SeqCst) {
                let rows = match c.query("SELECT lease_id, msg_offset FROM queen.pop($1, 'g', batch => 50)", &[&queue])
                {
                    Ok(r) => r,
                    Err(_) => {
                        c = connect_retrying();
                        continue;
                    }
                };
                if rows.is_empty() {
                    thread::sleep(Duration::from_millis(5));
                    continue;
                }
                let lease: uuid::Uuid = rows[0].get(0);
                let end: i64 = rows.last().unwrap().get(1);
                // Recorded before the call: an ack whose reply is lost may still commit.
                acked.lock().unwrap().insert(end);
                if c.execute("SELECT queen.ack($1)", &[&lease]).is_err() {
                    c = connect_retrying();
                }
            }
        })
    };

    thread::sleep(Duration::from_millis(1500));
    cluster("crash");
    thread::sleep(Duration::from_millis(200));
    cluster("start");
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::SeqCst);
    for h in pushers {
        h.join().unwrap();
    }
    consumer.join().unwrap();

    let mut c = connect_retrying();
    let confirmed = confirmed.lock().unwrap().clone();
    assert!(confirmed.len() > 50, "the test pushed too little: {}", confirmed.len());
    // Everything, read by a fresh group from offset 1.
    let rows = c
        .query("SELECT msg_offset, payload FROM queen.pop($1, 'verify', batch => 100000, auto_ack => true)", &[&queue])
        .unwrap();
    let offsets: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "offsets in order, no repeats");
    // A push the crash killed after it reserved its offset leaves a gap there for ever
    // (docs/offsets.md): at most one per pusher, each of which has one push in flight.
    let gaps = offsets.last().copied().unwrap_or(0) - offsets.len() as i64;
    assert!(gaps <= 2, "{gaps} offsets missing: more than the pushes the crash could kill");
    let present: HashSet<(u64, u64)> = rows
        .iter()
        .map(|r| {
            let v: serde_json::Value = r.get(1);
            (v["p"].as_u64().unwrap(), v["s"].as_u64().unwrap())
        })
        .collect();
    for k in &confirmed {
        assert!(present.contains(k), "push {k:?} returned to its client but is gone");
    }
    assert_eq!(present.len(), rows.len(), "no message stored twice");
    // The group's cursor is one some ack call asked for.
    let committed: i64 =
        c.query_one("SELECT committed FROM queen.status($1) WHERE consumer_group = 'g'", &[&queue]).unwrap().get(0);
    assert!(acked_cursors.lock().unwrap().contains(&committed), "cursor {committed} was set by no ack");
}

/// Invariant 3: what an auto-ack pop or a group-creating pop did is durable when it
/// returns. The WAL writer is stopped (SIGSTOP) so that nothing flushes an asynchronous
/// commit for it, then killed (SIGKILL), which makes the postmaster crash and recover
/// every backend, as after kill -9 of the server.
#[test]
fn auto_ack_cursor_and_new_group_survive_a_crash() {
    let _one = CRASHING.lock().unwrap_or_else(|e| e.into_inner());
    let queue = unique("crashack");
    let mut c = connect_retrying();
    for i in 1..=10 {
        c.execute("SELECT queen.push($1, jsonb_build_object('i', $2::int))", &[&queue, &i]).unwrap();
    }
    // A group that subscribes to what comes after its creation.
    let none = c.query("SELECT 1 FROM queen.pop($1, 'late', subscription => 'new')", &[&queue]).unwrap();
    assert!(none.is_empty(), "a 'new' group starts at the end");
    let walwriter: i32 =
        c.query_one("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'", &[]).unwrap().get(0);
    let signal = |sig: &str| {
        let ok = Command::new("kill").args([sig, &walwriter.to_string()]).status().expect("run kill");
        assert!(ok.success(), "kill {sig} {walwriter}");
    };
    signal("-STOP");
    let got: Vec<i64> = c
        .query("SELECT msg_offset FROM queen.pop($1, 'g', batch => 4, auto_ack => true)", &[&queue])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(got, vec![1, 2, 3, 4]);
    let none = c.query("SELECT 1 FROM queen.pop($1, 'fresh', subscription => 'new')", &[&queue]).unwrap();
    assert!(none.is_empty());
    signal("-KILL");
    drop(c);
    thread::sleep(Duration::from_millis(500));
    let mut c = connect_retrying();
    // The auto-acked messages are not delivered again.
    let next: Vec<i64> = c
        .query("SELECT msg_offset FROM queen.pop($1, 'g', batch => 100, auto_ack => true)", &[&queue])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(next, (5..=10).collect::<Vec<_>>(), "the auto-ack cursor moved back in the crash");
    // Messages pushed after the crash reach both 'new' groups: neither was forgotten and
    // created again at a later end.
    for i in 11..=12 {
        c.execute("SELECT queen.push($1, jsonb_build_object('i', $2::int))", &[&queue, &i]).unwrap();
    }
    for group in ["late", "fresh"] {
        let got: Vec<i64> = c
            .query("SELECT msg_offset FROM queen.pop($1, $2, batch => 100, auto_ack => true)", &[&queue, &group])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(got, vec![11, 12], "group {group} lost messages pushed after the crash");
    }
}
