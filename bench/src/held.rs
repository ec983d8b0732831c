//! "pop + ack under a held snapshot": a queue in steady state while one `REPEATABLE READ`
//! transaction, opened just before, stays open the whole run and holds the xmin horizon
//! back (as a long report, a session idle in transaction or a replica's
//! `hot_standby_feedback` do). Dead row versions then stay until it ends, so a design that
//! updates hot rows gets slower minute by minute.
//!
//! Each system runs twice, the snapshot held and not, `minutes` each, on a fresh backlog:
//! - 4 consumers (PgQ: 1, it has one cursor per consumer), each cycle taking a batch of up
//!   to 100, acking it and pushing its 100 payloads back as one batch, so the backlog stays
//!   at its prefilled size for the whole run;
//! - 1 producer pushing one message per transaction (to the default partition for queen).
//!
//! queen's queue has `retention => 30`, so consumed segments are deleted as a user running
//! a queue in steady state would have them.
//!
//! Reported per minute: messages consumed per second (each one also pushed back in a batch),
//! single pushes per second, and the size of the system's tables; at the end, the dead
//! versions in them (statistics' `n_dead_tup`). The ratio that matters is the last minute
//! with the snapshot held against the last minute without.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;
use serde_json::{json, Value};

use super::{connect, payload, pgq_prefill, prefill_queen, prepared, reset};

#[derive(Clone, Copy, PartialEq)]
enum System {
    Queen,
    SkipLocked,
    Pgq,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Queen => "queen",
            System::SkipLocked => "skip-locked table",
            System::Pgq => "PgQ",
        }
    }
    /// The tables a system writes (a `LIKE` pattern on schema-qualified names).
    fn tables(self) -> &'static str {
        match self {
            System::Queen => "queen.%",
            System::SkipLocked => "public.bench_jobs",
            System::Pgq => "pgq%.%",
        }
    }
}

/// One run: per-minute figures and the end state.
struct Run {
    system: System,
    held: bool,
    /// Messages consumed per second, per minute.
    consumed: Vec<f64>,
    /// Single pushes per second, per minute.
    singles: Vec<f64>,
    /// Total size of the system's tables at the end of each minute (MB).
    size_mb: Vec<f64>,
    /// Dead versions at the end, by table (largest first), and their sum.
    dead: Vec<(String, i64)>,
}

impl Run {
    fn dead_total(&self) -> i64 {
        self.dead.iter().map(|d| d.1).sum()
    }
}

pub struct Sizes {
    pub minutes: usize,
    pub minute: Duration,
    pub backlog: usize,
    pub pgq_backlog: usize,
}

fn table_size_mb(c: &mut Client, system: System) -> f64 {
    c.query_one(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::float8 / 1048576
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relkind = 'r' AND n.nspname || '.' || c.relname LIKE $1",
        &[&system.tables()],
    )
    .unwrap()
    .get(0)
}

fn dead_versions(c: &mut Client, system: System) -> Vec<(String, i64)> {
    // Statistics are flushed by each backend now and then: give them a moment.
    thread::sleep(Duration::from_millis(1500));
    c.query(
        "SELECT schemaname || '.' || relname, n_dead_tup FROM pg_stat_user_tables
          WHERE schemaname || '.' || relname LIKE $1 AND n_dead_tup > 0
          ORDER BY n_dead_tup DESC",
        &[&system.tables()],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// One consumer cycle of a system: take up to 100, ack, push them back. Returns how many.
fn cycle(c: &mut Client, system: System) -> usize {
    match system {
        System::Queen => {
            let pop = prepared(c, "SELECT lease_id, partition, payload FROM queen.pop('bq', batch => 100)");
            let rows = c.query(&pop, &[]).unwrap();
            let Some(first) = rows.first() else { return 0 };
            let lease: uuid::Uuid = first.get(0);
            let ack = prepared(c, "SELECT queen.ack($1)");
            c.execute(&ack, &[&lease]).unwrap();
            let items = Value::Array(
                rows.iter()
                    .map(
                        |r| json!({"queue": "bq", "partition": r.get::<_, String>(1), "payload": r.get::<_, Value>(2)}),
                    )
                    .collect(),
            );
            let push = prepared(c, "SELECT count(*) FROM queen.push_batch($1)");
            c.execute(&push, &[&items]).unwrap();
            rows.len()
        }
        System::SkipLocked => {
            let claim = prepared(c, "SELECT id FROM bench_jobs ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED");
            let requeue = prepared(
                c,
                "WITH d AS (DELETE FROM bench_jobs WHERE id = ANY($1) RETURNING payload)
                 INSERT INTO bench_jobs (payload) SELECT payload FROM d",
            );
            let mut tx = c.transaction().unwrap();
            let ids: Vec<i64> = tx.query(&claim, &[]).unwrap().iter().map(|r| r.get(0)).collect();
            if ids.is_empty() {
                return 0;
            }
            tx.execute(&requeue, &[&ids]).unwrap();
            tx.commit().unwrap();
            ids.len()
        }
        System::Pgq => {
            let next = prepared(c, "SELECT pgq.next_batch('bq', 'c')");
            let batch: Option<i64> = c.query_one(&next, &[]).unwrap().get(0);
            let Some(batch) = batch else { return 0 };
            let events = prepared(c, "SELECT ev_data FROM pgq.get_batch_events($1)");
            let data: Vec<String> = c.query(&events, &[&batch]).unwrap().iter().map(|r| r.get(0)).collect();
            let insert = prepared(c, "SELECT count(pgq.insert_event('bq', 'ev', x)) FROM unnest($1::text[]) x");
            c.execute(&insert, &[&data]).unwrap();
            let finish = prepared(c, "SELECT pgq.finish_batch($1)");
            c.execute(&finish, &[&batch]).unwrap();
            data.len()
        }
    }
}

fn single_push(c: &mut Client, system: System, i: u64) {
    let sql = match system {
        System::Queen => "SELECT 1 FROM queen.push('bq', $1)",
        System::SkipLocked => "INSERT INTO bench_jobs (payload) VALUES ($1)",
        System::Pgq => "SELECT pgq.insert_event('bq', 'ev', $1::jsonb::text)",
    };
    let stmt = prepared(c, sql);
    c.execute(&stmt, &[&payload(i)]).unwrap();
}

fn prefill(c: &mut Client, system: System, s: &Sizes) {
    reset(c);
    match system {
        System::Queen => {
            prefill_queen(c, s.backlog, 16);
            // The queue keeps consumed messages for 30 s, then the worker's retention pass
            // (every 60 s, the default) deletes them: what a user running a queue in steady
            // state configures. Without it the tables grow by every message pushed back.
            c.batch_execute("SELECT queen.configure('bq', retention => 30)").unwrap();
        }
        System::SkipLocked => {
            c.execute(
                "INSERT INTO bench_jobs (payload) SELECT jsonb_build_object('orderId', i, 'customer', 'customer-' || lpad(i::text, 8, '0'),
                   'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-12345', 'qty', 2, 'price', 19.99)),
                   'currency', 'EUR', 'note', 'deliver to the back door, ring twice') FROM generate_series(1, $1::int) i",
                &[&(s.backlog as i32)],
            )
            .unwrap();
            c.batch_execute("VACUUM ANALYZE bench_jobs").unwrap();
        }
        System::Pgq => {
            // Ticks of about 100 events, so that PgQ's batches are the others' size.
            c.batch_execute(
                "SELECT pgq.set_queue_config('bq', 'ticker_max_count', '100');
                 SELECT pgq.set_queue_config('bq', 'ticker_max_lag', '0.1 seconds');",
            )
            .unwrap();
            pgq_prefill(c, s.pgq_backlog);
            c.batch_execute("VACUUM ANALYZE").unwrap();
        }
    }
    // Let the dust of the prefill settle (checkpoints, autovacuum) the same for everyone.
    c.batch_execute("CHECKPOINT").unwrap();
}

fn run_one(dsn: &str, system: System, held: bool, s: &Sizes) -> Run {
    let mut c = connect(dsn);
    prefill(&mut c, system, s);
    // The snapshot: opened before the clients start, kept until they stop.
    let mut holder = connect(dsn);
    if held {
        holder.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class;").unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let consumed = Arc::new(AtomicU64::new(0));
    let singles = Arc::new(AtomicU64::new(0));
    let consumers = if system == System::Pgq { 1 } else { 4 };
    let mut handles = Vec::new();
    for _ in 0..consumers {
        let (stop, consumed, dsn) = (stop.clone(), consumed.clone(), dsn.to_string());
        handles.push(thread::spawn(move || {
            let mut c = connect(&dsn);
            while !stop.load(Ordering::Relaxed) {
                let n = cycle(&mut c, system);
                if n == 0 {
                    thread::sleep(Duration::from_millis(1)); // (PgQ between ticks)
                }
                consumed.fetch_add(n as u64, Ordering::Relaxed);
            }
        }));
    }
    {
        let (stop, singles, dsn) = (stop.clone(), singles.clone(), dsn.to_string());
        handles.push(thread::spawn(move || {
            let mut c = connect(&dsn);
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                single_push(&mut c, system, i);
                singles.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    if system == System::Pgq {
        // PgQ needs a ticker (pgqd's job) to cut batches out of new events.
        let (stop, dsn) = (stop.clone(), dsn.to_string());
        handles.push(thread::spawn(move || {
            let mut c = connect(&dsn);
            while !stop.load(Ordering::Relaxed) {
                c.batch_execute("SELECT pgq.ticker()").unwrap();
                thread::sleep(Duration::from_millis(20));
            }
        }));
    }
    let mut run =
        Run { system, held, consumed: Vec::new(), singles: Vec::new(), size_mb: Vec::new(), dead: Vec::new() };
    let (mut last_c, mut last_s, mut last_t) = (0u64, 0u64, Instant::now());
    for _ in 0..s.minutes {
        thread::sleep(s.minute.saturating_sub(last_t.elapsed()));
        let (nc, ns, now) = (consumed.load(Ordering::Relaxed), singles.load(Ordering::Relaxed), Instant::now());
        let secs = now.duration_since(last_t).as_secs_f64();
        run.consumed.push((nc - last_c) as f64 / secs);
        run.singles.push((ns - last_s) as f64 / secs);
        run.size_mb.push(table_size_mb(&mut c, system));
        (last_c, last_s, last_t) = (nc, ns, now);
        println!(
            "  held snapshot: {:<18} {:<5} minute {}: consumed {:>8.0} msg/s, single pushes {:>6.0} msg/s, tables {:>7.1} MB",
            system.name(),
            if held { "held" } else { "none" },
            run.consumed.len(),
            run.consumed.last().unwrap(),
            run.singles.last().unwrap(),
            run.size_mb.last().unwrap()
        );
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    run.dead = dead_versions(&mut c, system);
    if held {
        holder.batch_execute("COMMIT").unwrap();
    }
    run
}

fn fmt_list(v: &[f64]) -> String {
    v.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" / ")
}

/// Runs the scenario; returns its section of BENCHMARKS.md and the ratios (name, value,
/// target) for the bench's target table.
pub fn run(dsn: &str, s: &Sizes, only: &[String]) -> (String, Vec<(String, f64, &'static str)>) {
    let systems: Vec<System> = [(System::Queen, "queen"), (System::SkipLocked, "skip"), (System::Pgq, "pgq")]
        .into_iter()
        .filter(|(_, name)| only.is_empty() || only.iter().any(|o| o == name))
        .map(|(s, _)| s)
        .collect();
    let mut runs = Vec::new();
    for &system in &systems {
        for held in [false, true] {
            runs.push(run_one(dsn, system, held, s));
        }
    }
    let get = |system: System, held: bool| runs.iter().find(|r| r.system == system && r.held == held).unwrap();
    let last = |v: &[f64]| *v.last().unwrap_or(&f64::NAN);
    let mut ratios = Vec::new();
    for &system in &systems {
        let (h, n) = (get(system, true), get(system, false));
        ratios.push((
            format!("held snapshot, last minute / none: {} pop+ack (+ batch re-push)", system.name()),
            last(&h.consumed) / last(&n.consumed),
            if system == System::Queen { ">= 0.8" } else { "(baseline)" },
        ));
        ratios.push((
            format!("held snapshot, last minute / none: {} single push", system.name()),
            last(&h.singles) / last(&n.singles),
            if system == System::Queen { ">= 0.8" } else { "(baseline)" },
        ));
        // Bounded tables: the last minute's size against the second minute's (the first
        // still fills up to what retention keeps), snapshot held.
        let grew = |v: &[f64]| last(v) / v.get(1).or(v.first()).copied().unwrap_or(f64::NAN);
        ratios.push((
            format!("held snapshot: {} tables, last minute / minute 2", system.name()),
            grew(&h.size_mb),
            if system == System::Queen { "<= 1.2" } else { "(baseline)" },
        ));
    }
    let mut md = String::new();
    let _ = writeln!(md, "## pop + ack under a held snapshot\n");
    let _ = writeln!(
        md,
        "Written by `make bench-held` (bench/src/held.rs), {} runs of {} minute(s) of {} s each. \
         Backlog {} messages over 16 partitions (PgQ: {}, one tick per 100 events). 4 consumers (PgQ: 1) \
         take batches of up to 100, ack them and push the payloads back as one batch, so the backlog \
         stays the same; 1 producer pushes single messages meanwhile. \"held\": a REPEATABLE READ \
         transaction opened before the clients start stays open until they stop. queen's queue is \
         configured with `retention => 30` (the worker's retention pass runs every 60 s).\n",
        runs.len(),
        s.minutes,
        s.minute.as_secs(),
        s.backlog,
        s.pgq_backlog
    );
    let _ = writeln!(
        md,
        "| system | snapshot | consumed msg/s, per minute | single pushes msg/s, per minute | tables MB, per minute | dead versions at the end |\n|---|---|---|---|---|---|"
    );
    for r in &runs {
        let dead = r.dead.iter().take(4).map(|(t, n)| format!("{t} {n}")).collect::<Vec<_>>().join(", ");
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} ({}) |",
            r.system.name(),
            if r.held { "held" } else { "none" },
            fmt_list(&r.consumed),
            fmt_list(&r.singles),
            r.size_mb.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" / "),
            r.dead_total(),
            if dead.is_empty() { "none".to_string() } else { dead }
        );
    }
    (md, ratios)
}
