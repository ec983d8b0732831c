//! Several sessions at once: invariant 1 (no offset skipped while pushes commit out of
//! order, some rolling back and leaving gaps) and one in-flight batch per lane.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use queen_it::{connect, unique};
use rand::Rng;
use serde_json::json;

const PUSHERS: usize = 4;
const CONSUMERS: usize = 2;
const PARTITIONS: usize = 4;
const COMMITTED_PER_PUSHER: usize = 5_000;

#[derive(Default)]
struct Log {
    /// Per partition, offsets in the order they were delivered (recorded before the ack,
    /// under this lock, so the order across consumers is the real one).
    delivered: BTreeMap<String, Vec<i64>>,
    /// (pusher, seq) of every delivered payload, with how many times it came.
    payloads: HashMap<(u64, u64), usize>,
}

#[test]
fn invariant_1_no_offset_skipped_under_concurrent_pushes_with_rollbacks() {
    let queue = unique("inv1");
    let pushing_done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let log = Arc::new(Mutex::new(Log::default()));

    let pushers: Vec<_> = (0..PUSHERS)
        .map(|p| {
            let queue = queue.clone();
            let done = pushing_done.clone();
            thread::spawn(move || {
                let mut client = connect();
                let mut rng = rand::thread_rng();
                let mut committed = BTreeSet::new();
                let mut rolled_back = BTreeSet::new();
                // (partition, offset) of every committed message, as its push returned.
                let mut addresses = BTreeSet::new();
                let mut seq = 0u64;
                while committed.len() < COMMITTED_PER_PUSHER {
                    let n = rng.gen_range(1..=5).min(COMMITTED_PER_PUSHER - committed.len());
                    let items: Vec<_> = (0..n)
                        .map(|_| {
                            seq += 1;
                            json!({"queue": queue, "partition": format!("p{}", rng.gen_range(0..PARTITIONS)),
                                   "payload": {"p": p, "s": seq}})
                        })
                        .collect();
                    let seqs: Vec<u64> = (seq - n as u64 + 1..=seq).collect();
                    let mut tx = client.transaction().unwrap();
                    let rows = tx.query("SELECT idx, msg_offset FROM queen.push_batch($1)", &[&json!(items)]).unwrap();
                    assert_eq!(rows.len(), n);
                    if rng.gen_bool(0.2) {
                        tx.rollback().unwrap();
                        rolled_back.extend(seqs.into_iter().map(|s| (p as u64, s)));
                    } else {
                        tx.commit().unwrap();
                        committed.extend(seqs.into_iter().map(|s| (p as u64, s)));
                        for r in &rows {
                            let idx: i32 = r.get(0);
                            let partition = items[idx as usize]["partition"].as_str().unwrap().to_string();
                            addresses.insert((partition, r.get::<_, i64>(1)));
                        }
                    }
                }
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                (committed, rolled_back, addresses)
            })
        })
        .collect();

    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let queue = queue.clone();
            let done = pushing_done.clone();
            let log = log.clone();
            thread::spawn(move || {
                let mut client = connect();
                let deadline = Instant::now() + Duration::from_secs(300);
                let mut empty_after_done = 0;
                loop {
                    assert!(Instant::now() < deadline, "consumers did not drain the queue in time");
                    let rows = client
                        .query(
                            "SELECT lease_id, partition, msg_offset, payload FROM queen.pop($1, batch => 100, max_partitions => 4)",
                            &[&queue],
                        )
                        .unwrap();
                    if rows.is_empty() {
                        if done.load(std::sync::atomic::Ordering::SeqCst) == PUSHERS {
                            empty_after_done += 1;
                            if empty_after_done > 20 {
                                return;
                            }
                        }
                        thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    empty_after_done = 0;
                    let lease: uuid::Uuid = rows[0].get(0);
                    {
                        let mut log = log.lock().unwrap();
                        for r in &rows {
                            let partition: String = r.get(1);
                            let offset: i64 = r.get(2);
                            let payload: serde_json::Value = r.get(3);
                            log.delivered.entry(partition).or_default().push(offset);
                            let key = (payload["p"].as_u64().unwrap(), payload["s"].as_u64().unwrap());
                            *log.payloads.entry(key).or_default() += 1;
                        }
                    }
                    let ack: serde_json::Value = client.query_one("SELECT queen.ack($1)", &[&lease]).unwrap().get(0);
                    assert!(ack["lanes"].as_array().unwrap().iter().all(|l| l["leaseReleased"] == true), "{ack}");
                }
            })
        })
        .collect();

    let mut committed = BTreeSet::new();
    let mut rolled_back = BTreeSet::new();
    let mut addresses: BTreeSet<(String, i64)> = BTreeSet::new();
    for h in pushers {
        let (c, r, a) = h.join().unwrap();
        committed.extend(c);
        rolled_back.extend(r);
        addresses.extend(a);
    }
    for h in consumers {
        h.join().unwrap();
    }
    let log = log.lock().unwrap();
    assert!(!rolled_back.is_empty(), "the test must roll some pushes back");
    assert_eq!(committed.len(), PUSHERS * COMMITTED_PER_PUSHER);

    // Every committed message delivered exactly once; nothing rolled back delivered.
    for key in &committed {
        assert_eq!(log.payloads.get(key), Some(&1), "committed message {key:?} delivered once");
    }
    for key in &rolled_back {
        assert!(!log.payloads.contains_key(key), "rolled-back message {key:?} was delivered");
    }
    assert_eq!(log.payloads.len(), committed.len());

    // Per partition, in delivery order: exactly the offsets committed pushes returned, in
    // increasing order. None skipped, none repeated; the offsets of rolled-back pushes are
    // gaps that nothing fills.
    let mut client = connect();
    let mut total = 0;
    let mut gaps = 0;
    for (partition, offsets) in &log.delivered {
        let expected: Vec<i64> = addresses.iter().filter(|(p, _)| p == partition).map(|(_, o)| *o).collect();
        assert_eq!(offsets, &expected, "partition {partition} delivered out of order, or skipped or repeated one");
        let head: i64 = client
            .query_one("SELECT DISTINCT head FROM queen.status($1) WHERE partition = $2", &[&queue, partition])
            .unwrap()
            .get(0);
        assert_eq!(Some(&head), offsets.last(), "partition {partition}: the head is the last committed message");
        gaps += head as usize - offsets.len();
        total += offsets.len();
    }
    assert_eq!(total, committed.len());
    assert!(gaps > 0, "rolled-back pushes left gaps");
}

#[test]
fn one_in_flight_batch_per_lane() {
    const SESSIONS: usize = 8;
    let queue = unique("lane");
    let mut setup = connect();
    setup
        .execute(
            "SELECT count(*) FROM queen.push_batch($1)",
            &[&json!((0..10).map(|i| json!({"queue": queue, "payload": i})).collect::<Vec<_>>())],
        )
        .unwrap();
    for round in 0..5 {
        let barrier = Arc::new(Barrier::new(SESSIONS));
        let handles: Vec<_> = (0..SESSIONS)
            .map(|_| {
                let barrier = barrier.clone();
                let queue = queue.clone();
                thread::spawn(move || {
                    let mut c = connect();
                    barrier.wait();
                    let rows = c.query("SELECT lease_id FROM queen.pop($1, batch => 2)", &[&queue]).unwrap();
                    rows.first().map(|r| r.get::<_, uuid::Uuid>(0))
                })
            })
            .collect();
        let winners: Vec<uuid::Uuid> = handles.into_iter().filter_map(|h| h.join().unwrap()).collect();
        assert_eq!(winners.len(), 1, "round {round}: exactly one session gets the lane");
        // Different groups are never blocked by it.
        let other: i64 = setup
            .query_one(
                "SELECT count(*) FROM queen.pop($1, $2, batch => 10, auto_ack => true)",
                &[&queue, &format!("g{round}")],
            )
            .unwrap()
            .get(0);
        assert_eq!(other, 10);
        setup.execute("SELECT queen.ack($1)", &[&winners[0]]).unwrap();
    }
}

/// Eight workers start on a new consumer group at the same moment (one of them creates
/// it; the others must neither fail nor wait on a claim that is not theirs), with and
/// without long-poll: every one of them is served.
#[test]
fn eight_workers_starting_a_new_group_at_once_are_all_served() {
    let queue = unique("newgroup");
    let mut c = connect();
    let items: Vec<_> =
        (0..80).map(|i| json!({"queue": queue, "partition": format!("p{}", i % 8), "payload": i})).collect();
    c.query("SELECT 1 FROM queen.push_batch($1)", &[&json!(items)]).unwrap();
    for (group, wait_ms) in [("quick", 0), ("polling", 2000)] {
        let barrier = Arc::new(Barrier::new(8));
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let (queue, barrier) = (queue.clone(), barrier.clone());
                thread::spawn(move || {
                    let mut c = connect();
                    barrier.wait();
                    let deadline = Instant::now() + Duration::from_secs(10);
                    loop {
                        let rows = c
                            .query(
                                "SELECT lease_id FROM queen.pop($1, $2, batch => 10, wait_ms => $3)",
                                &[&queue, &group, &wait_ms],
                            )
                            .unwrap();
                        if let Some(r) = rows.first() {
                            // Hold the lease: the other workers must take other partitions.
                            let _lease: uuid::Uuid = r.get(0);
                            return rows.len();
                        }
                        assert!(Instant::now() < deadline, "a worker of group {group} was never served");
                        thread::sleep(Duration::from_millis(20));
                    }
                })
            })
            .collect();
        let served: Vec<usize> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        assert_eq!(served, vec![10; 8], "group {group}: each worker got one partition's ten messages");
    }
}
