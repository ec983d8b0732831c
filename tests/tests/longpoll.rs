//! Long-poll (`wait_ms`): wake on a push commit or a nack in another session, time out
//! empty, honour query cancel and statement_timeout, refuse REPEATABLE READ.

use std::thread;
use std::time::{Duration, Instant};

use queen_it::{connect, unique};

/// Starts a waiting pop in another session; returns (rows, elapsed, time it returned).
fn spawn_wait(queue: &str, group: &str, wait_ms: i32) -> thread::JoinHandle<(usize, Duration, Instant)> {
    let (queue, group) = (queue.to_string(), group.to_string());
    thread::spawn(move || {
        let mut c = connect();
        c.execute("SELECT set_config('application_name', $1, false)", &[&queue]).unwrap();
        // The auto-ack pop's commit does not wait for its WAL flush, which a checkpoint
        // under way can slow down: the time it returns is the wake's.
        c.execute("SET synchronous_commit = off", &[]).unwrap();
        let t0 = Instant::now();
        let rows = c
            .query("SELECT * FROM queen.pop($1, $2, wait_ms => $3, auto_ack => true)", &[&queue, &group, &wait_ms])
            .unwrap();
        (rows.len(), t0.elapsed(), Instant::now())
    })
}

/// Waits until a backend of this database is waiting inside queen.pop.
fn wait_until_parked(c: &mut postgres::Client, queue: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' AND query LIKE '%queen.pop%'",
                &[&queue],
            )
            .unwrap()
            .get(0);
        if n > 0 {
            // Give the waiter time to find nothing and go to sleep.
            thread::sleep(Duration::from_millis(150));
            return;
        }
        assert!(Instant::now() < deadline, "the waiting pop on {queue} never started");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `trial` four times, with the wake-up (a commit) put off by 0, 50, 100 and 150 ms
/// more each time, and checks that each pop woke at once. Each latency is measured from
/// the waking call's return, so the committer's own WAL flush is not counted. A waiting pop
/// also rechecks every `wake::RECHECK_MS` (200 ms) without any wake-up, so one trial alone
/// could miss a lost wake-up that the recheck happened to cover. The four delays put the
/// commits at four points of that cycle, so a lost wake-up leaves at least two trials
/// 80 ms late or more. One slow trial is let through: a disk stall (a checkpoint) can hold
/// up any single commit.
fn assert_woken_at_once(what: &str, mut trial: impl FnMut(Duration) -> Duration) {
    let latencies: Vec<Duration> = [0, 50, 100, 150].into_iter().map(|ms| trial(Duration::from_millis(ms))).collect();
    let slow = latencies.iter().filter(|&&d| d >= Duration::from_millis(80)).count();
    assert!(slow <= 1, "{what}: woke {latencies:?} after the wake-ups");
}

/// Commits `tx` (the wake-up) and waits for `waiter`'s pop, which must return the one
/// message. Returns the time from the commit's return to the pop's.
fn commit_and_time(tx: postgres::Transaction<'_>, waiter: thread::JoinHandle<(usize, Duration, Instant)>) -> Duration {
    tx.commit().unwrap();
    let committed_at = Instant::now();
    let (rows, elapsed, returned_at) = waiter.join().unwrap();
    assert_eq!(rows, 1);
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    returned_at.saturating_duration_since(committed_at)
}

#[test]
fn waiting_pop_wakes_on_push_commit() {
    let mut c = connect();
    assert_woken_at_once("a push's commit", |delay| {
        let queue = unique("wake");
        c.execute("SELECT queen.configure($1)", &[&queue]).unwrap();
        let waiter = spawn_wait(&queue, "g", 10_000);
        wait_until_parked(&mut c, &queue);
        let mut tx = c.transaction().unwrap();
        tx.execute("SELECT * FROM queen.push($1, '{\"hello\": 1}')", &[&queue]).unwrap();
        thread::sleep(Duration::from_millis(300) + delay);
        assert!(!waiter.is_finished(), "a pop returned before the push committed");
        commit_and_time(tx, waiter)
    });
}

#[test]
fn waiting_pop_times_out_empty() {
    let queue = unique("idle");
    let mut c = connect();
    c.execute("SELECT * FROM queen.push($1, '1')", &[&queue]).unwrap();
    c.execute("SELECT * FROM queen.pop($1, batch => 10, auto_ack => true)", &[&queue]).unwrap();
    let t0 = Instant::now();
    let rows = c.query("SELECT * FROM queen.pop($1, wait_ms => 300)", &[&queue]).unwrap();
    let elapsed = t0.elapsed();
    assert!(rows.is_empty());
    assert!(elapsed >= Duration::from_millis(300), "returned after {elapsed:?}");
    assert!(elapsed < Duration::from_millis(2_000), "returned after {elapsed:?}");
    // An unknown queue waits and returns zero rows too.
    let rows = c.query("SELECT * FROM queen.pop($1, wait_ms => 50)", &[&unique("none")]).unwrap();
    assert!(rows.is_empty());
}

#[test]
fn waiting_pop_wakes_on_nack() {
    let mut c = connect();
    assert_woken_at_once("a nack", |delay| {
        let queue = unique("nack");
        c.execute("SELECT * FROM queen.push($1, '1')", &[&queue]).unwrap();
        let row =
            c.query_one("SELECT lease_id, partition_id FROM queen.pop($1, lease_seconds => 300)", &[&queue]).unwrap();
        let (lease, pid): (uuid::Uuid, uuid::Uuid) = (row.get(0), row.get(1));
        // Same group: the lane is leased, so the waiter can only be served by the release.
        let queue2 = queue.clone();
        let waiter = thread::spawn(move || {
            let mut c = connect();
            c.execute("SELECT set_config('application_name', $1, false)", &[&queue2]).unwrap();
            let rows = c.query("SELECT attempt FROM queen.pop($1, wait_ms => 10000)", &[&queue2]).unwrap();
            (rows.len(), rows.first().map(|r| r.get::<_, i32>(0)), Instant::now())
        });
        wait_until_parked(&mut c, &queue);
        thread::sleep(delay);
        let r: serde_json::Value = c.query_one("SELECT queen.ack($1, $2, 1, 'retry')", &[&lease, &pid]).unwrap().get(0);
        let nacked_at = Instant::now();
        assert_eq!(r["lanes"][0]["leaseReleased"], true, "{r}");
        let (rows, attempt, returned_at) = waiter.join().unwrap();
        assert_eq!(rows, 1);
        assert_eq!(attempt, Some(1), "redelivery at the same offset counts an attempt");
        returned_at.saturating_duration_since(nacked_at)
    });
}

#[test]
fn waiting_pop_is_cancelled_by_pg_cancel_backend_and_statement_timeout() {
    let queue = unique("cancel");
    let mut c = connect();
    let pid: i32 = {
        let mut w = connect();
        let pid: i32 = w.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        w.execute("SELECT set_config('application_name', $1, false)", &[&queue]).unwrap();
        let q = queue.clone();
        let h = thread::spawn(move || w.query("SELECT * FROM queen.pop($1, wait_ms => 60000)", &[&q]));
        wait_until_parked(&mut c, &queue);
        let t0 = Instant::now();
        let ok: bool = c.query_one("SELECT pg_cancel_backend($1)", &[&pid]).unwrap().get(0);
        assert!(ok);
        let err = h.join().unwrap().expect_err("cancelled");
        assert_eq!(err.code(), Some(&postgres::error::SqlState::QUERY_CANCELED), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(2));
        pid
    };
    let _ = pid;
    c.batch_execute("SET statement_timeout = '200ms'").unwrap();
    let t0 = Instant::now();
    let err = c.query("SELECT * FROM queen.pop($1, wait_ms => 60000)", &[&queue]).expect_err("timed out");
    assert_eq!(err.code(), Some(&postgres::error::SqlState::QUERY_CANCELED), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[test]
fn waiting_pop_refused_under_repeatable_read() {
    let queue = unique("rr");
    let mut c = connect();
    let mut tx = c.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).start().unwrap();
    let err = tx.query("SELECT * FROM queen.pop($1, wait_ms => 100)", &[&queue]).expect_err("refused");
    assert_eq!(err.code(), Some(&postgres::error::SqlState::FEATURE_NOT_SUPPORTED), "{err}");
    drop(tx);
    // Without waiting, REPEATABLE READ is fine.
    let mut tx = c.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).start().unwrap();
    assert!(tx.query("SELECT * FROM queen.pop($1)", &[&queue]).unwrap().is_empty());
}

/// A paused queue: a waiting pop keeps waiting while messages are pushed, and wakes at
/// once on the resume's commit with them (docs/functions.md#resume).
#[test]
fn waiting_pop_on_a_paused_queue_wakes_on_resume() {
    let mut c = connect();
    assert_woken_at_once("a resume", |delay| {
        let queue = unique("paused");
        c.execute("SELECT queen.pause($1)", &[&queue]).unwrap();
        let waiter = spawn_wait(&queue, "g", 10_000);
        wait_until_parked(&mut c, &queue);
        c.execute("SELECT * FROM queen.push($1, '{\"held\": 1}')", &[&queue]).unwrap();
        thread::sleep(Duration::from_millis(300)); // the push woke it; paused, it sleeps again
        assert!(!waiter.is_finished(), "a pop of a paused queue returned");
        let mut tx = c.transaction().unwrap();
        tx.execute("SELECT queen.resume($1)", &[&queue]).unwrap();
        thread::sleep(Duration::from_millis(200) + delay); // not committed: still paused for the waiter
        assert!(!waiter.is_finished(), "the pop returned before the resume committed");
        commit_and_time(tx, waiter)
    });
}

/// One group paused: the other group's waiting pop is served, the paused one's is not,
/// until its own resume.
#[test]
fn a_group_pause_holds_only_that_group() {
    let queue = unique("gpause");
    let mut c = connect();
    c.execute("SELECT queen.pause($1, 'held')", &[&queue]).unwrap();
    let held = spawn_wait(&queue, "held", 10_000);
    wait_until_parked(&mut c, &queue);
    c.execute("SELECT * FROM queen.push($1, '1')", &[&queue]).unwrap();
    let rows = c.query("SELECT * FROM queen.pop($1, 'free', wait_ms => 2000, auto_ack => true)", &[&queue]).unwrap();
    assert_eq!(rows.len(), 1, "the group that is not paused gets the message");
    thread::sleep(Duration::from_millis(200));
    assert!(!held.is_finished(), "the paused group's pop returned");
    c.execute("SELECT queen.resume($1, 'held')", &[&queue]).unwrap();
    let (rows, ..) = held.join().unwrap();
    assert_eq!(rows, 1);
}
