//! queen-bench: queen side by side with PgQ, a SKIP LOCKED job table (the pgmq / pg-boss /
//! River pattern) and the raw row-insert limit, on one cluster with one set of settings.
//!
//! `queen-bench --dsn DSN [--pooler-dsn DSN] [--smoke] [--out BENCHMARKS.md] [--only a,b]
//! [--held-minutes N]`.
//! `--smoke` runs every scenario for a moment on tiny sizes, with no thresholds: it keeps
//! the bench from rotting. The held-snapshot scenario (`held.rs`, half an hour) runs only
//! when asked for (`--only held`, `make bench-held`) or in the smoke run; it writes its own
//! section of the output file and leaves the rest as it was (and the others leave it).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use serde_json::{json, Value};

mod held;
mod interleave;
mod live;
mod rotation;

struct Opts {
    dsn: String,
    smoke: bool,
    out: Option<String>,
    /// Scenario groups to run (push1, push1cpu, push1000, pop, pop1, limit, live, fanout,
    /// wake, disk, disk1, scaling, rotation, held); all but held if empty.
    only: Vec<String>,
    /// Minutes per held-snapshot run.
    held_minutes: usize,
    /// Systems of the held-snapshot scenario (queen, skip, pgq); all if empty.
    held_systems: Vec<String>,
    /// The same database through PgBouncer (transaction pooling), for the wake scenario.
    pooler_dsn: Option<String>,
}

/// Sizes of a run: the full bench or the smoke run.
struct Sizes {
    secs: f64,
    pop_prefill: usize,
    wake_samples: usize,
    disk_messages: usize,
    big_backlog: usize,
    partitions_many: usize,
}

struct Row {
    scenario: &'static str,
    system: &'static str,
    value: f64,
    unit: &'static str,
    /// CPU the bench client itself used during the measurement, in cores (of 2).
    client_cores: Option<f64>,
}

/// CPU seconds this process (the client, all threads) has used so far.
fn client_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name: utime and stime are the 12th and 13th.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 =
        f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0) + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

static LAST_CLIENT_CORES: std::sync::Mutex<Option<f64>> = std::sync::Mutex::new(None);

/// `dsn` with `synchronous_commit = off` for every session it opens (the CPU-bound
/// scenarios).
fn sync_off(dsn: &str) -> String {
    format!("{dsn} options='-c synchronous_commit=off'")
}

fn connect(dsn: &str) -> Client {
    Client::connect(dsn, NoTls).unwrap_or_else(|e| panic!("connect {dsn}: {e}"))
}

/// A ~200-byte JSON payload.
fn payload(i: u64) -> Value {
    json!({
        "orderId": i,
        "customer": format!("customer-{:08}", i % 100_000),
        "items": [{"sku": "SKU-12345", "qty": 2, "price": 19.99}, {"sku": "SKU-67890", "qty": 1, "price": 5.5}],
        "currency": "EUR",
        "note": "deliver to the back door, ring twice",
    })
}

fn reset(c: &mut Client) {
    // QUEEN_BENCH_VERSION: an older version's script (with its library installed), for
    // before-and-after figures in one run of the same bench.
    let create = match std::env::var("QUEEN_BENCH_VERSION") {
        Ok(v) => format!("CREATE EXTENSION queen VERSION '{}'", v.replace('\'', "")),
        Err(_) => "CREATE EXTENSION queen".to_string(),
    };
    c.batch_execute("SET client_min_messages = warning; DROP EXTENSION IF EXISTS queen CASCADE;").unwrap();
    c.batch_execute(&create).unwrap();
    c.batch_execute(
        "DROP TABLE IF EXISTS bench_jobs, bench_raw;
         CREATE TABLE bench_jobs (id bigserial PRIMARY KEY, payload jsonb NOT NULL,
                                  created_at timestamptz NOT NULL DEFAULT now());
         CREATE TABLE bench_raw (id bigserial PRIMARY KEY, payload jsonb NOT NULL);
         CREATE EXTENSION IF NOT EXISTS pgq;",
    )
    .unwrap();
    let exists: bool =
        c.query_one("SELECT EXISTS (SELECT 1 FROM pgq.queue WHERE queue_name = 'bq')", &[]).unwrap().get(0);
    if exists {
        c.batch_execute("SELECT pgq.unregister_consumer('bq', 'c'); SELECT pgq.drop_queue('bq');").unwrap();
    }
    c.batch_execute(
        "SELECT pgq.create_queue('bq');
         SELECT pgq.register_consumer('bq', 'c');
         CHECKPOINT;",
    )
    .unwrap();
}

/// Runs `clients` threads for `secs`, each calling `step` (which returns how many
/// messages it moved) in a loop; returns messages per second.
fn run_clients<F>(dsn: &str, clients: usize, secs: f64, step: F) -> f64
where
    F: Fn(&mut Client, usize, u64) -> usize + Send + Sync + 'static,
{
    let step = Arc::new(step);
    let total = Arc::new(AtomicU64::new(0));
    // Connect first; the clock starts when every client is connected.
    let ready = Arc::new(std::sync::Barrier::new(clients + 1));
    let start_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let handles: Vec<_> = (0..clients)
        .map(|k| {
            let (step, total, dsn, ready, start_at) =
                (step.clone(), total.clone(), dsn.to_string(), ready.clone(), start_at.clone());
            thread::spawn(move || {
                let mut c = connect(&dsn);
                ready.wait();
                let start = start_at.lock().unwrap().expect("start time");
                let deadline = start + Duration::from_secs_f64(secs);
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let n = step(&mut c, k, i);
                    if n == 0 {
                        break; // nothing left to consume
                    }
                    total.fetch_add(n as u64, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    let start = Instant::now();
    let cpu0 = client_cpu_seconds();
    *start_at.lock().unwrap() = Some(start);
    ready.wait();
    for h in handles {
        h.join().unwrap();
    }
    let wall = start.elapsed().as_secs_f64();
    *LAST_CLIENT_CORES.lock().unwrap() = Some((client_cpu_seconds() - cpu0) / wall);
    if std::env::var_os("QUEEN_BENCH_DEBUG").is_some() {
        eprintln!("  [{} messages in {wall:.2} s]", total.load(Ordering::Relaxed));
    }
    total.load(Ordering::Relaxed) as f64 / wall
}

fn queen_items(queue: &str, partition: &str, n: usize, base: u64) -> Value {
    Value::Array(
        (0..n as u64).map(|i| json!({"queue": queue, "partition": partition, "payload": payload(base + i)})).collect(),
    )
}

/// Fills queen queue `bq` with `n` messages over `partitions` partitions (push_batch of up
/// to 1,000, one partition per call).
fn prefill_queen(c: &mut Client, n: usize, partitions: usize) {
    let per = n / partitions;
    for p in 0..partitions {
        let mut left = per;
        while left > 0 {
            let k = left.min(1000);
            c.execute("SELECT count(*) FROM queen.push_batch($1)", &[&queen_items("bq", &format!("p{p}"), k, 0)])
                .unwrap();
            left -= k;
        }
    }
    c.batch_execute("VACUUM ANALYZE").unwrap();
}

thread_local! {
    /// Statements prepared on this thread's connection (each client thread has its own).
    static PREPARED: std::cell::RefCell<std::collections::HashMap<&'static str, postgres::Statement>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// `sql` prepared once per client connection, as a driver's statement cache does: every
/// system measured gets the same treatment.
fn prepared(c: &mut Client, sql: &'static str) -> postgres::Statement {
    PREPARED.with(|p| p.borrow_mut().entry(sql).or_insert_with(|| c.prepare(sql).unwrap()).clone())
}

fn queen_pop_ack(c: &mut Client) -> usize {
    let pop = prepared(c, "SELECT lease_id FROM queen.pop('bq', batch => 100)");
    let rows = c.query(&pop, &[]).unwrap();
    if rows.is_empty() {
        return 0;
    }
    let lease: uuid::Uuid = rows[0].get(0);
    let ack = prepared(c, "SELECT queen.ack($1)");
    c.execute(&ack, &[&lease]).unwrap();
    rows.len()
}

/// One message: `queen.pop` with its default batch of 1, then an ack of its lease.
fn queen_pop1_ack(c: &mut Client) -> usize {
    let pop = prepared(c, "SELECT lease_id FROM queen.pop('bq')");
    let Some(row) = c.query_opt(&pop, &[]).unwrap() else { return 0 };
    let lease: uuid::Uuid = row.get(0);
    let ack = prepared(c, "SELECT queen.ack($1)");
    c.execute(&ack, &[&lease]).unwrap();
    1
}

/// pop + ack rate with 4 consumers, each call `step` (`queen_pop_ack`, `queen_pop1_ack`),
/// over whatever backlog `bq` holds.
fn queen_consume(dsn: &str, secs: f64, step: fn(&mut Client) -> usize) -> f64 {
    // Create the consumer group first (one message): a group's first pops race to create
    // it, and a pop that loses that race returns no rows, which would end a client early.
    // (On a thread of its own: prepared statements belong to one connection.)
    let dsn2 = dsn.to_string();
    thread::spawn(move || step(&mut connect(&dsn2))).join().unwrap();
    run_clients(dsn, 4, secs, move |c, _, _| step(c))
}

/// The SKIP LOCKED table's pop + ack: claims up to 100 rows and deletes them.
fn skip_claim_100(c: &mut Client) -> usize {
    let claim = prepared(c, "SELECT id, payload FROM bench_jobs ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED");
    let delete = prepared(c, "DELETE FROM bench_jobs WHERE id = ANY($1)");
    let mut tx = c.transaction().unwrap();
    let ids: Vec<i64> = tx.query(&claim, &[]).unwrap().iter().map(|r| r.get(0)).collect();
    if ids.is_empty() {
        return 0;
    }
    tx.execute(&delete, &[&ids]).unwrap();
    tx.commit().unwrap();
    ids.len()
}

/// The SKIP LOCKED table's pop + ack of one message: claims one row and deletes it.
fn skip_claim_1(c: &mut Client) -> usize {
    let claim = prepared(c, "SELECT id, payload FROM bench_jobs ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED");
    let delete = prepared(c, "DELETE FROM bench_jobs WHERE id = $1");
    let mut tx = c.transaction().unwrap();
    let Some(row) = tx.query_opt(&claim, &[]).unwrap() else { return 0 };
    let id: i64 = row.get(0);
    tx.execute(&delete, &[&id]).unwrap();
    tx.commit().unwrap();
    1
}

/// queen's and the SKIP LOCKED table's pop + ack (`steps`, queen's first), 4 consumers
/// each, in alternating drains of `prefill` messages (queen's over 16 partitions),
/// `repeats` each: every run is printed under `label`; returns each system's median rate
/// and its median client CPU, queen's first.
fn alternate_drains(
    c: &mut Client,
    dsn: &str,
    secs: f64,
    repeats: usize,
    prefill: usize,
    label: &str,
    steps: [fn(&mut Client) -> usize; 2],
) -> [(f64, f64); 2] {
    let [queen, skip] = steps;
    let (mut queen_runs, mut skip_runs) = (Vec::new(), Vec::new());
    let (mut queen_cpu, mut skip_cpu) = (Vec::new(), Vec::new());
    for r in 0..repeats {
        // Queen first in even repeats, the table first in odd ones.
        for queen_turn in if r % 2 == 0 { [true, false] } else { [false, true] } {
            reset(c);
            if queen_turn {
                prefill_queen(c, prefill, 16);
                queen_runs.push(queen_consume(dsn, secs, queen));
                queen_cpu.push(LAST_CLIENT_CORES.lock().unwrap().take().unwrap_or(f64::NAN));
            } else {
                // The same payload as `payload(i)`.
                c.execute(
                    "INSERT INTO bench_jobs (payload) SELECT jsonb_build_object('orderId', i, 'customer', 'customer-' || lpad((i % 100000)::text, 8, '0'),
                       'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-12345', 'qty', 2, 'price', 19.99),
                                                  jsonb_build_object('sku', 'SKU-67890', 'qty', 1, 'price', 5.5)),
                       'currency', 'EUR', 'note', 'deliver to the back door, ring twice') FROM generate_series(1, $1::int) i",
                    &[&(prefill as i32)],
                )
                .unwrap();
                c.batch_execute("VACUUM ANALYZE").unwrap();
                skip_runs.push(run_clients(dsn, 4, secs, move |c, _, _| skip(c)));
                skip_cpu.push(LAST_CLIENT_CORES.lock().unwrap().take().unwrap_or(f64::NAN));
            }
        }
    }
    println!(
        "  ({label} runs: queen {:?}, skip-locked {:?})",
        queen_runs.iter().map(|v| *v as i64).collect::<Vec<_>>(),
        skip_runs.iter().map(|v| *v as i64).collect::<Vec<_>>()
    );
    [(median(&mut queen_runs), median(&mut queen_cpu)), (median(&mut skip_runs), median(&mut skip_cpu))]
}

fn pgq_prefill(c: &mut Client, n: usize) {
    // One tick per 100 events, so that PgQ batches are the size of the others' batches.
    let chunks = n / 100;
    for _ in 0..chunks {
        c.batch_execute(
            "SELECT count(pgq.insert_event('bq', 'ev', (jsonb_build_object('orderId', i, 'customer', 'customer-' || lpad(i::text, 8, '0'),
                     'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-12345', 'qty', 2, 'price', 19.99)),
                     'currency', 'EUR', 'note', 'deliver to the back door, ring twice'))::text))
               FROM generate_series(1, 100) i;
             SELECT pgq.force_tick('bq');
             SELECT pgq.ticker('bq');",
        )
        .unwrap();
    }
}

fn pgq_consume_one(c: &mut Client) -> usize {
    let next = prepared(c, "SELECT pgq.next_batch('bq', 'c')");
    let batch: Option<i64> = c.query_one(&next, &[]).unwrap().get(0);
    let Some(batch) = batch else { return 0 };
    let events = prepared(c, "SELECT ev_id, ev_data FROM pgq.get_batch_events($1)");
    let n = c.query(&events, &[&batch]).unwrap().len();
    let finish = prepared(c, "SELECT pgq.finish_batch($1)");
    c.execute(&finish, &[&batch]).unwrap();
    n.max(1)
}

/// Where the held-snapshot section of the output file starts.
const HELD_MARK: &str = "<!-- held snapshot: written by make bench-held -->\n";

/// Drains per system in the pop + ack scenario (the median counts), and drains of each
/// kind in the 10 vs many partitions scaling scenario (the paired ratio counts).
const POP_REPEATS: usize = 3;
/// Rounds of each system in the live-queue scenarios (alternating; each `secs` long).
const LIVE_ROUNDS: usize = 4;

/// Slices of the single-push scenario, alone (`interleave`): each system's slice lasts
/// `PUSH1_SLICE` s, and there are `PUSH1_ROUNDS` rounds of one slice per system.
const PUSH1_SLICE: f64 = 1.0;
const PUSH1_ROUNDS: usize = 40;

/// Runs of each head-to-head pair of the single-push scenario (the median counts).
const HEAD_TO_HEAD_REPEATS: usize = 3;

/// Between two measured runs: waits (at most 30 s) until queen's background worker has
/// compacted the fresh tier, then takes a CHECKPOINT, so that no run pays for the work the
/// one before it left (compaction done while a run lasts counts against queen).
/// Returns how long it waited (seconds).
fn settle(c: &mut Client) -> f64 {
    let start = Instant::now();
    // An older version under test (QUEEN_BENCH_VERSION) may have no fresh tier.
    let tiered: bool = c.query_one("SELECT to_regclass('queen.fresh_segments') IS NOT NULL", &[]).unwrap().get(0);
    while tiered && start.elapsed() < Duration::from_secs(30) {
        let left: i64 = c.query_one("SELECT count(*) FROM queen.fresh_segments", &[]).unwrap().get(0);
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let waited = start.elapsed().as_secs_f64();
    c.batch_execute("CHECKPOINT").unwrap();
    waited
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

fn fmt_rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{:.0}", v)
    } else {
        format!("{:.2}", v)
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").parse::<u64>().unwrap_or(0) / 1024 / 1024)
        })
        .unwrap_or(0);
    let cores = thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    // With autogroups, the kernel shares the CPUs between sessions first: the bench client
    // and the server (pg_ctl starts it in a session of its own) are two groups, which
    // changes the CPU-bound live rounds (BENCHMARKS.md, the live queue's tenth round).
    let autogroup = std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .map(|s| format!(", kernel.sched_autogroup_enabled = {}", s.trim()))
        .unwrap_or_default();
    format!("{cores} cores ({cpu}), {mem} GiB RAM{autogroup}")
}

/// Wake latency samples in ms: a pop waits (`wait_ms`) on one connection, a push commits
/// on another, and the time from the push's commit to the pop's return is recorded.
/// `unnamed` sends every statement as one unnamed statement (`query_typed`), as a client
/// must through a transaction-pooling PgBouncer; otherwise statements are prepared once.
fn wake_latencies(dsn: &str, samples: usize, unnamed: bool) -> Vec<f64> {
    const WAIT: &str = "SELECT 1 FROM queen.pop('wake', auto_ack => true, wait_ms => 5000)";
    const PUSH: &str = "SELECT 1 FROM queen.push('wake', '1')";
    let run = |c: &mut Client, stmt: Option<&postgres::Statement>, sql: &str| -> usize {
        match stmt {
            Some(st) => c.query(st, &[]).unwrap().len(),
            None => c.query_typed(sql, &[]).unwrap().len(),
        }
    };
    let (tx_ret, rx_ret) = mpsc::channel::<Instant>();
    let (tx_go, rx_go) = mpsc::channel::<()>();
    let dsn2 = dsn.to_string();
    let waiter = thread::spawn(move || {
        let mut c = connect(&dsn2);
        let stmt = (!unnamed).then(|| c.prepare(WAIT).unwrap());
        for _ in 0..samples {
            tx_go.send(()).unwrap();
            let n = run(&mut c, stmt.as_ref(), WAIT);
            assert_eq!(n, 1, "waiting pop returned empty");
            tx_ret.send(Instant::now()).unwrap();
        }
    });
    let mut c = connect(dsn);
    let push = (!unnamed).then(|| c.prepare(PUSH).unwrap());
    let mut lat = Vec::with_capacity(samples);
    for _ in 0..samples {
        rx_go.recv().unwrap();
        thread::sleep(Duration::from_millis(3)); // let the waiter park
        run(&mut c, push.as_ref(), PUSH);
        let committed = Instant::now();
        let returned = rx_ret.recv().unwrap();
        lat.push(returned.saturating_duration_since(committed).as_secs_f64() * 1000.0);
    }
    waiter.join().unwrap();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    lat
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut opts = Opts {
        dsn: String::new(),
        smoke: false,
        out: None,
        only: Vec::new(),
        held_minutes: 5,
        held_systems: Vec::new(),
        pooler_dsn: None,
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dsn" => opts.dsn = args.next().expect("--dsn DSN"),
            "--smoke" => opts.smoke = true,
            "--out" => opts.out = args.next(),
            "--pooler-dsn" => opts.pooler_dsn = args.next(),
            "--only" => opts.only = args.next().expect("--only a,b").split(',').map(str::to_string).collect(),
            "--held-systems" => {
                opts.held_systems = args.next().expect("--held-systems a,b").split(',').map(str::to_string).collect()
            }
            "--held-minutes" => opts.held_minutes = args.next().and_then(|m| m.parse().ok()).expect("--held-minutes N"),
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(!opts.dsn.is_empty(), "usage: queen-bench --dsn DSN [--smoke] [--out FILE]");
    let s = if opts.smoke {
        Sizes {
            secs: 0.5,
            pop_prefill: 3_200,
            wake_samples: 20,
            disk_messages: 4_000,
            big_backlog: 8_000,
            partitions_many: 200,
        }
    } else {
        Sizes {
            secs: 10.0,
            pop_prefill: 500_000,
            wake_samples: 1_000,
            disk_messages: 200_000,
            big_backlog: 5_000_000,
            partitions_many: 10_000,
        }
    };
    let dsn = opts.dsn.clone();
    let want = |g: &str| (opts.only.is_empty() && g != "held") || opts.only.iter().any(|o| o == g);
    let held_on = want("held") || (opts.smoke && opts.only.is_empty());
    let others_on = [
        "push1", "push1cpu", "push1000", "pop", "pop1", "limit", "live", "fanout", "wake", "disk", "disk1", "scaling",
        "rotation",
    ]
    .iter()
    .any(|g| want(g));
    let mut jsonb_floor = f64::NAN;
    let mut single_bytes = f64::NAN;
    // queen one partition / PgQ, / INSERT, then 16 partitions / PgQ, / INSERT (alone,
    // interleaved: the rates over every slice), with the low end of each 90 % interval
    // (`interleave::Tally::ratio_to`).
    let mut push1_ratio = [(f64::NAN, f64::NAN); 4];
    // The same four ratios head to head (both systems at once, 4 clients each).
    let mut head_to_head: Vec<f64> = Vec::new();
    // pop + ack, many partitions over 10 partitions (paired).
    let mut many_over_few = f64::NAN;
    // pop + ack one message per call: queen, the SKIP LOCKED table.
    let (mut queen_pop1, mut skip_pop1) = (f64::NAN, f64::NAN);
    // The same with `synchronous_commit = off` (CPU-bound).
    let (mut queen_pop1_cpu, mut skip_pop1_cpu) = (f64::NAN, f64::NAN);
    // Single pushes CPU-bound, queen's rate over a plain INSERT's.
    let (mut push1_cpu, mut send1_cpu) = (f64::NAN, f64::NAN);
    let (mut queen_push1000, mut raw_insert, mut queen_pop, mut skip_pop, mut fan_rate, mut push_rate) =
        (f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN);
    let (mut queen_bytes, mut raw_bytes, mut small_backlog, mut big_backlog, mut few, mut many) =
        (f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN);
    let mut lat: Vec<f64> = vec![f64::NAN];
    let mut c = connect(&dsn);
    let mut rows: Vec<Row> = Vec::new();
    let say = |rows: &mut Vec<Row>, scenario, system, value, unit| {
        let client_cores = LAST_CLIENT_CORES.lock().unwrap().take();
        let cpu = client_cores.map(|c| format!("  (client CPU {c:.2} cores)")).unwrap_or_default();
        println!("{scenario:<44} {system:<22} {:>12} {unit}{cpu}", fmt_rate(value));
        rows.push(Row { scenario, system, value, unit, client_cores });
    };

    if want("push1") {
        // ---- push, batch 1, 8 clients: one message per transaction, as most applications
        // enqueue. The shape a newcomer starts with: every push to the queue's default
        // partition; then the same over 16 partitions. The baselines have no partitions: PgQ's
        // insert_event and a plain INSERT into an indexed bigserial + jsonb table. Each is
        // measured alone, the four interleaved in slices (`interleave`): single pushes are
        // bound by the WAL flush, whose speed drifts over a run.
        reset(&mut c);
        type Step = Box<dyn Fn(&mut Client, usize, u64) -> usize + Send + Sync>;
        let systems: Vec<fn() -> Step> = vec![
            || {
                Box::new(|c: &mut Client, _, i| {
                    let push = prepared(c, "SELECT 1 FROM queen.push('bq', $1)");
                    c.execute(&push, &[&payload(i)]).unwrap();
                    1
                })
            },
            || {
                Box::new(|c: &mut Client, _, i| {
                    let insert = prepared(c, "INSERT INTO bench_jobs (payload) VALUES ($1)");
                    c.execute(&insert, &[&payload(i)]).unwrap();
                    1
                })
            },
            || {
                Box::new(|c: &mut Client, _, i| {
                    let insert = prepared(c, "SELECT pgq.insert_event('bq', 'ev', $1::jsonb::text)");
                    c.execute(&insert, &[&payload(i)]).unwrap();
                    1
                })
            },
            || {
                Box::new(|c: &mut Client, k, i| {
                    let push = prepared(c, "SELECT 1 FROM queen.push('bq', $1, $2)");
                    c.execute(&push, &[&payload(i), &format!("p{}", (k as u64 * 7 + i) % 16)]).unwrap();
                    1
                })
            },
        ];
        // Alone, interleaved (`interleave`): each system keeps 8 clients connected and the
        // four take turns in slices of `PUSH1_SLICE` s. The worker's compaction is paused
        // meanwhile: after each queen slice the bench compacts what it pushed, with
        // `queen.compact`, vacuums the fresh tier as the worker would, and adds the time
        // those take to queen's slice.
        let tiered: bool = c
            .query_one(
                "SELECT to_regclass('queen.fresh_segments') IS NOT NULL
                    AND current_setting('queen.compaction_interval', true) IS NOT NULL",
                &[],
            )
            .unwrap()
            .get(0);
        // Whatever happens (a panic included), the worker's compaction is turned on again.
        struct Paused(Option<String>);
        impl Drop for Paused {
            fn drop(&mut self) {
                if let Some(dsn) = self.0.take() {
                    if let Ok(mut c) = Client::connect(&dsn, NoTls) {
                        let _ = c.batch_execute("ALTER SYSTEM RESET queen.compaction_interval");
                        let _ = c.batch_execute("SELECT pg_reload_conf()");
                    }
                }
            }
        }
        let mut paused = Paused(None);
        if tiered {
            c.batch_execute("ALTER SYSTEM SET queen.compaction_interval = 0").unwrap();
            paused.0 = Some(dsn.clone());
            c.batch_execute("SELECT pg_reload_conf()").unwrap();
            settle(&mut c);
        }
        let compact = |c: &mut Client| {
            let start = Instant::now();
            if tiered {
                c.batch_execute("SELECT queen.compact('bq')").unwrap();
                c.batch_execute("VACUUM (INDEX_CLEANUP ON, TRUNCATE OFF, SKIP_LOCKED) queen.fresh_segments").unwrap();
                // VACUUM's WAL is written in the background; a commit with an xid flushes
                // it now, inside queen's time, not in the next system's slice.
                c.batch_execute("SELECT txid_current()").unwrap();
            }
            start.elapsed().as_secs_f64()
        };
        let steps: Vec<interleave::Step> = systems.iter().map(|mk| interleave::Step::from(mk())).collect();
        let (slice, rounds) = if opts.smoke { (0.3, 1) } else { (PUSH1_SLICE, PUSH1_ROUNDS) };
        let cc = std::cell::RefCell::new(&mut c);
        let tallies = interleave::run(
            &dsn,
            8,
            steps,
            slice,
            rounds,
            || {
                let c = &mut **cc.borrow_mut();
                compact(c);
                c.batch_execute("CHECKPOINT").unwrap();
            },
            |k| if k == 0 || k == 3 { compact(&mut cc.borrow_mut()) } else { 0.0 },
        );
        drop(paused);
        let pairs = [(0, 2), (0, 1), (3, 2), (3, 1)];
        let labels = ["one partition / PgQ", "one partition / INSERT", "16 partitions / PgQ", "16 partitions / INSERT"];
        for (k, (&(a, b), label)) in pairs.iter().zip(labels).enumerate() {
            let mut r: Vec<f64> =
                tallies[a].round_rates().iter().zip(tallies[b].round_rates()).map(|(x, y)| x / y).collect();
            r.sort_by(|x, y| x.partial_cmp(y).unwrap_or(std::cmp::Ordering::Equal));
            let q = |p: f64| r[((r.len() - 1) as f64 * p).round() as usize];
            let (whole, lo, hi) = tallies[a].ratio_to(&tallies[b]);
            push1_ratio[k] = (whole, lo);
            println!(
                "  (push 1 alone, {label}: {whole:.3} over every slice, 90 % interval {lo:.3} .. {hi:.3} (rounds resampled); per round: median {:.3}, quartiles {:.3} .. {:.3}, range {:.3} .. {:.3})",
                q(0.5),
                q(0.25),
                q(0.75),
                q(0.0),
                q(1.0)
            );
        }
        // Head to head: queen and a baseline at the same time, 4 clients each, so that every
        // WAL flush carries commits of both and the flush speed's drift cancels out. Not the
        // scenario of the targets (each system alone with 8 clients); shown beside it.
        let mut settled: Vec<f64> = Vec::new();
        for (pair, label) in pairs.iter().zip(labels) {
            let mut ratios = Vec::new();
            for _ in 0..if opts.smoke { 1 } else { HEAD_TO_HEAD_REPEATS } {
                settled.push(settle(&mut c));
                let (a, b) = (systems[pair.0], systems[pair.1]);
                let (da, db) = (dsn.clone(), dsn.clone());
                let secs = s.secs;
                let ta = thread::spawn(move || {
                    let step = a();
                    run_clients(&da, 4, secs, move |c, n, i| step(c, n, i))
                });
                let step = b();
                let vb = run_clients(&db, 4, secs, move |c, n, i| step(c, n, i));
                let va = ta.join().unwrap();
                LAST_CLIENT_CORES.lock().unwrap().take();
                ratios.push(va / vb);
            }
            let shown: Vec<f64> = ratios.iter().map(|v| (v * 1000.0).round() / 1000.0).collect();
            let m = median(&mut ratios);
            println!("  (push 1 head to head, {label}: {shown:?}, median {m:.3})");
            head_to_head.push(m);
        }
        for (t, name) in tallies.iter().zip(["queen one partition", "plain INSERT", "PgQ", "queen 16 partitions"]) {
            let rates: Vec<i64> = t.round_rates().iter().map(|v| *v as i64).collect();
            println!(
                "  (push 1 alone, {name}, each round's msg/s: {rates:?}; slices {:.1} s, compaction charged {:.1} s)",
                t.slice_secs, t.charged_secs
            );
        }
        println!(
            "  (head to head: waits for the fresh tier to be compacted before each run, s: {:?})",
            settled.iter().map(|v| (v * 10.0).round() / 10.0).collect::<Vec<_>>()
        );
        let shown = [
            ("push, batch 1, 8 clients, one partition", "queen"),
            ("push, batch 1, 8 clients, one partition", "plain INSERT (bigserial + jsonb)"),
            ("push, batch 1, 8 clients, one partition", "PgQ insert_event"),
            ("push, batch 1, 8 clients, 16 partitions", "queen"),
        ];
        for (t, (scenario, system)) in tallies.iter().zip(shown) {
            *LAST_CLIENT_CORES.lock().unwrap() = Some(t.client_cores());
            say(&mut rows, scenario, system, t.rate(), "msg/s");
        }
    }
    if want("push1000") {
        // ---- push, batch 1,000, 4 clients, all to one partition ----
        reset(&mut c);
        let batches: Arc<Vec<Value>> = Arc::new((0..4).map(|_| queen_items("bq", "Default", 1000, 0)).collect());
        let b = batches.clone();
        queen_push1000 = run_clients(&dsn, 4, s.secs, move |c, k, _| {
            let push = prepared(c, "SELECT count(*) FROM queen.push_batch($1)");
            c.execute(&push, &[&b[k]]).unwrap();
            1000
        });
        say(&mut rows, "push, batch 1000, 4 clients, one partition", "queen", queen_push1000, "msg/s");
        let raw: Arc<Vec<Value>> = Arc::new((0..1000).map(payload).collect());
        let r = raw.clone();
        raw_insert = run_clients(&dsn, 4, s.secs, move |c, _, _| {
            let insert = prepared(c, "INSERT INTO bench_raw (payload) SELECT * FROM unnest($1::jsonb[])");
            c.execute(&insert, &[&*r]).unwrap();
            1000
        });
        say(&mut rows, "push, batch 1000, 4 clients, one partition", "raw INSERT (limit)", raw_insert, "msg/s");
        let texts: Arc<Vec<String>> = Arc::new(raw.iter().map(|v| v.to_string()).collect());
        let t = texts.clone();
        let v = run_clients(&dsn, 4, s.secs, move |c, _, _| {
            let insert = prepared(c, "SELECT count(pgq.insert_event('bq', 'ev', x)) FROM unnest($1::text[]) x");
            c.execute(&insert, &[&*t]).unwrap();
            1000
        });
        say(&mut rows, "push, batch 1000, 4 clients, one partition", "PgQ", v, "msg/s");
        // The floor of any push_batch(items jsonb): the server receives and parses the same
        // 1,000-item argument and stores nothing.
        let b = batches.clone();
        jsonb_floor = run_clients(&dsn, 4, s.secs, move |c, k, _| {
            let receive = prepared(c, "SELECT jsonb_array_length($1)");
            c.execute(&receive, &[&b[k]]).unwrap();
            1000
        });
        say(
            &mut rows,
            "push, batch 1000, 4 clients, one partition",
            "receive jsonb only (floor)",
            jsonb_floor,
            "msg/s",
        );
    }
    if want("pop") {
        // ---- pop + ack, batch 100, 4 consumers, 16 partitions, prefilled ----
        // 500k messages drain in a few seconds, so one drain is a short sample: each system
        // drains `POP_REPEATS` times, alternating, and the median counts.
        let repeats = if opts.smoke { 1 } else { POP_REPEATS };
        let [(q, q_cpu), (k, k_cpu)] = alternate_drains(
            &mut c,
            &dsn,
            s.secs,
            repeats,
            s.pop_prefill,
            "pop + ack",
            [queen_pop_ack, skip_claim_100],
        );
        queen_pop = q;
        *LAST_CLIENT_CORES.lock().unwrap() = Some(q_cpu);
        say(&mut rows, "pop + ack, batch 100, 4 consumers", "queen", queen_pop, "msg/s");
        skip_pop = k;
        *LAST_CLIENT_CORES.lock().unwrap() = Some(k_cpu);
        say(&mut rows, "pop + ack, batch 100, 4 consumers", "skip-locked table", skip_pop, "msg/s");
        pgq_prefill(&mut c, s.pop_prefill.min(if opts.smoke { 3_200 } else { 200_000 }));
        c.batch_execute("VACUUM ANALYZE").unwrap();
        // PgQ has one cursor per consumer: its consumers do not share a queue's events.
        let pgq_pop = run_clients(&dsn, 1, s.secs, |c, _, _| pgq_consume_one(c));
        say(&mut rows, "pop + ack, batch 100, 4 consumers", "PgQ (1 consumer)", pgq_pop, "msg/s");
    }
    if want("push1cpu") {
        // ---- push, batch 1, 8 clients, CPU-bound: every session with `synchronous_commit =
        // off`, so that the rate measures the CPU per push (the client's per call is the
        // same for both): queen to its default partition against a plain INSERT,
        // alternating runs from a fresh start, the medians count (#33: a push's CPU at
        // most 1.1x an INSERT's, so a rate at least 0.91x).
        let off = sync_off(&dsn);
        let repeats = if opts.smoke { 1 } else { POP_REPEATS };
        // queen.push, queen.send (its scalar form), the INSERT; in rotating orders.
        let statements = [
            "SELECT 1 FROM queen.push('bq', $1)",
            "SELECT queen.send('bq', $1)",
            "INSERT INTO bench_jobs (payload) VALUES ($1)",
        ];
        let mut runs: [Vec<f64>; 3] = Default::default();
        for r in 0..repeats {
            for k in 0..3 {
                let which = (r + k) % 3;
                reset(&mut c);
                // queen's queue exists before the clock starts, as the table does.
                c.execute("SELECT 1 FROM queen.push('bq', '0')", &[]).unwrap();
                let sql = statements[which];
                runs[which].push(run_clients(&off, 8, s.secs, move |c, _, i| {
                    let stmt = prepared(c, sql);
                    c.execute(&stmt, &[&payload(i)]).unwrap();
                    1
                }));
            }
        }
        println!(
            "  (push 1 CPU-bound runs: queen.push {:?}, queen.send {:?}, plain INSERT {:?})",
            runs[0], runs[1], runs[2]
        );
        let [mut q, mut qs, mut t] = runs;
        push1_cpu = median(&mut q) / median(&mut t);
        send1_cpu = median(&mut qs) / median(&mut t);
        say(&mut rows, "push, batch 1, 8 clients, CPU-bound", "queen (push)", median(&mut q), "msg/s");
        say(&mut rows, "push, batch 1, 8 clients, CPU-bound", "queen (send)", median(&mut qs), "msg/s");
        say(
            &mut rows,
            "push, batch 1, 8 clients, CPU-bound",
            "plain INSERT (bigserial + jsonb)",
            median(&mut t),
            "msg/s",
        );
    }
    if want("pop1") {
        // ---- pop + ack, batch 1, 4 consumers, 16 partitions: one message per call, as a
        // consumer written the obvious way takes them (`queen.pop('q')` pops one by default,
        // then acks it). Against the SKIP LOCKED table claiming one row and deleting it.
        // Alternating drains, `POP_REPEATS` each; the medians count.
        let (prefill, repeats) = if opts.smoke { (800, 1) } else { (100_000, POP_REPEATS) };
        let [(q, q_cpu), (k, k_cpu)] = alternate_drains(
            &mut c,
            &dsn,
            s.secs,
            repeats,
            prefill,
            "pop + ack batch 1",
            [queen_pop1_ack, skip_claim_1],
        );
        queen_pop1 = q;
        *LAST_CLIENT_CORES.lock().unwrap() = Some(q_cpu);
        say(&mut rows, "pop + ack, batch 1, 4 consumers", "queen", queen_pop1, "msg/s");
        skip_pop1 = k;
        *LAST_CLIENT_CORES.lock().unwrap() = Some(k_cpu);
        say(&mut rows, "pop + ack, batch 1, 4 consumers", "skip-locked table", skip_pop1, "msg/s");
        // The same CPU-bound: every consumer's session with `synchronous_commit = off`, so
        // that what is measured is the work per message, not the WAL flush (#33).
        let off = sync_off(&dsn);
        let [(q, q_cpu), (k, k_cpu)] = alternate_drains(
            &mut c,
            &off,
            s.secs,
            repeats,
            prefill,
            "pop + ack batch 1, CPU-bound",
            [queen_pop1_ack, skip_claim_1],
        );
        queen_pop1_cpu = q;
        *LAST_CLIENT_CORES.lock().unwrap() = Some(q_cpu);
        say(&mut rows, "pop + ack, batch 1, 4 consumers, CPU-bound", "queen", q, "msg/s");
        skip_pop1_cpu = k;
        *LAST_CLIENT_CORES.lock().unwrap() = Some(k_cpu);
        say(&mut rows, "pop + ack, batch 1, 4 consumers, CPU-bound", "skip-locked table", k, "msg/s");
    }
    if want("limit") {
        // ---- pop + ack, batch 100, 4 consumers, with and without a rate limit and a
        // concurrency cap that the load stays under (#31: a limit costs at most 10 %).
        // Alternating drains, `POP_REPEATS` each; the medians count.
        let repeats = if opts.smoke { 1 } else { POP_REPEATS };
        let (mut plain, mut limited) = (Vec::new(), Vec::new());
        for _ in 0..repeats {
            for with_limit in [false, true] {
                reset(&mut c);
                prefill_queen(&mut c, s.pop_prefill, 16);
                if with_limit {
                    c.batch_execute(
                        "SELECT queen.configure_limit('bq', '__QUEUE_MODE__', '*', rate => 1000000, burst => 100000);
                         SELECT queen.configure_limit('bq', '__QUEUE_MODE__', 'p', max_in_flight => 16);",
                    )
                    .unwrap();
                }
                let v = queen_consume(&dsn, s.secs, queen_pop_ack);
                if with_limit {
                    limited.push(v)
                } else {
                    plain.push(v)
                }
            }
        }
        println!(
            "  (limit runs: none {:?}, limited {:?})",
            plain.iter().map(|v| *v as i64).collect::<Vec<_>>(),
            limited.iter().map(|v| *v as i64).collect::<Vec<_>>()
        );
        say(&mut rows, "pop + ack, batch 100, 4 consumers, limits", "queen, no limit", median(&mut plain), "msg/s");
        say(
            &mut rows,
            "pop + ack, batch 100, 4 consumers, limits",
            "queen, rate + cap (not reached)",
            median(&mut limited),
            "msg/s",
        );
    }
    if want("fanout") {
        // ---- fan-out: 10 groups read one stream while it is pushed ----
        reset(&mut c);
        let stop = Arc::new(AtomicBool::new(false));
        let pushed = Arc::new(AtomicU64::new(0));
        let delivered = Arc::new(AtomicU64::new(0));
        let t0 = Instant::now();
        let mut handles = Vec::new();
        for k in 0..2 {
            let (stop, pushed, dsn) = (stop.clone(), pushed.clone(), dsn.clone());
            handles.push(thread::spawn(move || {
                let mut c = connect(&dsn);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let items = queen_items("bq", &format!("p{}", (k * 8 + i) % 16), 100, i * 100);
                    c.execute("SELECT count(*) FROM queen.push_batch($1)", &[&items]).unwrap();
                    pushed.fetch_add(100, Ordering::Relaxed);
                    i += 1;
                }
            }));
        }
        for g in 0..10 {
            let (stop, delivered, dsn) = (stop.clone(), delivered.clone(), dsn.clone());
            handles.push(thread::spawn(move || {
            let mut c = connect(&dsn);
            let group = format!("g{g}");
            let pop = c
                .prepare("SELECT 1 FROM queen.pop('bq', $1, batch => 100, max_partitions => 16, auto_ack => true, wait_ms => 100)")
                .unwrap();
            while !stop.load(Ordering::Relaxed) {
                let n = c
                    .query(&pop, &[&group])
                    .unwrap()
                    .len();
                delivered.fetch_add(n as u64, Ordering::Relaxed);
            }
        }));
        }
        thread::sleep(Duration::from_secs_f64(s.secs));
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
        let el = t0.elapsed().as_secs_f64();
        push_rate = pushed.load(Ordering::Relaxed) as f64 / el;
        fan_rate = delivered.load(Ordering::Relaxed) as f64 / el;
        say(&mut rows, "fan-out: 10 groups while pushing", "queen push rate", push_rate, "msg/s");
        say(&mut rows, "fan-out: 10 groups while pushing", "queen deliveries", fan_rate, "msg/s");
    }
    if want("wake") {
        // ---- wake latency: push commit -> return of a waiting pop ----
        reset(&mut c);
        c.execute("SELECT count(*) FROM queen.push('wake', '0')", &[]).unwrap();
        c.execute("SELECT count(*) FROM queen.pop('wake', auto_ack => true)", &[]).unwrap();
        lat = wake_latencies(&dsn, s.wake_samples, false);
        let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p).round() as usize];
        say(&mut rows, "wake latency (push commit -> pop return)", "queen p50", pct(0.5), "ms");
        say(&mut rows, "wake latency (push commit -> pop return)", "queen p99", pct(0.99), "ms");
        say(&mut rows, "wake latency (push commit -> pop return)", "queen max", pct(1.0), "ms");
        if let Some(pooler) = &opts.pooler_dsn {
            // The same, with the waiter and the pusher connected through PgBouncer in
            // transaction pooling mode (one unnamed statement per call: no prepared
            // statements through the pooler).
            let pooled = wake_latencies(pooler, s.wake_samples, true);
            let pct = |p: f64| pooled[((pooled.len() as f64 - 1.0) * p).round() as usize];
            say(&mut rows, "wake latency through pgbouncer (transaction pool)", "queen p50", pct(0.5), "ms");
            say(&mut rows, "wake latency through pgbouncer (transaction pool)", "queen p99", pct(0.99), "ms");
            say(&mut rows, "wake latency through pgbouncer (transaction pool)", "queen max", pct(1.0), "ms");
        }
    }
    if want("disk") {
        // ---- disk bytes per message ----
        reset(&mut c);
        prefill_queen(&mut c, s.disk_messages, 16);
        let size = |c: &mut Client, sql: &str| -> f64 { c.query_one(sql, &[]).unwrap().get::<_, i64>(0) as f64 };
        queen_bytes = size(
        &mut c,
        "SELECT sum(pg_total_relation_size(c.oid))::int8 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'queen' AND c.relkind IN ('r', 'm')",
    ) / s.disk_messages as f64;
        c.execute(
        "INSERT INTO bench_raw (payload) SELECT jsonb_build_object('orderId', i, 'customer', 'customer-' || lpad(i::text, 8, '0'),
           'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-12345', 'qty', 2, 'price', 19.99), jsonb_build_object('sku', 'SKU-67890', 'qty', 1, 'price', 5.5)),
           'currency', 'EUR', 'note', 'deliver to the back door, ring twice') FROM generate_series(1, $1::int) i",
        &[&(s.disk_messages as i32)],
    )
    .unwrap();
        c.batch_execute("VACUUM bench_raw").unwrap();
        raw_bytes = size(&mut c, "SELECT pg_total_relation_size('bench_raw')::int8") / s.disk_messages as f64;
        say(&mut rows, "disk bytes per message (push batch 1000)", "queen", queen_bytes, "B/msg");
        say(&mut rows, "disk bytes per message (push batch 1000)", "raw row table", raw_bytes, "B/msg");
    }
    if want("disk1") {
        // ---- disk bytes per message, single pushes: 8 clients push one message per
        // transaction to one partition (the fresh tier, compacted by the worker meanwhile),
        // then a last compaction pass and VACUUM, as an operator's maintenance would.
        reset(&mut c);
        let total = s.disk_messages as u64;
        let counter = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (dsn, counter) = (dsn.clone(), counter.clone());
                thread::spawn(move || {
                    let mut c = connect(&dsn);
                    let push = c.prepare("SELECT 1 FROM queen.push('bq', $1)").unwrap();
                    loop {
                        let i = counter.fetch_add(1, Ordering::Relaxed);
                        if i >= total {
                            break;
                        }
                        c.execute(&push, &[&payload(i)]).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        // The last runs are short and young: compact until the fresh tier is empty (the
        // linger of a short run is 10 s).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            c.execute("SELECT queen.compact('bq')", &[]).unwrap();
            let left: i64 = c.query_one("SELECT count(*) FROM queen.fresh_segments", &[]).unwrap().get(0);
            if left == 0 || Instant::now() > deadline {
                break;
            }
            thread::sleep(Duration::from_millis(500));
        }
        c.batch_execute("VACUUM queen.fresh_segments").unwrap();
        c.batch_execute("VACUUM queen.segments").unwrap();
        single_bytes = c
        .query_one(
            "SELECT sum(pg_total_relation_size(c.oid))::int8 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'queen' AND c.relkind IN ('r', 'm')",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0) as f64
        / total as f64;
        say(&mut rows, "disk bytes per message (single pushes, compacted)", "queen", single_bytes, "B/msg");
    }
    if want("scaling") {
        // ---- scaling: backlog and partitions ----
        // Backlog depth: one consumer at the front of one partition, timing only its
        // pop + ack calls: 1k messages of backlog (refilled, untimed, when drained) against
        // a deep backlog.
        let timed_pops = |c: &mut Client, max_pops: usize| -> (usize, f64) {
            let (mut n, mut t) = (0usize, 0f64);
            for _ in 0..max_pops {
                let t0 = Instant::now();
                let got = queen_pop_ack(c);
                t += t0.elapsed().as_secs_f64();
                if got == 0 {
                    break;
                }
                n += got;
            }
            (n, t)
        };
        reset(&mut c);
        let (mut n_small, mut t_small) = (0usize, 0f64);
        for _ in 0..if opts.smoke { 3 } else { 40 } {
            prefill_queen(&mut c, 1_000, 1);
            let (n, t) = timed_pops(&mut c, 1_000);
            n_small += n;
            t_small += t;
        }
        small_backlog = n_small as f64 / t_small;
        reset(&mut c);
        prefill_queen(&mut c, s.big_backlog, 1);
        let (n_big, t_big) = timed_pops(&mut c, if opts.smoke { 30 } else { 400 });
        big_backlog = n_big as f64 / t_big;
        say(&mut rows, "scaling: pop + ack at backlog 1k (1 consumer)", "queen", small_backlog, "msg/s");
        say(&mut rows, "scaling: pop + ack at big backlog (1 consumer)", "queen", big_backlog, "msg/s");
        // Every pop can fill its batch of 100 from one partition in both cases, and both
        // hold the same backlog, so that the two drains last about as long (a drain of a
        // tenth of it took under a second: a sample too short for this machine's drift).
        // They alternate `POP_REPEATS` times; the medians are shown and the ratio is paired
        // (the median of each round's ratio).
        let (mut few_runs, mut many_runs, mut few_cpu, mut many_cpu) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..if opts.smoke { 1 } else { POP_REPEATS } {
            // Each drain after a CHECKPOINT (`settle`), the order swapped every other round.
            for many_first in [round % 2 == 1, round % 2 == 0] {
                reset(&mut c);
                let parts = if many_first { s.partitions_many } else { 10 };
                prefill_queen(&mut c, s.partitions_many * 100, parts);
                settle(&mut c);
                let v = queen_consume(&dsn, s.secs, queen_pop_ack);
                let cpu = LAST_CLIENT_CORES.lock().unwrap().take().unwrap_or(f64::NAN);
                let (runs, cpus) =
                    if many_first { (&mut many_runs, &mut many_cpu) } else { (&mut few_runs, &mut few_cpu) };
                runs.push(v);
                cpus.push(cpu);
            }
        }
        let mut paired: Vec<f64> = many_runs.iter().zip(&few_runs).map(|(m, f)| m / f).collect();
        println!(
            "  (pop + ack runs: 10 partitions {:?}, many partitions {:?})",
            few_runs.iter().map(|v| *v as i64).collect::<Vec<_>>(),
            many_runs.iter().map(|v| *v as i64).collect::<Vec<_>>()
        );
        many_over_few = median(&mut paired);
        *LAST_CLIENT_CORES.lock().unwrap() = Some(median(&mut few_cpu));
        few = median(&mut few_runs);
        say(&mut rows, "scaling: pop + ack, 10 partitions", "queen", few, "msg/s");
        *LAST_CLIENT_CORES.lock().unwrap() = Some(median(&mut many_cpu));
        many = median(&mut many_runs);
        say(&mut rows, "scaling: pop + ack, many partitions", "queen", many, "msg/s");
        // Monitoring on that queue: what a scrape of every lane, of the totals, or of the
        // metrics costs.
        for (what, sql) in [
            ("queen.status (every lane)", "SELECT count(*) FROM queen.status('bq')"),
            ("queen.totals", "SELECT count(*) FROM queen.totals('bq')"),
            // Every queue of the database: what one Prometheus scrape computes.
            ("queen.metrics (every queue)", "SELECT count(*) FROM queen.metrics()"),
        ] {
            c.execute(sql, &[]).unwrap(); // warm
            let t = Instant::now();
            for _ in 0..10 {
                c.execute(sql, &[]).unwrap();
            }
            say(&mut rows, "status scrape, many partitions", what, t.elapsed().as_secs_f64() * 100.0, "ms per call");
        }
    }
    // The longest pop while a rotation moved `live` bytes out of the oldest generation.
    let mut rotation_stall = f64::NAN;
    if want("rotation") {
        reset(&mut c);
        let live = if opts.smoke { 4 << 20 } else { 1 << 30 };
        let f = rotation::run(&dsn, live);
        let pct = |v: &[f64], p: f64| -> f64 {
            let mut v = v.to_vec();
            v.sort_by(|a, b| a.total_cmp(b));
            v.get(((v.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(f64::NAN)
        };
        let mb = |b: i64| b as f64 / (1 << 20) as f64;
        say(&mut rows, "rotation: oldest generation, live rows", "queen", mb(f.live_bytes), "MB");
        say(&mut rows, "rotation: oldest generation, on disk", "queen", mb(f.oldest_bytes), "MB");
        say(&mut rows, "rotation: duration (move + swap)", "queen", f.rotation_secs, "s");
        for (what, v) in [
            ("rotation: pop latency before it", &f.before),
            ("rotation: pop latency during it, new rows", &f.during_probe),
            ("rotation: pop latency during it, moved rows", &f.during_live),
        ] {
            say(&mut rows, what, "queen p50", pct(v, 0.5), "ms");
            say(&mut rows, what, "queen p99", pct(v, 0.99), "ms");
            say(&mut rows, what, "queen max", pct(v, 1.0), "ms");
        }
        rotation_stall = pct(&f.during_probe, 1.0).max(pct(&f.during_live, 1.0));
    }
    let mut held_md = None;
    let mut held_ratios = Vec::new();
    if held_on {
        let sizes = if opts.smoke {
            held::Sizes { minutes: 2, minute: Duration::from_secs(1), backlog: 3_200, pgq_backlog: 3_200 }
        } else {
            held::Sizes {
                minutes: opts.held_minutes,
                minute: Duration::from_secs(60),
                backlog: 3_000_000,
                pgq_backlog: 200_000,
            }
        };
        let (md, ratios) = held::run(&dsn, &sizes, &opts.held_systems);
        held_md = Some(md);
        held_ratios = ratios;
    }
    // The live queue (`live`): 8 single-message producers and 4 consumers of up to 10 at
    // once, alternating rounds of queen and the SKIP LOCKED table; flush-bound, at half the
    // table's rate (latency), and CPU-bound (`synchronous_commit = off`).
    let (mut live_flush, mut live_cpu, mut live_half_p99) = (f64::NAN, f64::NAN, f64::NAN);
    // Each live run's backlog at the end, in seconds of its pushes: queen's flush-bound and
    // CPU-bound (bounded: under a second).
    let (mut live_flush_backlog, mut live_cpu_backlog) = (f64::NAN, f64::NAN);
    let lag_secs = |o: &live::Outcome| o.backlog_end as f64 / o.pushed_rate().max(1.0);
    if want("live") {
        let (rounds, secs) = if opts.smoke { (1, 0.5) } else { (LIVE_ROUNDS, s.secs) };
        let report = |rows: &mut Vec<Row>, names: [&'static str; 4], out: &[live::Outcome; 2]| {
            for (o, system) in out.iter().zip(["queen", "plain table"]) {
                say(rows, names[0], system, o.consumed_rate(), "msg/s");
                say(rows, names[1], system, o.pushed_rate(), "msg/s");
                say(rows, names[2], system, o.backlog_end as f64, "messages");
            }
            for (o, system) in out.iter().zip([["queen p50", "queen p99"], ["plain table p50", "plain table p99"]]) {
                say(rows, names[3], system[0], o.percentile(0.5), "ms");
                say(rows, names[3], system[1], o.percentile(0.99), "ms");
            }
        };
        if live::wanted(live::Shape::Flush) {
            let full = live::alternate(&mut c, &dsn, "live, flush-bound", rounds, secs, None, false);
            report(
                &mut rows,
                [
                    "live queue, flush-bound: consumed",
                    "live queue, flush-bound: pushed",
                    "live queue, flush-bound: backlog at a round's end (largest)",
                    "live queue, flush-bound: push commit -> ack commit",
                ],
                &full,
            );
            live_flush = full[0].consumed_rate() / full[1].consumed_rate();
            live_flush_backlog = lag_secs(&full[0]);
            if live::wanted(live::Shape::Half) {
                // (Without the table's rounds, QUEEN_BENCH_LIVE_SYSTEM=queen: half of queen's.)
                let half_rate =
                    if full[1].secs > 0.0 { full[1].consumed_rate() } else { full[0].consumed_rate() } / 2.0;
                let half =
                    live::alternate(&mut c, &dsn, "live, half the table's rate", rounds, secs, Some(half_rate), false);
                report(
                    &mut rows,
                    [
                        "live queue, half the table's rate: consumed",
                        "live queue, half the table's rate: pushed",
                        "live queue, half the table's rate: backlog at a round's end (largest)",
                        "live queue, half the table's rate: push commit -> ack commit",
                    ],
                    &half,
                );
                live_half_p99 = half[0].percentile(0.99);
            }
        }
        if live::wanted(live::Shape::Cpu) {
            let cpu = live::alternate(&mut c, &dsn, "live, CPU-bound", rounds, secs, None, true);
            report(
                &mut rows,
                [
                    "live queue, CPU-bound (synchronous_commit off): consumed",
                    "live queue, CPU-bound (synchronous_commit off): pushed",
                    "live queue, CPU-bound (synchronous_commit off): backlog at a round's end (largest)",
                    "live queue, CPU-bound (synchronous_commit off): push commit -> ack commit",
                ],
                &cpu,
            );
            live_cpu = cpu[0].consumed_rate() / cpu[1].consumed_rate();
            live_cpu_backlog = lag_secs(&cpu[0]);
        }
    }
    // ---- ratios against the targets ----
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p).round() as usize];
    let find = |sc: &str, sys: &str| {
        rows.iter().find(|r| r.scenario == sc && r.system == sys).map(|r| r.value).unwrap_or(f64::NAN)
    };
    let pgq_ack = find("pop + ack, batch 100, 4 consumers", "PgQ (1 consumer)");
    let h2h = |k: usize| head_to_head.get(k).copied().unwrap_or(f64::NAN);
    let targets = [
        ("push 1, one partition / PgQ insert_event", push1_ratio[0].0, ">= 1.15"),
        ("  90 % interval, low end", push1_ratio[0].1, "(rounds resampled)"),
        ("push 1, one partition / plain INSERT", push1_ratio[1].0, ">= 0.95"),
        ("  90 % interval, low end", push1_ratio[1].1, "(rounds resampled)"),
        ("push 1, 16 partitions / PgQ insert_event", push1_ratio[2].0, ">= 1.15"),
        ("  90 % interval, low end", push1_ratio[2].1, "(rounds resampled)"),
        ("push 1, 16 partitions / plain INSERT", push1_ratio[3].0, ">= 0.95"),
        ("  90 % interval, low end", push1_ratio[3].1, "(rounds resampled)"),
        ("  head to head, one partition / PgQ", h2h(0), "(sharing every flush)"),
        ("  head to head, one partition / plain INSERT", h2h(1), "(sharing every flush)"),
        ("  head to head, 16 partitions / PgQ", h2h(2), "(sharing every flush)"),
        ("  head to head, 16 partitions / plain INSERT", h2h(3), "(sharing every flush)"),
        ("push 1 CPU-bound / plain INSERT (CPU per push <= 1.1x)", push1_cpu, ">= 0.91"),
        ("  send (push's scalar form) CPU-bound / plain INSERT", send1_cpu, ">= 0.91"),
        ("push batch 1000, one partition / raw insert limit", queen_push1000 / raw_insert, ">= 0.9"),
        ("  jsonb receive floor / raw insert limit", jsonb_floor / raw_insert, "(ceiling of the above)"),
        ("  push batch 1000 / jsonb receive floor", queen_push1000 / jsonb_floor, "(share of the ceiling)"),
        ("pop+ack / SKIP LOCKED table", queen_pop / skip_pop, ">= 2"),
        ("pop+ack / PgQ", queen_pop / pgq_ack, ">= 1"),
        ("pop+ack batch 1 / SKIP LOCKED table", queen_pop1 / skip_pop1, "(flush-bound)"),
        ("pop+ack batch 1, CPU-bound / SKIP LOCKED table", queen_pop1_cpu / skip_pop1_cpu, ">= 1.2"),
        ("fan-out deliveries / push rate", fan_rate / push_rate, ">= 8"),
        ("wake p50 (ms)", pct(0.5), "<= 1"),
        ("wake p99 (ms)", pct(0.99), "<= 5"),
        ("bytes per message / raw row table", queen_bytes / raw_bytes, "<= 0.3"),
        ("bytes per message, single pushes compacted", single_bytes, "<= 60"),
        ("pop+ack big backlog / 1k backlog", big_backlog / small_backlog, ">= 0.8"),
        ("pop+ack many partitions / 10 partitions (paired)", many_over_few, ">= 0.5"),
        ("  ratio of the medians", many / few, "(unpaired)"),
        ("rotation stall: longest pop during it (ms)", rotation_stall, "<= 200"),
        ("live, flush-bound: consumed / plain table", live_flush, ">= 1.0"),
        ("  queen's largest backlog at a round's end (s of pushes)", live_flush_backlog, "<= 1"),
        ("live, half the table's rate: queen p99 (ms)", live_half_p99, "<= 20"),
        ("live, CPU-bound: consumed / plain table", live_cpu, ">= 2"),
        ("  queen's largest backlog at a round's end (s of pushes)", live_cpu_backlog, "<= 1"),
    ];
    // Whether a measured ratio meets its target ("" for the rows that only explain).
    let verdict = |v: f64, want: &str| -> &'static str {
        let (op, bound) = match want.split_once(' ') {
            Some((op @ (">=" | "<="), b)) => (op, b.parse::<f64>().unwrap_or(f64::NAN)),
            _ => return "",
        };
        if v.is_nan() {
            "not run"
        } else if (op == ">=" && v >= bound) || (op == "<=" && v <= bound) {
            "met"
        } else {
            "MISSED"
        }
    };
    println!();
    if others_on {
        for (name, v, want) in &targets {
            println!("{name:<44} {v:>10.2}   target {want:<24} {}", verdict(*v, want));
        }
    }
    for (name, v, want) in &held_ratios {
        println!("{name:<44} {v:>10.2}   target {want:<24} {}", verdict(*v, want));
    }

    if let Some(out) = opts.out {
        // The file keeps the section of whichever part did not run this time.
        let old = std::fs::read_to_string(&out).unwrap_or_default();
        let (old_main, old_held) = match old.split_once(HELD_MARK) {
            Some((m, h)) => (m.to_string(), Some(h.to_string())),
            None => (old, None),
        };
        let mut held_section = held_md.map(|md| {
            let mut md = md;
            let _ = writeln!(md, "\n| ratio | measured | target | |\n|---|---|---|---|");
            for (name, v, want) in &held_ratios {
                let _ = writeln!(md, "| {name} | {v:.2} | {want} | {} |", verdict(*v, want));
            }
            md
        });
        if held_section.is_none() {
            held_section = old_held;
        }
        let mut md = String::new();
        let _ = writeln!(md, "# queen benchmarks\n");
        let _ = writeln!(md, "Written by `make bench` (bench/src/main.rs). Machine: {}.", machine());
        let _ = writeln!(md, "One PostgreSQL 15 cluster for every system, settings in `scripts/bench.conf`.");
        let _ = writeln!(md, "Payloads ≈200 bytes of JSON. Durations {} s per measurement.\n", s.secs);
        let _ = writeln!(md, "Sizes: pop + ack prefill {} messages over 16 partitions (each system drains it {POP_REPEATS} times, alternating; the median is shown, every run is in the bench's output); big backlog {} messages; many partitions = {} (the pop + ack drains over 10 and over many partitions hold {} messages each and alternate {POP_REPEATS} times; their ratio is paired, like the single pushes' below); pop + ack batch 1 prefill 100000 messages over 16 partitions (3 drains per system, alternating, the median shown).", s.pop_prefill, s.big_backlog, s.partitions_many, s.partitions_many * 100);
        let _ = writeln!(md, "The client (Rust, postgres crate, one connection per client thread, every statement prepared once per connection as a driver's statement cache does, for every system alike) runs on the same 2 cores; its own CPU use is in the last column, so a reader can see how much of the machine it took.\n");
        let _ = writeln!(md, "A pop commits without waiting for its WAL flush when its writes are its transaction's only ones (README, \"Durability\"); pushes and acks, like every baseline's commits, wait for it (`synchronous_commit = on`).\n");
        let _ = writeln!(md, "Single pushes (batch 1, 8 clients) are measured with each system alone, interleaved: every system keeps its 8 clients connected, and the four take turns in slices of {PUSH1_SLICE} s, {PUSH1_ROUNDS} rounds, in orders balanced so that every system runs in every position, and right after every other system, equally often; a rate is the messages over the seconds of every slice, and under each ratio is the low end of its 90 % interval (the ratio over 2,000 resamplings of the rounds; that treats rounds as independent, while the disk's drift makes neighbouring rounds alike, so the true interval is somewhat wider). A single push waits for its WAL flush, and this machine's flush speed drifts by a factor of two within ten seconds, so runs of 10 s one after another (this bench's design before) gave per-round ratios from 0.5 to 1.5; slices this short sample the same minutes of the disk for every system. queen's background worker pauses its compaction for these slices; after each queen slice the bench compacts what it pushed (`queen.compact`), vacuums the fresh tier as the worker does after a pass that merged something (`VACUUM (INDEX_CLEANUP ON, TRUNCATE OFF, SKIP_LOCKED) queen.fresh_segments`) and adds the time those take (and a commit's, which flushes the VACUUM's WAL) to the slice's, so compaction costs queen its full time, not overlapped with anything. Every round's rate is in the bench's output. Under the ratios, the same pairs head to head: queen and the baseline at the same time, 4 clients each, so that every WAL flush carries commits of both ({HEAD_TO_HEAD_REPEATS} runs of {} s of each pair, the median; the worker compacts during those, and the bench waits for the fresh tier to empty and takes a CHECKPOINT before each).\n", s.secs);
        let _ = writeln!(md, "The live queue (`live`, bench/src/live.rs) is the shape most applications run: 8 producers of one message per transaction (queen over 16 partitions with `queen.push`, the table with an `INSERT`) and 4 consumers taking up to 10 at a time and acknowledging them (queen: `queen.pop('lq', batch => 10, wait_ms => 200)` and `queen.ack(lease)`; the table: `SELECT ... ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED` and a `DELETE` in one transaction, sleeping {} ms when it found nothing), all at once, in {LIVE_ROUNDS} rounds of {} s per system that alternate (queen first, then the table first, ...), each from a fresh start. Consumed is what was acknowledged and committed within the round; the backlog is pushed minus consumed when the round ends; the latency is from a push's commit (its call returned) to its ack's commit. Three settings: full speed with `synchronous_commit = on` (flush-bound), producers paced to half the table's consumed rate of that run (latency), and full speed with `synchronous_commit = off` in every session (CPU-bound).\n", live::TABLE_IDLE_SLEEP.as_millis(), s.secs);
        let _ = writeln!(md, "CPU-bound single pushes and single pops (`push1cpu`, and the second half of `pop1`) run every session with `synchronous_commit = off`, alternating runs from a fresh start (the medians count): there the rate measures the work per message, not the WAL flush.\n");
        let _ = writeln!(md, "| scenario | system | value | client CPU (cores) |\n|---|---|---|---|");
        for r in &rows {
            let cpu = r.client_cores.map(|c| format!("{c:.2}")).unwrap_or_else(|| "-".into());
            let _ = writeln!(md, "| {} | {} | {} {} | {cpu} |", r.scenario, r.system, fmt_rate(r.value), r.unit);
        }
        let _ = writeln!(md, "\n| ratio | measured | target | |\n|---|---|---|---|");
        for (name, v, want) in &targets {
            let _ = writeln!(md, "| {name} | {v:.2} | {want} | {} |", verdict(*v, want));
        }
        if !others_on {
            md = old_main;
        }
        if let Some(h) = held_section {
            md = format!("{}\n{HELD_MARK}{}", md.trim_end(), h);
        }
        std::fs::write(&out, md).unwrap();
        println!("\nwrote {out}");
    }
}
