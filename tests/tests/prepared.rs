//! Prepared transactions that pushed, across an immediate stop (docs/offsets.md, "Prepared
//! transactions"). A prepared transaction survives a restart; the registry of offset
//! reservations does not. After the restart the partition must not be read past the
//! prepared transaction's offsets, nor its offsets reserved again, until it is committed
//! or rolled back: a push and a pop of that partition wait for it.

use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::Duration;

use postgres::{Client, NoTls};
use queen_it::harness::cluster_immediate_restart;
use queen_it::{connect_retrying, dsn, unique};

/// The tests of this file run one at a time: one of them restarts the server.
static SERIAL: Mutex<()> = Mutex::new(());

/// Rolls back the test's prepared transactions still pending when it ends (a failed
/// assertion): left behind, they would hold partition loads back in later tests.
struct RollBackLeftovers(Vec<String>);

impl Drop for RollBackLeftovers {
    fn drop(&mut self) {
        let Ok(mut c) = Client::connect(&dsn(), NoTls) else { return };
        for gid in &self.0 {
            let pending = c
                .query_one("SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1", &[gid])
                .map(|r| r.get::<_, i64>(0) > 0)
                .unwrap_or(false);
            if pending {
                let _ = c.batch_execute(&format!("ROLLBACK PREPARED '{gid}'"));
            }
        }
    }
}

fn prepare_push(queue: &str, payload: &str, gid: &str) {
    let mut c = connect_retrying();
    c.batch_execute("BEGIN").unwrap();
    c.execute("SELECT msg_offset FROM queen.push($1, to_jsonb($2::text))", &[&queue, &payload]).unwrap();
    c.batch_execute(&format!("PREPARE TRANSACTION '{gid}'")).unwrap();
}

#[test]
fn prepared_pushes_hold_their_partition_across_a_restart() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let queue = unique("prepared");
    let (p1, p2) = (unique("p1"), unique("p2"));
    let _leftovers = RollBackLeftovers(vec![p1.clone(), p2.clone()]);
    let mut c = connect_retrying();
    c.execute("SELECT msg_offset FROM queen.push($1, '\"one\"')", &[&queue]).unwrap();
    prepare_push(&queue, "two", &p1);
    prepare_push(&queue, "three", &p2);
    drop(c);
    cluster_immediate_restart();
    let mut c = connect_retrying();
    let prepared: i64 =
        c.query_one("SELECT count(*) FROM pg_prepared_xacts WHERE gid IN ($1, $2)", &[&p1, &p2]).unwrap().get(0);
    assert_eq!(prepared, 2, "both prepared transactions survive the restart");

    // A push and a pop of the partition, each in its own session: both wait.
    let (done_tx, done) = mpsc::channel();
    let (q, tx) = (queue.clone(), done_tx.clone());
    let pusher = thread::spawn(move || {
        let mut c = connect_retrying();
        let offset: i64 = c.query_one("SELECT msg_offset FROM queen.push($1, '\"four\"')", &[&q]).unwrap().get(0);
        tx.send("push").unwrap();
        offset
    });
    let q = queue.clone();
    let popper = thread::spawn(move || {
        let mut c = connect_retrying();
        let rows =
            c.query("SELECT msg_offset, payload #>> '{}' FROM queen.pop($1, 'early', batch => 10)", &[&q]).unwrap();
        done_tx.send("pop").unwrap();
        rows.iter().map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1))).collect::<Vec<_>>()
    });
    assert!(done.recv_timeout(Duration::from_secs(2)).is_err(), "a push or a pop passed a prepared transaction");
    c.batch_execute(&format!("COMMIT PREPARED '{p1}'")).unwrap();
    assert!(
        done.recv_timeout(Duration::from_millis(700)).is_err(),
        "a push or a pop passed the prepared transaction still pending"
    );
    c.batch_execute(&format!("ROLLBACK PREPARED '{p2}'")).unwrap();
    let four = pusher.join().unwrap();
    let early = popper.join().unwrap();
    assert!(four > 2, "the push after the restart took offset {four}, which \"two\" holds or precedes");
    // The pop saw the partition once both were over: "one" and "two", and "four" only if it
    // committed first, never "three".
    assert!(early.len() >= 2 && early[0] == (1, "one".into()) && early[1] == (2, "two".into()), "{early:?}");
    assert!(early.iter().all(|(_, p)| p != "three"), "{early:?}");

    let all: Vec<(i64, String)> = c
        .query(
            "SELECT msg_offset, payload #>> '{}' FROM queen.pop($1, 'all', batch => 10, auto_ack => true)",
            &[&queue],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(all, vec![(1, "one".to_string()), (2, "two".to_string()), (four, "four".to_string())]);
}

/// A session prepares a push that created its queue, then pushes to that queue again. The
/// second push must not use the partition that exists only in the prepared transaction: it
/// waits for it (the queue's name is taken until it ends) and, once that is rolled back,
/// creates the queue anew. Its message is delivered.
#[test]
fn a_push_after_a_prepare_that_rolls_back_is_not_lost() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let queue = unique("prepared-new");
    let gid = unique("p");
    let _leftovers = RollBackLeftovers(vec![gid.clone()]);
    let mut a = connect_retrying();
    a.batch_execute("BEGIN").unwrap();
    a.execute("SELECT msg_offset FROM queen.push($1, '\"prepared\"')", &[&queue]).unwrap();
    a.batch_execute(&format!("PREPARE TRANSACTION '{gid}'")).unwrap();
    let q = queue.clone();
    let second = thread::spawn(move || {
        a.query_one("SELECT msg_offset FROM queen.push($1, '\"after\"')", &[&q]).unwrap().get::<_, i64>(0)
    });
    thread::sleep(Duration::from_millis(500));
    let mut b = connect_retrying();
    b.batch_execute(&format!("ROLLBACK PREPARED '{gid}'")).unwrap();
    second.join().unwrap();
    let got: Vec<String> = b
        .query("SELECT payload #>> '{}' FROM queen.pop($1, batch => 10, auto_ack => true)", &[&queue])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(got, vec!["after".to_string()], "the push after the prepare was lost or the rolled-back one kept");
}
