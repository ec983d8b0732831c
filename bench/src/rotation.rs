//! "rotation stall": how long pops wait while a rotation of the segment generations
//! empties an oldest generation that still holds `live` bytes of live rows (issue #29:
//! at most 200 ms at any generation size, measured with 1 GB live).
//!
//! Set-up, in a fresh extension, with the worker's rotations off (`queen.rotation_min_size
//! = -1` for the server while the scenario runs; the bench's session sets its own):
//! - `rot-live` (16 partitions) gets `live` bytes of stored segments that nobody consumes,
//!   and `rot-dead` (16 partitions) three times as much, pushed interleaved in batches of
//!   1,000 messages of ~3 kB of random text (so that compression leaves them large);
//! - a first rotation makes that generation the oldest; `rot-dead`'s group is moved to the
//!   end (`seek`) and retention deletes its segments, so the oldest generation is about
//!   one quarter live: a rotation is due ([generations](../../core/src/generations.rs));
//! - meanwhile a producer pushes one message every 2 ms to `rot-probe`, and two consumers
//!   pop in a loop, one from `rot-probe` (new rows, current generation) and one from
//!   `rot-live` (rows the rotation moves), 10 messages a call, auto-ack.
//!
//! Then `queen.retain()` runs the rotation (in its own transaction, as the worker's pass
//! does): the move of the live rows, which takes no lock a pop waits for, then the swap
//! under the oldest tables' exclusive lock. Reported: the rotation's duration, and the
//! pops' latency while it ran (p50, p99, max) next to the same before it; the target is on
//! the longest pop that overlapped the rotation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;
use serde_json::{json, Value};

use super::connect;

pub struct Figures {
    /// Live bytes in the oldest generation when the rotation started (`live_bytes`: row
    /// overhead plus data), and the generation's size on disk.
    pub live_bytes: i64,
    pub oldest_bytes: i64,
    pub rotation_secs: f64,
    /// Pop latencies (ms) while the rotation ran, per consumer, and before it (both).
    pub during_probe: Vec<f64>,
    pub during_live: Vec<f64>,
    pub before: Vec<f64>,
}

/// Random printable text (xorshift; incompressible enough: 6 bits of entropy per byte).
fn text(state: &mut u64, len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(len);
    for _ in 0..len {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        s.push(ALPHABET[(*state % 64) as usize] as char);
    }
    s
}

fn batch(queue: &str, n: usize, state: &mut u64) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({"queue": queue, "partition": format!("p{}", i % 16), "payload": {"d": text(state, 3000)}}))
            .collect(),
    )
}

/// Stored bytes of a queue's segments (both tiers).
fn stored(c: &mut Client, queue: &str) -> i64 {
    c.query_one(
        "SELECT coalesce(sum(octet_length(s.data)), 0)::int8
           FROM (SELECT partition_id, data FROM queen.segments UNION ALL SELECT partition_id, data FROM queen.fresh_segments) s
           JOIN queen.partitions p USING (partition_id) JOIN queen.queues q USING (queue_id)
          WHERE q.name = $1",
        &[&queue],
    )
    .unwrap()
    .get(0)
}

/// The server's rotations are turned off for the scenario and on again after it, even
/// when it fails.
struct NoWorkerRotation(String);

impl Drop for NoWorkerRotation {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&self.0, postgres::NoTls) {
            let _ = c.batch_execute("ALTER SYSTEM RESET queen.rotation_min_size");
            let _ = c.batch_execute("SELECT pg_reload_conf()");
        }
    }
}

/// A consumer loop: (start, latency in ms) of every pop until `stop`.
fn consumer(dsn: &str, queue: &'static str, group: &'static str, stop: Arc<AtomicBool>) -> Vec<(Instant, f64)> {
    let mut c = connect(dsn);
    let st = c
        .prepare("SELECT count(*) FROM queen.pop($1, $2, batch => 10, max_partitions => 4, auto_ack => true)")
        .unwrap();
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let n: i64 = c.query_one(&st, &[&queue, &group]).unwrap().get(0);
        out.push((t, t.elapsed().as_secs_f64() * 1000.0));
        if n == 0 {
            thread::sleep(Duration::from_millis(1));
        }
    }
    out
}

pub fn run(dsn: &str, live: i64) -> Figures {
    let mut c = connect(dsn);
    c.batch_execute("ALTER SYSTEM SET queen.rotation_min_size = -1").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    let _guard = NoWorkerRotation(dsn.to_string());
    c.batch_execute("SET queen.rotation_min_size = 0").unwrap();
    c.batch_execute(
        "SELECT queen.create_group('rot-dead', 'g');
         SELECT queen.configure('rot-dead', retention => 1);
         SELECT queen.create_group('rot-live', 'r');",
    )
    .unwrap();
    let push = c.prepare("SELECT count(*) FROM queen.push_batch($1::jsonb)").unwrap();
    let generation = |c: &mut Client| -> i16 {
        c.query_one("SELECT current_generation FROM queen.generations", &[]).unwrap().get(0)
    };
    let filled = generation(&mut c);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let started = Instant::now();
    // Interleaved, so that the dead rows lie between the live ones (a VACUUM cannot hand
    // their space back by truncating the tables' ends).
    while stored(&mut c, "rot-live") < live {
        c.query_one(&push, &[&batch("rot-live", 1000, &mut state)]).unwrap();
        for _ in 0..3 {
            c.query_one(&push, &[&batch("rot-dead", 1000, &mut state)]).unwrap();
        }
    }
    println!(
        "rotation: pushed {} MB in {:.0} s",
        (stored(&mut c, "rot-live") * 4) >> 20,
        started.elapsed().as_secs_f64()
    );
    // That generation becomes the oldest (the other one is empty: nothing to move). The
    // worker may have made this rotation itself, before it read the setting that turns its
    // rotations off (it reads it between passes, and a pass of an earlier scenario can be
    // long), or hold the generations row at this moment: try again for a while.
    let mut tries = 0;
    while generation(&mut c) == filled {
        let r: Value = c.query_one("SELECT queen.retain()", &[]).unwrap().get(0);
        tries += 1;
        assert!(tries < 30 || generation(&mut c) != filled, "no first rotation in 30 tries: {r}");
        if r["generationRotated"] != true {
            thread::sleep(Duration::from_secs(1));
        }
    }
    if tries != 1 {
        println!("rotation: the first rotation came after {tries} calls of retain (0: the worker's)");
    }
    // What the scenario measures needs every row pushed above in the oldest generation: a
    // rotation by the worker during the pushes (or two of them) would leave some in the
    // current one, and the rotation measured below would move less than `live`.
    let misplaced: i64 = c
        .query_one(
            "SELECT count(*) FROM queen.segments s JOIN queen.partitions p USING (partition_id)
               JOIN queen.queues q USING (queue_id)
              WHERE q.name IN ('rot-live', 'rot-dead')
                AND s.generation = (SELECT current_generation FROM queen.generations)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(misplaced, 0, "segments of the scenario in the current generation: a rotation during the pushes");
    // rot-dead consumed and deleted: three quarters of the oldest generation are dead.
    c.batch_execute(
        "SELECT queen.seek('rot-dead', 'g', to_offset => 9223372036854775807);
         SELECT pg_sleep(1.1);
         SELECT queen.retain('rot-dead');",
    )
    .unwrap();
    let row = c
        .query_one(
            "SELECT g.current_generation,
                    pg_total_relation_size(('queen.segments_' || (1 - g.current_generation))::regclass)
                    + pg_total_relation_size(('queen.fresh_segments_' || (1 - g.current_generation))::regclass),
                    (SELECT count(*) * 128 + coalesce(sum(octet_length(x.data)), 0)
                       FROM (SELECT data FROM queen.segments WHERE generation = 1 - g.current_generation
                             UNION ALL
                             SELECT data FROM queen.fresh_segments WHERE generation = 1 - g.current_generation) x)::int8
               FROM queen.generations g",
            &[],
        )
        .unwrap();
    let (oldest_bytes, live_bytes): (i64, i64) = (row.get(1), row.get(2));
    println!("rotation: oldest generation {} MB on disk, {} MB live", oldest_bytes >> 20, live_bytes >> 20);
    c.batch_execute("CHECKPOINT").unwrap();

    // The live queue: a producer and two consumers.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (dsn, stop) = (dsn.to_string(), stop.clone());
        thread::spawn(move || {
            let mut c = connect(&dsn);
            let st = c.prepare("SELECT count(*) FROM queen.push('rot-probe', $1::jsonb)").unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                c.query_one(&st, &[&json!({"n": i})]).unwrap();
                i += 1;
                thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let consumers: Vec<_> = [("rot-probe", "q"), ("rot-live", "r")]
        .into_iter()
        .map(|(queue, group)| {
            let (dsn, stop) = (dsn.to_string(), stop.clone());
            thread::spawn(move || consumer(&dsn, queue, group, stop))
        })
        .collect();
    thread::sleep(Duration::from_secs(5));
    let t0 = Instant::now();
    let r: Value = c.query_one("SELECT queen.retain()", &[]).unwrap().get(0);
    let t1 = Instant::now();
    assert_eq!(r["generationRotated"], true, "the measured rotation: {r}");
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    let runs: Vec<Vec<(Instant, f64)>> = consumers.into_iter().map(|h| h.join().unwrap()).collect();
    // A pop overlapped the rotation if it started before the end and ended after the start.
    let during = |v: &[(Instant, f64)]| -> Vec<f64> {
        v.iter()
            .filter(|(s, ms)| *s < t1 && *s + Duration::from_secs_f64(ms / 1000.0) > t0)
            .map(|(_, ms)| *ms)
            .collect()
    };
    let before: Vec<f64> = runs.iter().flat_map(|v| v.iter().filter(|(s, _)| *s < t0).map(|(_, ms)| *ms)).collect();
    Figures {
        live_bytes,
        oldest_bytes,
        rotation_secs: (t1 - t0).as_secs_f64(),
        during_probe: during(&runs[0]),
        during_live: during(&runs[1]),
        before,
    }
}
