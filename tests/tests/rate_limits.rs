//! Rate limits per key (`queen.configure_limit`, docs/concepts.md#rate-limits), with real
//! consumers: four sessions pop (batches of up to 10, long-polling 200 ms), and ack each
//! batch, for ten seconds. Two keys at 10 messages a second with a burst of 5 deliver the
//! burst plus ten a second each (95 to 105); a third key's limit is raised from 10 to 40 a
//! second halfway, and the new rate applies from then on; an unlimited key is drained.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use queen_it::{connect, unique};

const PARTITIONS: usize = 4;
const PER_PARTITION: usize = 300;

#[test]
fn limited_keys_deliver_their_rate_and_others_are_unaffected() {
    let queue = unique("rate");
    let mut admin = connect();
    for key in ["k1", "k2", "k3", "free"] {
        for p in 0..PARTITIONS {
            let items: Vec<serde_json::Value> = (0..PER_PARTITION)
                .map(|i| serde_json::json!({"partition": format!("{key}:{p}"), "payload": i}))
                .collect();
            admin
                .execute("SELECT count(*) FROM queen.push_batch($1, $2)", &[&queue, &serde_json::Value::from(items)])
                .unwrap();
        }
    }
    for key in ["k1:", "k2:", "k3:"] {
        admin.execute("SELECT queen.configure_limit($1, 'g', $2, rate => 10, burst => 5)", &[&queue, &key]).unwrap();
    }

    // Deliveries per key, by pops that started in the run's ten seconds (and the first
    // five, for k3).
    let counts: Arc<Mutex<HashMap<String, (usize, usize)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let half = t0 + Duration::from_secs(5);
    let end = t0 + Duration::from_secs(10);
    let consumers: Vec<_> = (0..4)
        .map(|_| {
            let (queue, counts, stop) = (queue.clone(), counts.clone(), stop.clone());
            thread::spawn(move || {
                let mut c = connect();
                while !stop.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    if started >= end {
                        break;
                    }
                    let rows = c
                        .query(
                            "SELECT partition, lease_id FROM queen.pop($1, 'g', batch => 10, wait_ms => 200,
                                                                       max_partitions => 16, lease_seconds => 30)",
                            &[&queue],
                        )
                        .unwrap();
                    if let Some(r) = rows.first() {
                        let lease: uuid::Uuid = r.get(1);
                        let acked: bool = c
                            .query_one("SELECT (queen.ack($1) -> 'lanes' -> 0 ->> 'committed') IS NOT NULL", &[&lease])
                            .unwrap()
                            .get(0);
                        assert!(acked, "an ack of a live lease");
                    }
                    let mut counts = counts.lock().unwrap();
                    for r in &rows {
                        let partition: String = r.get(0);
                        let key = partition.split(':').next().unwrap().to_string();
                        let e = counts.entry(key).or_default();
                        e.0 += 1;
                        if started < half {
                            e.1 += 1;
                        }
                    }
                }
            })
        })
        .collect();
    // Halfway, k3's limit goes up to 40 a second: from the next pop on.
    thread::sleep(half.saturating_duration_since(Instant::now()));
    admin.execute("SELECT queen.configure_limit($1, 'g', 'k3:', rate => 40, burst => 5)", &[&queue]).unwrap();
    for h in consumers {
        h.join().expect("a consumer panicked");
    }
    stop.store(true, Ordering::SeqCst);
    let counts = counts.lock().unwrap().clone();
    eprintln!("deliveries per key (all, first 5 s): {counts:?}");
    for key in ["k1", "k2"] {
        let (n, _) = counts.get(key).copied().unwrap_or_default();
        assert!((95..=105).contains(&n), "{key} delivered {n} in 10 s at 10/s with a burst of 5");
    }
    // k3: 5 + 10/s for the first five seconds, then a full bucket of 5 and 40/s: 260 in all.
    // (A pop that started before the change and waited across it, up to 200 ms, may take
    // the new burst and what 40/s adds meanwhile: up to 13 more in "first".)
    let (all, first) = counts.get("k3").copied().unwrap_or_default();
    assert!((45..=68).contains(&first), "k3 delivered {first} in its first 5 s at 10/s");
    assert!((245..=270).contains(&all), "k3 delivered {all} in all: its new limit of 40/s did not apply");
    let (free, _) = counts.get("free").copied().unwrap_or_default();
    assert_eq!(free, PARTITIONS * PER_PARTITION, "the unlimited key was drained");
}
