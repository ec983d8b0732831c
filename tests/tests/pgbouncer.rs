//! queen through a real PgBouncer (Debian's 1.18) in `pool_mode = transaction`, with more
//! clients than server connections (`make integration` starts it with 4 server connections
//! per database and passes its DSN in QUEEN_TEST_POOLER_DSN). Statements go out with
//! `query_typed` (one unnamed statement per call), as a driver must under transaction
//! pooling without protocol-level prepared statements.
//!
//! The core loop: a long-poll pop woken by a push from another client, ack, extend, the
//! dead-letter queue and replay; and many producers and consumers sharing the pool.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use postgres::types::Type;
use postgres::{Client, NoTls};
use queen_it::unique;

fn pooler_dsn() -> String {
    std::env::var("QUEEN_TEST_POOLER_DSN")
        .expect("QUEEN_TEST_POOLER_DSN is not set: run these tests with `make integration`")
}

fn pooled() -> Client {
    Client::connect(&pooler_dsn(), NoTls).expect("connect through pgbouncer")
}

/// The number of distinct server backends seen by `clients` sessions, each asking a few
/// times: fewer than the clients when the pooler shares them.
fn backends_seen(clients: &mut [Client]) -> usize {
    let mut pids = std::collections::BTreeSet::new();
    for _ in 0..3 {
        for c in clients.iter_mut() {
            let pid: i32 = c.query_typed_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
            pids.insert(pid);
        }
    }
    pids.len()
}

#[test]
fn the_core_loop_runs_through_transaction_pooling() {
    let queue = unique("pool");
    let mut clients: Vec<Client> = (0..12).map(|_| pooled()).collect();
    let shared = backends_seen(&mut clients);
    assert!(shared <= 4, "12 clients must share the pool's 4 server connections, saw {shared}");

    // A consumer long-polls before anything is pushed; another client's push wakes it.
    let q = queue.clone();
    let waiting = thread::spawn(move || {
        let mut c = pooled();
        let started = Instant::now();
        let rows = c
            .query_typed(
                "SELECT lease_id, msg_offset FROM queen.pop($1, 'workers', batch => 10, wait_ms => 20000)",
                &[(&q, Type::TEXT)],
            )
            .unwrap();
        let lease = rows.first().map(|r| r.get::<_, uuid::Uuid>(0));
        (started.elapsed(), lease, rows.iter().map(|r| r.get::<_, i64>(1)).collect::<Vec<_>>())
    });
    thread::sleep(Duration::from_millis(300)); // let the pop park inside its call
    let producer = &mut clients[0];
    let pushed = producer
        .query_typed("SELECT msg_offset FROM queen.push($1, '{\"n\": 1}'::jsonb)", &[(&queue, Type::TEXT)])
        .unwrap();
    assert_eq!(pushed.len(), 1);
    let (took, first_lease, offsets) = waiting.join().unwrap();
    assert_eq!(offsets, vec![1]);
    assert!(took < Duration::from_secs(10), "the push must wake the pop, not its 20 s timeout ({took:?})");
    // The whole-lease ack, from yet another client.
    let done: serde_json::Value =
        clients[1].query_typed_one("SELECT queen.ack($1)", &[(&first_lease.unwrap(), Type::UUID)]).unwrap().get(0);
    assert_eq!(done["lanes"][0]["committed"], 1, "{done}");

    // Lease, extend, failed ack (redelivered), then dlq, list, replay, ack: each call on
    // whatever server connection the pooler hands out.
    for n in 2..=3 {
        clients[n % 12]
            .query_typed(
                "SELECT 1 FROM queen.push($1, jsonb_build_object('n', $2::int))",
                &[(&queue, Type::TEXT), (&(n as i32), Type::INT4)],
            )
            .unwrap();
    }
    let rows = clients[3]
        .query_typed(
            "SELECT lease_id, partition_id, msg_offset FROM queen.pop($1, 'ops', batch => 10)",
            &[(&queue, Type::TEXT)],
        )
        .unwrap();
    assert_eq!(rows.len(), 3);
    let lease: uuid::Uuid = rows[0].get(0);
    let pid: uuid::Uuid = rows[0].get(1);
    let ext: serde_json::Value =
        clients[4].query_typed_one("SELECT queen.extend_lease($1, 120)", &[(&lease, Type::UUID)]).unwrap().get(0);
    assert_eq!(ext["renewed"], 1, "{ext}");
    let ack: serde_json::Value = clients[5]
        .query_typed_one("SELECT queen.ack($1, $2, 1, 'failed', 'flaky')", &[(&lease, Type::UUID), (&pid, Type::UUID)])
        .unwrap()
        .get(0);
    assert_eq!(ack["items"][0]["success"], true, "{ack}");
    let again = clients[6]
        .query_typed(
            "SELECT lease_id, msg_offset, attempt FROM queen.pop($1, 'ops', batch => 10)",
            &[(&queue, Type::TEXT)],
        )
        .unwrap();
    assert_eq!(again.iter().map(|r| r.get::<_, i64>(1)).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(again[0].get::<_, i32>(2), 1, "a redelivery counts its attempt");
    let lease2: uuid::Uuid = again[0].get(0);
    let dead: serde_json::Value = clients[7]
        .query_typed_one("SELECT queen.ack($1, $2, 1, 'dlq', 'poison')", &[(&lease2, Type::UUID), (&pid, Type::UUID)])
        .unwrap()
        .get(0);
    assert_eq!(dead["items"][0]["dlq"], true, "{dead}");
    let listed = clients[8].query_typed("SELECT transaction_id FROM queen.dlq($1)", &[(&queue, Type::TEXT)]).unwrap();
    assert_eq!(listed.len(), 1);
    let tx: String = listed[0].get(0);
    let replay: serde_json::Value = clients[9]
        .query_typed_one("SELECT queen.dlq_replay($1, $2)", &[(&pid, Type::UUID), (&tx, Type::TEXT)])
        .unwrap()
        .get(0);
    assert_eq!(replay["replayed"], true, "{replay}");
    // The dead-lettering ack released the lease: 2 and 3 come back, and the replayed
    // message once, at a new offset.
    let rest = clients[11]
        .query_typed(
            "SELECT msg_offset, payload->>'n' FROM queen.pop($1, 'ops', batch => 10, auto_ack => true)",
            &[(&queue, Type::TEXT)],
        )
        .unwrap();
    let rest: Vec<(i64, String)> = rest.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(rest, vec![(2, "2".to_string()), (3, "3".to_string()), (4, "1".to_string())]);
}

/// Ten clients on four server connections: eight producers pushing one message per
/// transaction, and two consumers long-polling with `wait_ms` and acking. Every message is
/// delivered exactly once. (A waiting pop holds its server connection for the whole wait:
/// with as many waiting pops as server connections, pushes queue in the pooler until a
/// wait ends. The README's "Connection poolers" says how to size the pool.)
#[test]
fn many_producers_and_long_polling_consumers_share_a_small_pool() {
    const PER_PRODUCER: i64 = 40;
    let queue = unique("poolmany");
    let start = Arc::new(Barrier::new(10));
    let mut handles = Vec::new();
    for p in 0..8 {
        let (queue, start) = (queue.clone(), start.clone());
        handles.push(thread::spawn(move || {
            let mut c = pooled();
            start.wait();
            for i in 0..PER_PRODUCER {
                c.query_typed(
                    "SELECT 1 FROM queen.push($1, jsonb_build_object('p', $2::int, 'i', $3::int8))",
                    &[(&queue, Type::TEXT), (&p, Type::INT4), (&i, Type::INT8)],
                )
                .unwrap();
            }
            Vec::new()
        }));
    }
    for _ in 0..2 {
        let (queue, start) = (queue.clone(), start.clone());
        handles.push(thread::spawn(move || {
            let mut c = pooled();
            start.wait();
            let mut got = Vec::new();
            let mut idle = 0;
            while idle < 3 {
                let rows = c
                    .query_typed(
                        "SELECT lease_id, msg_offset FROM queen.pop($1, 'g', batch => 5, wait_ms => 1000)",
                        &[(&queue, Type::TEXT)],
                    )
                    .unwrap();
                if rows.is_empty() {
                    idle += 1;
                    continue;
                }
                idle = 0;
                let lease: uuid::Uuid = rows[0].get(0);
                got.extend(rows.iter().map(|r| r.get::<_, i64>(1)));
                let ack: serde_json::Value =
                    c.query_typed_one("SELECT queen.ack($1)", &[(&lease, Type::UUID)]).unwrap().get(0);
                assert!(ack["lanes"][0]["leaseReleased"].as_bool().unwrap_or(false), "{ack}");
            }
            got
        }));
    }
    let mut delivered: Vec<i64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    delivered.sort_unstable();
    let expected: Vec<i64> = (1..=8 * PER_PRODUCER).collect();
    assert_eq!(delivered, expected, "every offset once");
}
