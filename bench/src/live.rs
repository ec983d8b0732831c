//! The live queue (issue #33): single-message producers and small-batch consumers at the
//! same time, the backlog near zero, the shape most applications run.
//!
//! - 8 producers push one message per transaction: queen over 16 partitions
//!   (`queen.push('lq', $1, 'p<n>')`), the table with a plain `INSERT`.
//! - 4 consumers take up to 10 messages and acknowledge them: queen with
//!   `queen.pop('lq', batch => 10, wait_ms => 200)` (the default group and its one lane
//!   per call, as a newcomer writes it) and `queen.ack(lease)`; the table with the SKIP
//!   LOCKED pattern in one transaction (claim up to 10 rows `FOR UPDATE SKIP LOCKED`, then
//!   `DELETE` them: the rows stay claimed while they are processed, so a crash
//!   redelivers them, as queen's lease does; the one-statement `DELETE ... RETURNING` is
//!   fewer round trips but loses what a crashed worker held), and a 5 ms sleep when it
//!   found nothing: the table's consumers poll (job libraries add a LISTEN/NOTIFY wake-up
//!   on top, which this does not measure), so at low load the 5 ms is part of their
//!   latency.
//! - Rounds alternate the two systems (queen first in odd rounds, the table first in even
//!   ones), each from a fresh start (`reset`: the extension and the table recreated; then
//!   VACUUM ANALYZE and a CHECKPOINT). The worker compacts queen's segments during its
//!   rounds, as in production.
//! - Every statement is prepared once per connection, and both push the same payload.
//! - For experiments, not for the published figures: QUEEN_BENCH_LIVE_SYSTEM=queen (or
//!   table) runs that system's rounds only (the half-rate rounds then take half of its
//!   rate), QUEEN_BENCH_LIVE_POP replaces queen's pop statement, QUEEN_BENCH_LIVE_PUSH
//!   queen's push statement (its parameters: the payload, the partition),
//!   QUEEN_BENCH_LIVE_CONSUMERS sets the number of consumers (both systems), and
//!   QUEEN_BENCH_LIVE_SHAPES picks the shapes to run (`wanted`; all three without it).
//!
//! Measured per round: messages consumed (acked, committed) and pushed per second; the
//! consumers' batches per second (a queen pop that returned messages, with its acks; a
//! table transaction that deleted rows; empty polls are not batches); the backlog (pushed
//! minus consumed) at the end and at its largest; and for each message
//! pushed within the round the time from its push's commit (when the producer's call
//! returned) to its ack's commit (when the consumer's call returned); a message still not
//! acknowledged when the round ends counts with its age then (a lower bound), so a system
//! that falls behind is not flattered by leaving its slowest messages out.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;
use serde_json::Value;

use crate::{connect, payload, prepared, reset};

const PRODUCERS: usize = 8;
const CONSUMERS: usize = 4;
const PARTITIONS: u64 = 16;
/// How long a table consumer sleeps after finding nothing.
pub const TABLE_IDLE_SLEEP: Duration = Duration::from_millis(5);

/// The consumers of a round: `CONSUMERS`, or QUEEN_BENCH_LIVE_CONSUMERS (experiments
/// only: the report's text still says 4).
fn consumers() -> usize {
    match std::env::var("QUEEN_BENCH_LIVE_CONSUMERS") {
        Ok(v) => v.parse().ok().filter(|&n: &usize| n > 0).expect("QUEEN_BENCH_LIVE_CONSUMERS must be a count above 0"),
        Err(_) => CONSUMERS,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum System {
    Queen,
    Table,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Queen => "queen",
            System::Table => "plain table",
        }
    }
}

/// What one or more rounds of one system measured.
#[derive(Default, Clone)]
pub struct Outcome {
    pub consumed: u64,
    pub pushed: u64,
    /// Consumer cycles that took messages (acked or deleted them) within the round.
    pub batches: u64,
    pub secs: f64,
    /// Backlog when the round ended (over several rounds: the largest of their ends).
    pub backlog_end: u64,
    /// Largest backlog seen during the round (sampled every 100 ms).
    pub backlog_max: u64,
    /// Push commit to ack commit, in ms, one per message pushed in the round (not acked
    /// by its end: its age then).
    pub latencies: Vec<f64>,
}

impl Outcome {
    pub fn consumed_rate(&self) -> f64 {
        self.consumed as f64 / self.secs
    }
    pub fn pushed_rate(&self) -> f64 {
        self.pushed as f64 / self.secs
    }
    pub fn batch_rate(&self) -> f64 {
        self.batches as f64 / self.secs
    }

    pub fn percentile(&self, p: f64) -> f64 {
        let mut v = self.latencies.clone();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() - 1) as f64 * p).round() as usize]
    }
    fn add(&mut self, o: Outcome) {
        self.consumed += o.consumed;
        self.pushed += o.pushed;
        self.batches += o.batches;
        self.secs += o.secs;
        self.backlog_end = self.backlog_end.max(o.backlog_end);
        self.backlog_max = self.backlog_max.max(o.backlog_max);
        self.latencies.extend(o.latencies);
    }
}

/// A statement of queen's in the live rounds, or the one the environment variable `var`
/// gives instead (for experiments), read once.
fn statement(cell: &'static OnceLock<String>, var: &str, default: &str) -> &'static str {
    cell.get_or_init(|| std::env::var(var).unwrap_or_else(|_| default.into()))
}

/// queen's push in the live rounds (QUEEN_BENCH_LIVE_PUSH replaces it).
fn live_push() -> &'static str {
    static PUSH: OnceLock<String> = OnceLock::new();
    statement(&PUSH, "QUEEN_BENCH_LIVE_PUSH", "SELECT 1 FROM queen.push('lq', $1, $2)")
}

/// queen's pop in the live rounds (QUEEN_BENCH_LIVE_POP replaces it).
fn live_pop() -> &'static str {
    static POP: OnceLock<String> = OnceLock::new();
    statement(
        &POP,
        "QUEEN_BENCH_LIVE_POP",
        "SELECT lease_id, payload FROM queen.pop('lq', batch => 10, wait_ms => 200)",
    )
}

/// One round of `system` for `secs`: producers at full speed (`rate` None) or paced to
/// `rate` messages per second in all; every session with `synchronous_commit = off` when
/// `sync_off`.
pub fn round(c: &mut Client, dsn: &str, system: System, secs: f64, rate: Option<f64>, sync_off: bool) -> Outcome {
    reset(c);
    let check = |c: &mut Client| {
        c.batch_execute("VACUUM ANALYZE").unwrap();
        c.batch_execute("CHECKPOINT").unwrap();
    };
    if system == System::Queen {
        // The queue, its 16 partitions and the default group exist before the clock
        // starts (their creation is not what this measures).
        for p in 0..PARTITIONS {
            c.execute("SELECT 1 FROM queen.push('lq', $1, $2)", &[&payload(0), &format!("p{p}")]).unwrap();
        }
        let mut n = 0;
        for _ in 0..100 {
            let rows = c.query("SELECT lease_id FROM queen.pop('lq', batch => 16, max_partitions => 16)", &[]).unwrap();
            n += rows.len();
            let mut leases: Vec<uuid::Uuid> = rows.iter().map(|r| r.get(0)).collect();
            leases.sort();
            leases.dedup();
            for lease in leases {
                c.execute("SELECT queen.ack($1)", &[&lease]).unwrap();
            }
            if n >= PARTITIONS as usize {
                break;
            }
        }
        assert_eq!(n, PARTITIONS as usize, "the warm-up messages");
    }
    check(c);
    // Per message (by its orderId, from 1): when its push returned and when its ack did, in
    // microseconds since `t0` (0: not yet).
    let cap = (secs * 200_000.0) as usize + 100_000;
    let pushed_at: Arc<Vec<AtomicU64>> = Arc::new((0..cap).map(|_| AtomicU64::new(0)).collect());
    let acked_at: Arc<Vec<AtomicU64>> = Arc::new((0..cap).map(|_| AtomicU64::new(0)).collect());
    let next_id = Arc::new(AtomicU64::new(1));
    let pushed = Arc::new(AtomicU64::new(0));
    let consumed = Arc::new(AtomicU64::new(0));
    let batches = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let consumers = consumers();
    let ready = Arc::new(Barrier::new(PRODUCERS + consumers + 1));
    let clock: Arc<Mutex<Option<(Instant, Instant)>>> = Arc::new(Mutex::new(None));
    let micros = |t0: Instant| t0.elapsed().as_micros() as u64 + 1;
    let dsn = if sync_off { crate::sync_off(dsn) } else { dsn.to_string() };
    let dsn = dsn.as_str();
    let mut handles = Vec::new();
    for k in 0..PRODUCERS {
        let (dsn, pushed_at, next_id, pushed, stop, ready, clock) = (
            dsn.to_string(),
            pushed_at.clone(),
            next_id.clone(),
            pushed.clone(),
            stop.clone(),
            ready.clone(),
            clock.clone(),
        );
        handles.push(thread::spawn(move || {
            let mut c = connect(&dsn);
            let sql = match system {
                System::Queen => live_push(),
                System::Table => "INSERT INTO bench_jobs (payload) VALUES ($1)",
            };
            let stmt = prepared(&mut c, sql);
            ready.wait();
            let (t0, deadline) = clock.lock().unwrap().expect("clock");
            // Paced: each producer sends one message every `every`, offset by its number.
            let every = rate.map(|r| Duration::from_secs_f64(PRODUCERS as f64 / r));
            let mut next = t0 + every.map_or(Duration::ZERO, |e| e * k as u32 / PRODUCERS as u32);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Some(e) = every {
                    let now = Instant::now();
                    if next > now {
                        thread::sleep(next - now);
                    } else if now - next > Duration::from_secs(1) {
                        next = now; // far behind: no burst to catch up
                    }
                    next += e;
                }
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                assert!((id as usize) < pushed_at.len(), "more than {} pushes in a round", pushed_at.len());
                match system {
                    System::Queen => {
                        let partition = format!("p{}", (k as u64 * 7 + i) % PARTITIONS);
                        c.execute(&stmt, &[&payload(id), &partition]).unwrap()
                    }
                    System::Table => c.execute(&stmt, &[&payload(id)]).unwrap(),
                };
                let now = Instant::now();
                pushed_at[id as usize].store(micros(t0), Ordering::Relaxed);
                if now <= deadline {
                    pushed.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        }));
    }
    for _ in 0..consumers {
        let (dsn, acked_at, consumed, batches, stop, ready, clock) = (
            dsn.to_string(),
            acked_at.clone(),
            consumed.clone(),
            batches.clone(),
            stop.clone(),
            ready.clone(),
            clock.clone(),
        );
        handles.push(thread::spawn(move || {
            let mut c = connect(&dsn);
            let (pop, ack) = match system {
                System::Queen => (prepared(&mut c, live_pop()), prepared(&mut c, "SELECT queen.ack($1)")),
                System::Table => (
                    prepared(&mut c, "SELECT id, payload FROM bench_jobs ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED"),
                    prepared(&mut c, "DELETE FROM bench_jobs WHERE id = ANY($1)"),
                ),
            };
            ready.wait();
            let (t0, deadline) = clock.lock().unwrap().expect("clock");
            let order_id = |v: &Value| v["orderId"].as_u64().expect("the bench's payload has an orderId") as usize;
            while !stop.load(Ordering::Relaxed) {
                let ids: Vec<usize> = match system {
                    System::Queen => {
                        let rows = c.query(&pop, &[]).unwrap();
                        let mut leases: Vec<uuid::Uuid> = rows.iter().map(|r| r.get(0)).collect();
                        leases.sort();
                        leases.dedup();
                        for lease in leases {
                            c.execute(&ack, &[&lease]).unwrap();
                        }
                        rows.iter().map(|r| order_id(&r.get::<_, Value>(1))).collect()
                    }
                    System::Table => {
                        let mut tx = c.transaction().unwrap();
                        let rows = tx.query(&pop, &[]).unwrap();
                        if rows.is_empty() {
                            tx.rollback().unwrap();
                            thread::sleep(TABLE_IDLE_SLEEP);
                            continue;
                        }
                        let keys: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                        tx.execute(&ack, &[&keys]).unwrap();
                        tx.commit().unwrap();
                        rows.iter().map(|r| order_id(&r.get::<_, Value>(1))).collect()
                    }
                };
                if ids.is_empty() {
                    continue;
                }
                let now = Instant::now();
                let at = micros(t0);
                for id in &ids {
                    if let Some(slot) = acked_at.get(*id) {
                        slot.store(at, Ordering::Relaxed);
                    }
                }
                if now <= deadline {
                    consumed.fetch_add(ids.len() as u64, Ordering::Relaxed);
                    batches.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(secs);
    *clock.lock().unwrap() = Some((t0, deadline));
    ready.wait();
    let mut backlog_max = 0;
    while Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
        let backlog = pushed.load(Ordering::Relaxed).saturating_sub(consumed.load(Ordering::Relaxed));
        backlog_max = backlog_max.max(backlog);
    }
    let (p, k, b) = (pushed.load(Ordering::Relaxed), consumed.load(Ordering::Relaxed), batches.load(Ordering::Relaxed));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    // Latencies of the messages pushed within the round: to their ack, or, not acked by
    // the round's end, to the end (their age then: a lower bound).
    let end = (secs * 1e6) as u64 + 1;
    let latencies = pushed_at
        .iter()
        .zip(acked_at.iter())
        .filter_map(|(p, a)| {
            let (p, a) = (p.load(Ordering::Relaxed), a.load(Ordering::Relaxed));
            let done = if a == 0 || a > end { end } else { a };
            // A consumer may ack a message before its producer's call has returned (the
            // commit is visible first): such a message's latency is counted as 0.
            (p != 0 && p <= end).then(|| done.saturating_sub(p) as f64 / 1000.0)
        })
        .collect();
    Outcome {
        consumed: k,
        pushed: p,
        batches: b,
        secs,
        backlog_end: p.saturating_sub(k),
        backlog_max: backlog_max.max(p.saturating_sub(k)),
        latencies,
    }
}

/// A shape of the live rounds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Shape {
    /// Producers at full speed, every commit waiting for its WAL flush.
    Flush,
    /// Producers paced to half the table's flush-bound rate.
    Half,
    /// Producers at full speed, `synchronous_commit = off`.
    Cpu,
}

/// Whether the run includes `shape`: every shape, unless QUEEN_BENCH_LIVE_SHAPES
/// (experiments) names some of `flush`, `half` and `cpu`, comma separated. A shape not
/// run prints no rows and its targets read "not run".
pub fn wanted(shape: Shape) -> bool {
    static SHAPES: std::sync::OnceLock<Vec<Shape>> = std::sync::OnceLock::new();
    SHAPES
        .get_or_init(|| {
            let Ok(list) = std::env::var("QUEEN_BENCH_LIVE_SHAPES") else {
                return vec![Shape::Flush, Shape::Half, Shape::Cpu];
            };
            let shapes: Vec<Shape> = list
                .split(',')
                .map(|name| match name.trim() {
                    "flush" => Shape::Flush,
                    "half" => Shape::Half,
                    "cpu" => Shape::Cpu,
                    other => panic!("QUEEN_BENCH_LIVE_SHAPES: {other:?} is not one of flush, half and cpu"),
                })
                .collect();
            assert!(
                !shapes.contains(&Shape::Half) || shapes.contains(&Shape::Flush),
                "QUEEN_BENCH_LIVE_SHAPES: half takes its rate from flush, which must run too"
            );
            shapes
        })
        .contains(&shape)
}

/// `rounds` rounds of each system, alternating (queen first in odd rounds); prints every
/// round under `label`; returns queen's and the table's totals.
pub fn alternate(
    c: &mut Client,
    dsn: &str,
    label: &str,
    rounds: usize,
    secs: f64,
    rate: Option<f64>,
    sync_off: bool,
) -> [Outcome; 2] {
    let mut out = [Outcome::default(), Outcome::default()];
    // QUEEN_BENCH_LIVE_SYSTEM=queen (or table): that system's rounds only, for a profile.
    let only = std::env::var("QUEEN_BENCH_LIVE_SYSTEM").ok();
    assert!(
        only.as_deref().is_none_or(|o| o == "queen" || o == "table"),
        "QUEEN_BENCH_LIVE_SYSTEM must be queen or table"
    );
    for r in 0..rounds {
        let order = if r % 2 == 0 { [System::Queen, System::Table] } else { [System::Table, System::Queen] };
        for system in order {
            let key = match system {
                System::Queen => "queen",
                System::Table => "table",
            };
            if only.as_deref().is_some_and(|o| o != key) {
                continue;
            }
            let o = round(c, dsn, system, secs, rate, sync_off);
            println!(
                "  ({label}, round {}: {:<11} consumed {:>6.0}/s, pushed {:>6.0}/s, batches {:>5.0}/s of {:.1}, backlog end {:>6} max {:>6}, p50 {:.2} ms p99 {:.2} ms)",
                r + 1,
                system.name(),
                o.consumed_rate(),
                o.pushed_rate(),
                o.batch_rate(),
                o.consumed as f64 / o.batches.max(1) as f64,
                o.backlog_end,
                o.backlog_max,
                o.percentile(0.5),
                o.percentile(0.99)
            );
            let slot = match system {
                System::Queen => 0,
                System::Table => 1,
            };
            out[slot].add(o);
        }
    }
    out
}
