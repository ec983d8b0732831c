//! Invariant 5, no deadlocks: a stress run in which, together and for a minute
//! (QUEEN_STRESS_SECS to change it), sessions
//!
//! - push batches to two queues, to partitions that exist and to new ones (so partitions
//!   keep being created in both), some with producer transaction ids (the dedup path),
//!   and some as two pushes in one transaction: an existing partition first, then a new
//!   one of the same queue or of the other (the lock order across statements);
//! - run retention passes (`queen.retain()` and `queen.retain(queue)`) on queues with a
//!   one-second retention;
//! - pop and ack with `dlq`, `failed` (retry limit 1: the second failure dead-letters) and
//!   `retry`: dead-lettering acks, some in the pop's own transaction, followed there by
//!   an extension and a whole-lease ack;
//! - `delete_queue` one of the queues every 0.5–2 s (pushes recreate it at once);
//! - pop leases over up to six partitions and extend and ack them, acks in an order other
//!   than partition order, some in one transaction with the extension (and a dead letter
//!   filed first).
//!
//! Every error is collected by SQLSTATE. The run passes only with no `40P01` and no
//! error outside `ALLOWED` (empty: see there), no statement cancelled by the 30 s
//! `statement_timeout` (a wait that never ends is a deadlock nobody detected), no
//! "deadlock detected" in the server log during the run (any session: the background
//! worker's retention and compaction passes too; when QUEEN_TEST_DIR names the cluster's
//! directory, as `make integration` sets it), and only if the run did each kind of work.
//!
//! It needs a cluster with `shared_preload_libraries = 'queen'`, as `make integration`'s:
//! without it a push holds its partition rows until it commits (README), and the
//! two-statement transactions here, which push to partitions in opposite orders, deadlock
//! as any two transactions that update two rows in opposite orders do.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;
use queen_it::{connect, unique};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// SQLSTATEs that are no failure in this run: documented queen errors that these races
/// may legitimately raise. None is. Every call made here is documented to meet the races
/// without an error: an ack or extension of a lease that expired, was superseded or whose
/// queue was deleted reports items not applied / `renewed: 0`; a pop of a queue that does
/// not exist returns zero rows; `delete_queue` of a missing queue returns `deleted: false`;
/// a retention pass skips what is locked. The codes queen documents do not apply: 22023,
/// 22004, 22P02 and 54000 (bad arguments and limits: every argument here is valid), 0A000
/// (long-poll under REPEATABLE READ, PREPARE: not done), P0002 (`dlq_replay` /
/// `dlq_delete`: not called), 55000 / XX001 (encryption: not used), 53400 (shared-memory
/// capacity: a handful of live leases and partitions per queue, far below the limits).
/// Never allowed: 40P01 (the invariant), 23503 / 23505 (a row written for a queue or
/// partition being deleted, or twice), 40001, XX000, 57014 (a hang), and errors with no
/// SQLSTATE (a backend crash).
const ALLOWED: &[(&str, &str)] = &[];

const CONFIGURE: &str =
    "SELECT queen.configure($1, lease_time => 30, retry_limit => 1, dead_letter_queue => true, retention => 1)";

#[derive(Default)]
struct ErrorStat {
    count: u64,
    /// Per operation: how many, and the first message.
    ops: BTreeMap<&'static str, (u64, String)>,
}

impl ErrorStat {
    fn samples(&self) -> String {
        self.ops.iter().map(|(op, (n, text))| format!("\n      {op} x{n}: {text}")).collect()
    }
}

#[derive(Default)]
struct Stats {
    /// Per operation: (ok, failed).
    ops: BTreeMap<&'static str, (u64, u64)>,
    /// Per SQLSTATE ("none" when the error carried none).
    errors: BTreeMap<String, ErrorStat>,
    /// Work done, by kind.
    work: BTreeMap<&'static str, u64>,
}

type Shared = Arc<Mutex<Stats>>;

/// Records one call's outcome under `op`; returns its value when it succeeded.
fn record<T>(stats: &Shared, op: &'static str, r: Result<T, postgres::Error>) -> Option<T> {
    let mut s = stats.lock().unwrap();
    match r {
        Ok(v) => {
            s.ops.entry(op).or_default().0 += 1;
            Some(v)
        }
        Err(e) => {
            s.ops.entry(op).or_default().1 += 1;
            let code = e.code().map_or_else(|| "none".to_string(), |c| c.code().to_string());
            let text = match e.as_db_error() {
                Some(db) => {
                    let mut t = db.message().to_string();
                    for (label, part) in [("DETAIL", db.detail()), ("HINT", db.hint()), ("WHERE", db.where_())] {
                        if let Some(part) = part {
                            t.push_str(&format!("\n{label}: {part}"));
                        }
                    }
                    // Without the Rust backtrace that a pgrx error may carry.
                    let frame = |l: &str| {
                        let l = l.trim_start();
                        l.is_empty()
                            || l.starts_with("at ")
                            || l.contains("backtrace")
                            || l.split_once(": ").is_some_and(|(n, _)| n.parse::<u32>().is_ok())
                    };
                    let lines: Vec<&str> = t.lines().filter(|l| !frame(l)).collect();
                    lines.join(" | ").chars().take(600).collect()
                }
                None => e.to_string(),
            };
            let stat = s.errors.entry(code).or_default();
            stat.count += 1;
            let per_op = stat.ops.entry(op).or_insert_with(|| (0, text));
            per_op.0 += 1;
            None
        }
    }
}

fn bump(stats: &Shared, what: &'static str, n: u64) {
    *stats.lock().unwrap().work.entry(what).or_default() += n;
}

/// A session with a statement timeout (a hang fails the run instead of hanging it) and no
/// lock timeout (a deadlock must be left to the deadlock detector).
fn session() -> Client {
    let mut c = connect();
    c.batch_execute("SET statement_timeout = '30s'; SET lock_timeout = 0").unwrap();
    c
}

/// After a failed call: a new session if the old one is gone.
fn revive(c: &mut Client) {
    if c.is_closed() {
        *c = session();
    }
}

/// The test cluster's server log (`scripts/cluster.sh` writes it to QUEEN_TEST_DIR), if
/// this run can read it: deadlocks whose victim is no session of this test (the background
/// worker's retention or compaction passes) are found there.
fn server_log() -> Option<std::path::PathBuf> {
    let path = std::path::Path::new(&std::env::var("QUEEN_TEST_DIR").ok()?).join("server.log");
    std::fs::metadata(&path).is_ok().then_some(path)
}

/// The server log's "deadlock detected" reports written after byte `from`, each with the
/// lines that follow it (DETAIL, the processes, the statement).
fn logged_deadlocks(path: &std::path::Path, from: u64) -> Vec<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut text = String::new();
    let mut f = std::fs::File::open(path).expect("open the server log");
    f.seek(SeekFrom::Start(from)).unwrap();
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).unwrap();
    text.push_str(&String::from_utf8_lossy(&bytes));
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("deadlock detected"))
        .map(|(i, _)| lines[i..(i + 6).min(lines.len())].join("\n"))
        .collect()
}

fn stress_secs() -> u64 {
    std::env::var("QUEEN_STRESS_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(60)
}

fn item(queue: &str, partition: &str, tx: Option<&str>, payload: Value) -> Value {
    let mut v = json!({"queue": queue, "partition": partition, "payload": payload});
    if let Some(tx) = tx {
        v["transactionId"] = json!(tx);
    }
    v
}

/// Counts a push call's rows: messages queued and duplicates.
fn count_push(stats: &Shared, rows: &[postgres::Row]) {
    let dups = rows.iter().filter(|r| r.get::<_, String>(0) == "duplicate").count() as u64;
    bump(stats, "messages queued", rows.len() as u64 - dups);
    bump(stats, "duplicates", dups);
}

const PUSH: &str = "SELECT status FROM queen.push_batch($1::jsonb)";

fn pusher(p: usize, queues: [String; 2], stop: Instant, stats: Shared) {
    let mut r = StdRng::seed_from_u64(0x10c0 + p as u64);
    let mut c = session();
    let mut n = 0u64;
    // Producer ids pushed lately, to push again (dedup hits): (queue index, partition, id).
    let mut recent: Vec<(usize, String, String)> = Vec::new();
    while Instant::now() < stop {
        n += 1;
        let payload = json!({"p": p, "n": n});
        if r.gen_bool(0.3) {
            // Two pushes in one transaction: a partition of queue x that others push to
            // (created by this transaction if a delete_queue just removed it), then a new
            // partition of x that only this transaction creates, and the first one again.
            // Creations that others may make too all come in the first statement: two
            // transactions that create the same two partitions (or queues) in separate
            // statements, in opposite orders, wait for each other's uncommitted rows, as
            // any two inserts of the same unique keys do (docs/locking.md).
            let x = r.gen_range(0..2);
            let existing = format!("e{}", r.gen_range(0..6));
            let first = json!([item(&queues[x], &existing, None, payload.clone())]);
            let second = json!([
                item(&queues[x], &format!("n{p}-{n}"), None, payload.clone()),
                item(&queues[x], &existing, None, payload.clone()),
            ]);
            let commit = r.gen_bool(0.9);
            let res = c.transaction().and_then(|mut tx| {
                let a = tx.query(PUSH, &[&first])?;
                let b = tx.query(PUSH, &[&second])?;
                if commit {
                    tx.commit()?;
                } else {
                    tx.rollback()?;
                }
                Ok((a, b))
            });
            match record(&stats, "push: two statements in a transaction", res) {
                Some((a, b)) if commit => {
                    count_push(&stats, &a);
                    count_push(&stats, &b);
                    bump(&stats, "new partitions pushed to", 1);
                }
                Some(_) => bump(&stats, "two-statement pushes rolled back", 1),
                None => revive(&mut c),
            }
            continue;
        }
        // One batch to both queues: existing partitions, now and then a new one, some
        // producer ids, some of them pushed before.
        let mut items = Vec::new();
        let mut new_parts = 0;
        for (qi, q) in queues.iter().enumerate() {
            for k in 0..r.gen_range(1..=3) {
                let part = format!("e{}", r.gen_range(0..6));
                let tx = r.gen_bool(0.2).then(|| format!("t{p}-{n}-{qi}-{k}"));
                if let Some(tx) = &tx {
                    recent.push((qi, part.clone(), tx.clone()));
                    if recent.len() > 32 {
                        recent.remove(0);
                    }
                }
                items.push(item(q, &part, tx.as_deref(), payload.clone()));
            }
            if r.gen_bool(0.5) {
                new_parts += 1;
                let tx = r.gen_bool(0.3).then(|| format!("t{p}-{n}-{qi}-new"));
                items.push(item(q, &format!("n{p}-{n}"), tx.as_deref(), payload.clone()));
            }
        }
        if !recent.is_empty() && r.gen_bool(0.2) {
            let (qi, part, tx) = recent[r.gen_range(0..recent.len())].clone();
            items.push(item(&queues[qi], &part, Some(&tx), payload.clone()));
        }
        if r.gen_bool(0.5) {
            items.reverse();
        }
        match record(&stats, "push: one batch to both queues", c.query(PUSH, &[&Value::Array(items)])) {
            Some(rows) => {
                count_push(&stats, &rows);
                bump(&stats, "new partitions pushed to", new_parts);
            }
            None => revive(&mut c),
        }
    }
}

fn retainer(queues: [String; 2], stop: Instant, stats: Shared) {
    let mut r = StdRng::seed_from_u64(0x2e7a);
    let mut c = session();
    while Instant::now() < stop {
        let all = c.query_one("SELECT queen.retain()", &[]).map(|row| row.get::<_, Value>(0));
        match record(&stats, "retain()", all) {
            Some(v) => bump(&stats, "segments retention deleted", v["segmentsDeleted"].as_u64().unwrap_or(0)),
            None => revive(&mut c),
        }
        let q = &queues[r.gen_range(0..2)];
        let one = c.query_one("SELECT queen.retain($1)", &[q]).map(|row| row.get::<_, Value>(0));
        match record(&stats, "retain(queue)", one) {
            Some(v) => bump(&stats, "segments retention deleted", v["segmentsDeleted"].as_u64().unwrap_or(0)),
            None => revive(&mut c),
        }
        thread::sleep(Duration::from_millis(r.gen_range(5..40)));
    }
}

fn deleter(queues: [String; 2], stop: Instant, stats: Shared) {
    let mut r = StdRng::seed_from_u64(0xde1e);
    let mut c = session();
    loop {
        let nap = Duration::from_millis(r.gen_range(500..2000));
        if Instant::now() + nap >= stop {
            return;
        }
        thread::sleep(nap);
        // Mostly the second queue, so that the first lives long enough for retention to
        // find consumed segments older than a second; now and then the first as well.
        let q = &queues[usize::from(r.gen_bool(0.75))];
        let res = c.query_one("SELECT queen.delete_queue($1)", &[q]).map(|row| row.get::<_, Value>(0));
        match record(&stats, "delete_queue", res) {
            Some(v) if v["deleted"] == true => bump(&stats, "queues deleted", 1),
            Some(_) => {}
            None => revive(&mut c),
        }
        if record(&stats, "configure", c.execute(CONFIGURE, &[q])).is_none() {
            revive(&mut c);
        }
    }
}

const POP: &str = "SELECT lease_id, partition_id, msg_offset
                     FROM queen.pop($1, $2, batch => $3, max_partitions => $4, lease_seconds => 30)";

/// Pop rows by partition: the lease, and each partition's offsets in order.
fn by_partition(rows: &[postgres::Row]) -> (uuid::Uuid, BTreeMap<uuid::Uuid, Vec<i64>>) {
    let lease: uuid::Uuid = rows[0].get(0);
    let mut parts: BTreeMap<uuid::Uuid, Vec<i64>> = BTreeMap::new();
    for row in rows {
        assert_eq!(row.get::<_, uuid::Uuid>(0), lease, "one pop, one lease");
        parts.entry(row.get(1)).or_default().push(row.get(2));
    }
    (lease, parts)
}

fn ack_dlq_count(v: &Value) -> u64 {
    v["items"].as_array().map_or(0, |items| items.iter().filter(|i| i["dlq"] == true).count() as u64)
}

/// Ack items for a dead-lettering ack: per partition, `completed` just below a random
/// offset and a signal at it (mostly dlq or failed), in partition order or reversed.
fn signals(parts: &BTreeMap<uuid::Uuid, Vec<i64>>, r: &mut StdRng) -> Value {
    let mut items = Vec::new();
    for (pid, offsets) in parts {
        let j = r.gen_range(0..offsets.len());
        if j > 0 {
            items.push(json!({"partitionId": pid.to_string(), "offset": offsets[j - 1]}));
        }
        let status = match r.gen_range(0..10) {
            0..=4 => "dlq",
            5..=7 => "failed",
            8 => "retry",
            _ => "completed",
        };
        items.push(json!({"partitionId": pid.to_string(), "offset": offsets[j], "status": status, "error": "stress"}));
    }
    if r.gen_bool(0.5) {
        items.reverse();
    }
    Value::Array(items)
}

/// Pops in group "dl" and acks with signals: dlq, failed (dead-letters once the retry
/// limit of 1 is spent), retry, or completed; a fifth of the time pop and ack share a
/// transaction.
fn dead_letterer(k: usize, queues: [String; 2], stop: Instant, stats: Shared) {
    let mut r = StdRng::seed_from_u64(0xd1 + k as u64);
    let mut c = session();
    while Instant::now() < stop {
        let q = queues[r.gen_range(0..2)].clone();
        let one_tx = r.gen_bool(0.2);
        let res = if one_tx {
            let res = c.transaction().and_then(|mut tx| {
                let rows = tx.query(POP, &[&q, &"dl", &8i32, &2i32])?;
                if rows.is_empty() {
                    tx.commit()?;
                    return Ok(None);
                }
                let (lease, parts) = by_partition(&rows);
                let acks = signals(&parts, &mut r);
                let v: Value = tx.query_one("SELECT queen.ack($1, $2::jsonb)", &[&lease, &acks])?.get(0);
                // What the signals left leased (nothing, unless only completions were
                // sent): extended, then completed, still holding the dead letters' rows.
                tx.query_one("SELECT queen.extend_lease($1, 30)", &[&lease])?;
                tx.query_one("SELECT queen.ack($1)", &[&lease])?;
                tx.commit()?;
                Ok(Some(v))
            });
            record(&stats, "dl: pop + dead-lettering ack + extend + ack(lease) in a transaction", res)
        } else {
            let rows = match record(&stats, "dl: pop", c.query(POP, &[&q, &"dl", &8i32, &2i32])) {
                Some(rows) => rows,
                None => {
                    revive(&mut c);
                    continue;
                }
            };
            if rows.is_empty() {
                Some(None)
            } else {
                let (lease, parts) = by_partition(&rows);
                let acks = signals(&parts, &mut r);
                let res = c.query_one("SELECT queen.ack($1, $2::jsonb)", &[&lease, &acks]).map(|row| row.get(0));
                record(&stats, "dl: dead-lettering ack", res).map(Some)
            }
        };
        match res {
            Some(Some(v)) => bump(&stats, "messages dead-lettered", ack_dlq_count(&v)),
            Some(None) => thread::sleep(Duration::from_millis(5)),
            None => revive(&mut c),
        }
    }
}

/// Pops leases over up to six partitions in group "ml", extends them and acks them in an
/// order other than partition order, in one of three ways.
fn multi_laner(k: usize, queues: [String; 2], stop: Instant, stats: Shared) {
    let mut r = StdRng::seed_from_u64(0x3a1 + k as u64);
    let mut c = session();
    while Instant::now() < stop {
        let q = queues[r.gen_range(0..2)].clone();
        let rows = match record(&stats, "ml: pop", c.query(POP, &[&q, &"ml", &60i32, &6i32])) {
            Some(rows) => rows,
            None => {
                revive(&mut c);
                continue;
            }
        };
        if rows.is_empty() {
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        let (lease, parts) = by_partition(&rows);
        // Highest partition first: the reverse of the order lanes are locked in.
        let lasts: Vec<(uuid::Uuid, i64)> = parts.iter().rev().map(|(p, o)| (*p, *o.last().unwrap())).collect();
        let reversed = Value::Array(
            lasts.iter().map(|(p, o)| json!({"partitionId": p.to_string(), "offset": o})).collect::<Vec<_>>(),
        );
        let extend = "SELECT (queen.extend_lease($1, $2) ->> 'renewed')::int8";
        let dlq_first = r.gen_bool(0.5);
        let (op, res): (&'static str, Result<i64, postgres::Error>) = match r.gen_range(0..3) {
            0 => (
                "ml: extend + ack(items, reversed) in a transaction",
                c.transaction().and_then(|mut tx| {
                    let renewed: i64 = tx.query_one(extend, &[&lease, &60i32])?.get(0);
                    tx.query_one("SELECT queen.ack($1, $2::jsonb)", &[&lease, &reversed])?;
                    tx.commit()?;
                    Ok(renewed)
                }),
            ),
            1 => ("ml: extend, then one ack per lane (reversed), extending between", {
                let mut res = c.query_one(extend, &[&lease, &30i32]).map(|row| row.get::<_, i64>(0));
                for (i, (pid, off)) in lasts.iter().enumerate() {
                    if res.is_err() {
                        break;
                    }
                    res = c.query_one("SELECT queen.ack($1, $2, $3)", &[&lease, pid, off]).map(|_| 0).and(res);
                    if i % 2 == 0 {
                        res = c.query_one(extend, &[&lease, &45i32]).map(|_| 0).and(res);
                    }
                }
                res
            }),
            _ => (
                "ml: ack(last lane, completed or dlq) + extend + ack(lease) in a transaction",
                c.transaction().and_then(|mut tx| {
                    // A dead letter's row holds the queue row (its foreign key) until the
                    // end of the transaction, across the lane waits that follow.
                    let (pid, off) = lasts[0];
                    let status = if dlq_first { "dlq" } else { "completed" };
                    tx.query_one("SELECT queen.ack($1, $2, $3, $4, 'stress')", &[&lease, &pid, &off, &status])?;
                    let renewed: i64 = tx.query_one(extend, &[&lease, &60i32])?.get(0);
                    tx.query_one("SELECT queen.ack($1)", &[&lease])?;
                    tx.commit()?;
                    Ok(renewed)
                }),
            ),
        };
        match record(&stats, op, res) {
            Some(renewed) if parts.len() > 1 && renewed > 0 => bump(&stats, "multi-lane leases extended and acked", 1),
            Some(_) => bump(&stats, "single-lane leases extended and acked", 1),
            None => revive(&mut c),
        }
    }
}

#[test]
fn invariant_5_no_deadlocks_under_mixed_load() {
    let secs = stress_secs();
    let queues = [unique("lock-a"), unique("lock-b")];
    let mut admin = session();
    for q in &queues {
        admin.execute(CONFIGURE, &[q]).unwrap();
    }
    let log = server_log();
    let log_from = log.as_ref().map_or(0, |p| std::fs::metadata(p).unwrap().len());
    let stats: Shared = Arc::new(Mutex::new(Stats::default()));
    let t0 = Instant::now();
    let stop = t0 + Duration::from_secs(secs);
    let mut handles = Vec::new();
    let spawn = |f: Box<dyn FnOnce() + Send>| thread::spawn(f);
    for p in 0..2 {
        let (q, s) = (queues.clone(), stats.clone());
        handles.push(("pusher", spawn(Box::new(move || pusher(p, q, stop, s)))));
    }
    for k in 0..2 {
        let (q, s) = (queues.clone(), stats.clone());
        handles.push(("dead-letterer", spawn(Box::new(move || dead_letterer(k, q, stop, s)))));
        let (q, s) = (queues.clone(), stats.clone());
        handles.push(("multi-lane", spawn(Box::new(move || multi_laner(k, q, stop, s)))));
    }
    let (q, s) = (queues.clone(), stats.clone());
    handles.push(("retention", spawn(Box::new(move || retainer(q, stop, s)))));
    let (q, s) = (queues.clone(), stats.clone());
    handles.push(("deleter", spawn(Box::new(move || deleter(q, stop, s)))));
    let mut panicked = Vec::new();
    for (name, h) in handles {
        if h.join().is_err() {
            panicked.push(name);
        }
    }

    // What is left of deleted queues: rows whose partition or queue no longer exists.
    let orphans: Vec<(String, i64)> = admin
        .query(
            "SELECT 'segments', count(*) FROM queen.segments s
              WHERE NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.partition_id = s.partition_id)
             UNION ALL
             SELECT 'fresh_segments', count(*) FROM queen.fresh_segments s
              WHERE NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.partition_id = s.partition_id)
             UNION ALL
             SELECT 'lanes', count(*) FROM queen.lanes l
              WHERE NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.partition_id = l.partition_id)
             UNION ALL
             SELECT 'dedup', count(*) FROM queen.dedup d
              WHERE NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.partition_id = d.partition_id)
             UNION ALL
             SELECT 'log_dlq', count(*) FROM queen.log_dlq d
              WHERE NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.partition_id = d.partition_id)",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();

    let deadlocks_logged = log.as_deref().map(|p| logged_deadlocks(p, log_from));

    let s = stats.lock().unwrap();
    eprintln!("lock_order: {secs} s planned, {:.1} s run", t0.elapsed().as_secs_f64());
    eprintln!("operations (ok / failed):");
    for (op, (ok, failed)) in &s.ops {
        eprintln!("  {op:<76} {ok:>8} / {failed}");
    }
    eprintln!("work:");
    for (what, n) in &s.work {
        eprintln!("  {what:<76} {n:>8}");
    }
    eprintln!("errors by SQLSTATE:");
    for (code, e) in &s.errors {
        eprintln!("  {code}: {}{}", e.count, e.samples());
    }
    eprintln!("rows of deleted partitions left (informational): {orphans:?}");
    match &deadlocks_logged {
        Some(found) => eprintln!("deadlocks in the server log: {}", found.len()),
        None => eprintln!("server log not readable (QUEEN_TEST_DIR): only this test's sessions are checked"),
    }
    for q in &queues {
        let _ = admin.execute("SELECT queen.delete_queue($1)", &[q]);
    }

    assert!(panicked.is_empty(), "threads panicked: {panicked:?}");
    let deadlocks = s.errors.get("40P01").map_or(0, |e| e.count);
    assert_eq!(deadlocks, 0, "deadlocks (40P01):{}", s.errors["40P01"].samples());
    if let Some(found) = &deadlocks_logged {
        assert!(found.is_empty(), "deadlocks in the server log (any session):\n{}", found.join("\n---\n"));
    }
    let allowed: BTreeSet<&str> = ALLOWED.iter().map(|(code, _)| *code).collect();
    let bad: Vec<String> = s
        .errors
        .iter()
        .filter(|(code, _)| !allowed.contains(code.as_str()))
        .map(|(code, e)| format!("{code} x{}:{}", e.count, e.samples()))
        .collect();
    assert!(bad.is_empty(), "errors that are not documented queen errors of these races:\n{}", bad.join("\n"));

    // The run did every kind of work.
    let work = |what: &str| s.work.get(what).copied().unwrap_or(0);
    for (what, min) in [
        ("messages queued", 100),
        ("new partitions pushed to", 10),
        ("queues deleted", 1),
        ("messages dead-lettered", 1),
        ("multi-lane leases extended and acked", 1),
    ] {
        assert!(work(what) >= min, "too little work: {what} = {} (at least {min})", work(what));
    }
    for op in ["retain()", "retain(queue)", "push: two statements in a transaction"] {
        assert!(s.ops.get(op).is_some_and(|(ok, _)| *ok > 0), "{op} never succeeded");
    }
}
