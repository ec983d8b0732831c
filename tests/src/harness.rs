//! The concurrency invariants harness (issue 6/7): real sessions push (some transactions
//! roll back), consumers in two groups pop over 16 partitions with random outcomes —
//! complete, extend then complete, no ack until the lease expires, failed, retry, dlq —
//! some of them long-polling. Optionally a chaos thread `kill -9`s backends in the middle
//! of a push, a pop, an ack or a dead-lettering ack (the postmaster then restarts every
//! session), or stops the server with `pg_ctl stop -m immediate` and starts it again. At the end, per group and partition:
//!
//! - every committed push was delivered, at the offset its push returned;
//! - the cursor advances that acks reported tile 1..=head: every offset passed once, and
//!   none that holds a message skipped (offsets of rolled-back pushes are gaps the cursor
//!   may step over; with crashes, a message may be passed only where an ack of unknown
//!   fate could reach);
//! - every dead-lettered message has exactly one `log_dlq` row;
//! - nothing from a rolled-back push appeared;
//! - an offset was delivered again only after a delivery that no ack committed (lease
//!   expiry, a nack, or a crash), and these duplicates are counted by cause.
//!
//! Sizes come from the environment so that the same code is the CI run and the large run:
//! QUEEN_HARNESS_MESSAGES, QUEEN_HARNESS_CONSUMERS (per group), QUEEN_HARNESS_PUSHERS,
//! QUEEN_HARNESS_SEED.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use postgres::Client;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::{connect_to_retrying, dsn, unique};

pub struct Config {
    pub messages: usize,
    pub pushers: usize,
    pub consumers_per_group: usize,
    pub partitions: usize,
    /// Most messages per push; 1: single-message `queen.push` calls.
    pub batch_max: usize,
    /// A session runs `queen.compact` over and over (the chaos thread may kill it).
    pub compactor: bool,
    pub groups: Vec<String>,
    pub lease_seconds: i32,
    pub retry_limit: i32,
    /// `kill -9` this many busy backends during the run (0: none).
    pub kills: usize,
    pub seed: u64,
    /// The run fails instead of hanging past this.
    pub deadline: Duration,
    /// A REPEATABLE READ transaction, opened before the sessions start, stays open until
    /// the checks are done: the xmin horizon stands still for the whole run.
    pub held_snapshot: bool,
    /// The queue's `retention` in seconds (0: keeps everything).
    pub retention: i32,
    /// A session runs `queen.retain()` over and over with `queen.rotation_min_size = 0`,
    /// so the segment generations rotate whenever the oldest one is mostly dead. Counts
    /// only in a database of the test's own (`own_database`): elsewhere other tests' data
    /// decides when a rotation is due. The chaos thread kills it too.
    pub rotator: bool,
    /// The queue to use (None: a fresh one). It must hold nothing the harness did not push.
    pub queue: Option<String>,
    /// Where the checks read the queue's state, when not where the sessions connect: on
    /// Citus, the queue's home worker (`queen.status` runs on the node that receives it).
    pub check_dsn: Option<String>,
    /// Batches go through `push_batch(queue, items)`, the form Citus routes, instead of
    /// `push_batch(items)`.
    pub routed: bool,
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

impl Config {
    /// The CI size unless the environment says otherwise.
    pub fn from_env(messages: usize, consumers: usize, kills: usize) -> Config {
        Config {
            messages: env_or("QUEEN_HARNESS_MESSAGES", messages),
            pushers: env_or("QUEEN_HARNESS_PUSHERS", 4),
            consumers_per_group: env_or("QUEEN_HARNESS_CONSUMERS", consumers),
            partitions: 16,
            batch_max: 50,
            compactor: false,
            groups: vec!["ga".into(), "gb".into()],
            lease_seconds: 1,
            retry_limit: 2,
            kills,
            seed: env_or("QUEEN_HARNESS_SEED", 0x51ee) as u64,
            deadline: Duration::from_secs(env_or("QUEEN_HARNESS_DEADLINE_S", 900) as u64),
            held_snapshot: false,
            retention: 0,
            rotator: false,
            queue: None,
            check_dsn: None,
            routed: false,
        }
    }
}

/// What a run saw, for the issue note and the test output.
#[derive(Debug, Default)]
pub struct Report {
    pub pushed: usize,
    pub rolled_back: usize,
    pub push_unknown: usize,
    pub deliveries: usize,
    pub duplicates: BTreeMap<&'static str, usize>,
    pub dead_lettered: usize,
    pub kills: BTreeMap<&'static str, usize>,
    pub seconds: f64,
    /// With a held snapshot: lane journal entries written during the run, and how many
    /// of them are still in the journal tables at the end.
    pub journal_written: i64,
    pub journal_left: i64,
    /// Rotations of the segment generations by the rotator session.
    pub rotations: usize,
}

type Addr = (uuid::Uuid, i64); // (partition_id, offset)

#[derive(Default)]
struct Shared {
    /// Committed pushes: address -> message id (the payload's "id").
    committed: HashMap<Addr, String>,
    /// Ids of pushes whose transaction rolled back.
    rolled_back: HashSet<String>,
    /// Ids of pushes whose fate is unknown (the connection died during the call).
    unknown: HashSet<String>,
    /// Per group: every delivery, in the order pops returned.
    deliveries: HashMap<String, Vec<Delivery>>,
    /// Per group: cursor advances reported by acks: (partition, from, to), inclusive.
    advances: HashMap<String, Vec<(uuid::Uuid, i64, i64)>>,
    /// Per group: spans an ack of unknown fate (connection died) might have committed.
    maybe_advances: HashMap<String, Vec<(uuid::Uuid, i64, i64)>>,
    /// Per group: addresses an ack reported dead-lettered.
    dead: HashMap<String, Vec<Addr>>,
    maybe_dead: HashMap<String, Vec<Addr>>,
}

struct Delivery {
    seq: u64,
    addr: Addr,
    id: String,
    /// How this delivery ended: None if an ack committed its offset, else why not.
    fate: Option<&'static str>,
}

/// Without crashes every call must succeed: an error is a finding, not noise.
fn lost_connection(crashes: bool, e: &postgres::Error, what: &str) {
    assert!(crashes, "{what} failed without any crash: {e}");
}

fn connect_retrying(deadline: Instant) -> Client {
    connect_to_retrying(&dsn(), deadline)
}

#[derive(Clone, Copy, PartialEq)]
enum Outcome {
    Complete,
    ExtendThenComplete,
    NoAck,
    Signal(&'static str), // failed, retry, dlq
}

fn pick_outcome(r: &mut StdRng) -> Outcome {
    match r.gen_range(0..100) {
        0..=67 => Outcome::Complete,
        68..=75 => Outcome::ExtendThenComplete,
        76..=79 => Outcome::NoAck,
        80..=88 => Outcome::Signal("failed"),
        89..=94 => Outcome::Signal("retry"),
        _ => Outcome::Signal("dlq"),
    }
}

pub fn run(cfg: &Config) -> Report {
    let t0 = Instant::now();
    let deadline = t0 + cfg.deadline;
    let queue = cfg.queue.clone().unwrap_or_else(|| unique("harness"));
    let mut admin = connect_retrying(deadline);
    admin
        .execute(
            "SELECT queen.configure($1, lease_time => 30, retry_limit => $2, dead_letter_queue => true,
                                    retention => $3)",
            &[&queue, &cfg.retry_limit, &cfg.retention],
        )
        .unwrap();
    let journal_written = |c: &mut Client| -> i64 {
        // (Statistics: backends flush them within a second.)
        thread::sleep(Duration::from_millis(1200));
        c.query_one(
            "SELECT coalesce(sum(n_tup_ins), 0)::int8 FROM pg_stat_user_tables
              WHERE schemaname = 'queen' AND relname LIKE 'lane\\_journal\\__'",
            &[],
        )
        .unwrap()
        .get(0)
    };
    let mut holder = None;
    let mut written_before = 0;
    if cfg.held_snapshot {
        written_before = journal_written(&mut admin);
        let mut h = connect_retrying(deadline);
        h.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM queen.partitions;").unwrap();
        let pid: i32 = h.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        holder = Some((h, pid, Instant::now()));
    }
    let shared = Arc::new(Mutex::new(Shared::default()));
    let seq = Arc::new(AtomicU64::new(0));
    let pushers_left = Arc::new(AtomicUsize::new(cfg.pushers));
    let stop_chaos = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();

    for p in 0..cfg.pushers {
        let share = cfg.messages / cfg.pushers + usize::from(p < cfg.messages % cfg.pushers);
        let (shared, queue, left) = (shared.clone(), queue.clone(), pushers_left.clone());
        let (seed, parts, crashes) = (cfg.seed ^ ((p as u64 + 1) * 0x9e37), cfg.partitions, cfg.kills > 0);
        let (batch_max, routed) = (cfg.batch_max, cfg.routed);
        handles.push(thread::spawn(move || {
            pusher(p, share, parts, batch_max, routed, &queue, seed, &shared, crashes, deadline);
            left.fetch_sub(1, Ordering::SeqCst);
        }));
    }
    for g in &cfg.groups {
        for k in 0..cfg.consumers_per_group {
            let (shared, queue, seq, left, group) =
                (shared.clone(), queue.clone(), seq.clone(), pushers_left.clone(), g.clone());
            let seed = cfg.seed ^ ((k as u64 + 7) << 20) ^ group.len() as u64 ^ g.as_bytes()[1] as u64;
            let (lease, crashes, check_dsn) = (cfg.lease_seconds, cfg.kills > 0, cfg.check_dsn.clone());
            handles.push(thread::spawn(move || {
                consumer(&queue, &group, lease, seed, &shared, &seq, &left, crashes, check_dsn.as_deref(), deadline)
            }));
        }
    }
    let chaos = (cfg.kills > 0).then(|| {
        let (stop, kills, seed, compactor, rotator) =
            (stop_chaos.clone(), cfg.kills, cfg.seed, cfg.compactor, cfg.rotator);
        thread::spawn(move || chaos(kills, seed, compactor, rotator, &stop, deadline))
    });
    let compactor = cfg.compactor.then(|| {
        let (stop, queue) = (stop_chaos.clone(), queue.clone());
        thread::spawn(move || {
            let mut c = connect_retrying(deadline);
            let mut passes = 0usize;
            while !stop.load(Ordering::SeqCst) {
                match c.execute("SELECT queen.compact($1)", &[&queue]) {
                    Ok(_) => passes += 1,
                    Err(_) => c = connect_retrying(deadline), // killed by the chaos thread
                }
                thread::sleep(Duration::from_millis(20));
            }
            passes
        })
    });
    let rotator = cfg.rotator.then(|| {
        let stop = stop_chaos.clone();
        thread::spawn(move || {
            let session = || loop {
                // (The chaos thread may kill the server between the two.)
                let mut c = connect_retrying(deadline);
                if c.batch_execute("SET queen.rotation_min_size = 0").is_ok() {
                    return c;
                }
            };
            let mut c = session();
            let mut rotations = 0usize;
            while !stop.load(Ordering::SeqCst) {
                match c.query_one("SELECT (queen.retain()->>'generationRotated')::bool", &[]) {
                    Ok(row) => rotations += usize::from(row.get::<_, bool>(0)),
                    // Killed by the chaos thread: a new session. Any other error is a failure.
                    Err(e) if c.is_closed() || e.code().is_none() => c = session(),
                    Err(e) => panic!("queen.retain() failed: {e}"),
                }
                thread::sleep(Duration::from_millis(50));
            }
            rotations
        })
    });
    for h in handles {
        h.join().expect("a harness session panicked");
    }
    stop_chaos.store(true, Ordering::SeqCst);
    if let Some(h) = compactor {
        assert!(h.join().expect("compactor thread") > 0, "the compactor never finished a pass");
    }
    let rotations = rotator.map(|h| h.join().expect("rotator thread")).unwrap_or(0);
    let kills = chaos.map(|h| h.join().expect("chaos thread")).unwrap_or_default();

    let mut admin = connect_to_retrying(cfg.check_dsn.as_deref().unwrap_or(&dsn()), deadline);
    let mut report = check(cfg, &queue, &mut admin, &shared.lock().unwrap());
    report.rotations = rotations;
    if let Some((mut h, pid, held_at)) = holder {
        report.journal_written = journal_written(&mut admin) - written_before;
        report.journal_left = admin
            .query_one(
                "SELECT (SELECT count(*) FROM queen.lane_journal_0) + (SELECT count(*) FROM queen.lane_journal_1)",
                &[],
            )
            .unwrap()
            .get(0);
        // Still the same snapshot, open all along.
        let xmin_held: bool = admin
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                 WHERE pid = $1 AND state = 'idle in transaction' AND backend_xmin IS NOT NULL
                                   AND xact_start < now() - make_interval(secs => $2))",
                &[&pid, &(held_at.elapsed().as_secs_f64() * 0.9)],
            )
            .unwrap()
            .get(0);
        assert!(xmin_held, "the held snapshot was not held for the whole run");
        h.batch_execute("COMMIT").unwrap();
    }
    report.kills = kills;
    report.seconds = t0.elapsed().as_secs_f64();
    report
}

/// One push call: single messages through `queen.push`, more through `queen.push_batch`
/// (with `routed`, the form that names the queue). Rows: (idx, partition_id, msg_offset).
fn push_call(
    c: &mut impl postgres::GenericClient,
    single: bool,
    routed: bool,
    items: &Value,
) -> Result<Vec<postgres::Row>, postgres::Error> {
    if routed && !single {
        let queue = items[0]["queue"].as_str().unwrap();
        return c.query("SELECT idx, partition_id, msg_offset FROM queen.push_batch($1::text, $2)", &[&queue, items]);
    }
    if single {
        let it = &items[0];
        let (queue, partition) = (it["queue"].as_str().unwrap(), it["partition"].as_str().unwrap());
        c.query(
            "SELECT 0::int4, partition_id, msg_offset FROM queen.push($1, $2, $3)",
            &[&queue, &it["payload"], &partition],
        )
    } else {
        c.query("SELECT idx, partition_id, msg_offset FROM queen.push_batch($1)", &[items])
    }
}

#[allow(clippy::too_many_arguments)]
fn pusher(
    p: usize,
    share: usize,
    partitions: usize,
    batch_max: usize,
    routed: bool,
    queue: &str,
    seed: u64,
    shared: &Mutex<Shared>,
    crashes: bool,
    deadline: Instant,
) {
    let mut r = StdRng::seed_from_u64(seed);
    let mut c = connect_retrying(deadline);
    let (mut done, mut n) = (0usize, 0u64);
    while done < share {
        assert!(Instant::now() < deadline, "pusher {p}: deadline passed");
        let k = r.gen_range(1..=batch_max).min(share - done);
        let ids: Vec<String> = (0..k).map(|i| format!("{p}-{}", n + i as u64)).collect();
        n += k as u64;
        let items: Vec<Value> = ids
            .iter()
            .map(|id| json!({"queue": queue, "partition": format!("p{}", r.gen_range(0..partitions)), "payload": {"id": id}}))
            .collect();
        let items = Value::Array(items);
        if r.gen_bool(0.2) {
            // Pushed, then rolled back: none of these may ever be delivered.
            let res = c.transaction().and_then(|mut tx| {
                push_call(&mut tx, batch_max == 1, routed, &items)?;
                tx.rollback()
            });
            let mut s = shared.lock().unwrap();
            match res {
                Ok(()) => s.rolled_back.extend(ids),
                Err(e) => {
                    lost_connection(crashes, &e, "a rolled-back push_batch");
                    s.unknown.extend(ids); // rolled back or lost: either way never committed
                    drop(s);
                    c = connect_retrying(deadline);
                }
            }
            continue;
        }
        match push_call(&mut c, batch_max == 1, routed, &items) {
            Ok(rows) => {
                let mut s = shared.lock().unwrap();
                for row in rows {
                    let idx: i32 = row.get(0);
                    s.committed.insert((row.get(1), row.get(2)), ids[idx as usize].clone());
                }
                done += k;
            }
            Err(e) => {
                lost_connection(crashes, &e, "push_batch");
                shared.lock().unwrap().unknown.extend(ids);
                c = connect_retrying(deadline);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn consumer(
    queue: &str,
    group: &str,
    lease_seconds: i32,
    seed: u64,
    shared: &Mutex<Shared>,
    seq: &AtomicU64,
    pushers_left: &AtomicUsize,
    crashes: bool,
    check_dsn: Option<&str>,
    deadline: Instant,
) {
    let mut r = StdRng::seed_from_u64(seed);
    let mut c = connect_retrying(deadline);
    // Where `drained` reads the queue's state: the sessions' server, or `check_dsn`.
    let mut checker = check_dsn.map(|d| connect_to_retrying(d, deadline));
    loop {
        assert!(Instant::now() < deadline, "consumer in {group}: deadline passed before the queue drained");
        let batch = r.gen_range(1..=20i32);
        let max_partitions = r.gen_range(1..=3i32);
        let wait_ms = if r.gen_bool(0.3) { 200 } else { 0 };
        let rows = match c.query(
            "SELECT lease_id, partition_id, msg_offset, payload ->> 'id'
               FROM queen.pop($1, $2, batch => $3, max_partitions => $4, lease_seconds => $5, wait_ms => $6)",
            &[&queue, &group, &batch, &max_partitions, &lease_seconds, &wait_ms],
        ) {
            Ok(rows) => rows,
            Err(e) => {
                lost_connection(crashes, &e, "pop");
                c = connect_retrying(deadline); // the lease, if any, expires
                continue;
            }
        };
        if rows.is_empty() {
            if pushers_left.load(Ordering::SeqCst) == 0 && drained(checker.as_mut().unwrap_or(&mut c), queue, group) {
                return;
            }
            if wait_ms == 0 {
                thread::sleep(Duration::from_millis(20));
            }
            continue;
        }
        let lease: uuid::Uuid = rows[0].get(0);
        // Lanes in the order they came: (partition, first offset, last offset).
        let mut lanes: Vec<(uuid::Uuid, i64, i64)> = Vec::new();
        let mut got: Vec<(u64, Addr, String)> = Vec::new();
        for row in &rows {
            let (pid, off): (uuid::Uuid, i64) = (row.get(1), row.get(2));
            match lanes.last_mut() {
                Some(l) if l.0 == pid => l.2 = off,
                _ => lanes.push((pid, off, off)),
            }
            got.push((seq.fetch_add(1, Ordering::SeqCst), (pid, off), row.get(3)));
        }
        let outcome = pick_outcome(&mut r);
        // The lane that gets the signal, and at which of the offsets it delivered (offsets
        // in between may be gaps: a consumer signals messages it got).
        let signal = match outcome {
            Outcome::Signal(s) => {
                let l = lanes[r.gen_range(0..lanes.len())];
                let offs: Vec<i64> = got.iter().filter(|g| g.1 .0 == l.0).map(|g| g.1 .1).collect();
                Some((s, l.0, offs[r.gen_range(0..offs.len())]))
            }
            _ => None,
        };
        let acks: Vec<Value> = lanes
            .iter()
            .map(|&(pid, _, last)| match signal {
                Some((s, spid, e)) if spid == pid => {
                    json!({"partitionId": pid.to_string(), "offset": e, "status": s, "error": "harness"})
                }
                _ => json!({"partitionId": pid.to_string(), "offset": last, "status": "completed"}),
            })
            .collect();
        let result: Result<Option<Value>, postgres::Error> = match outcome {
            Outcome::NoAck => Ok(None),
            Outcome::ExtendThenComplete => c
                .execute("SELECT queen.extend_lease($1, 30)", &[&lease])
                .and_then(|_| c.query_one("SELECT queen.ack($1, $2::jsonb)", &[&lease, &Value::Array(acks.clone())]))
                .map(|row| Some(row.get(0))),
            // A dead-lettering ack carries its own statement text, so that the chaos thread
            // can find it.
            Outcome::Signal("dlq") => c
                .query_one("SELECT queen.ack($1, $2::jsonb) /* dead-letter */", &[&lease, &Value::Array(acks.clone())])
                .map(|row| Some(row.get(0))),
            _ => c
                .query_one("SELECT queen.ack($1, $2::jsonb)", &[&lease, &Value::Array(acks.clone())])
                .map(|row| Some(row.get(0))),
        };
        let mut s = shared.lock().unwrap();
        match result {
            Ok(res) => {
                // Applied lanes and their new cursors; a lane missing was fenced off.
                let applied: HashMap<uuid::Uuid, i64> = res
                    .as_ref()
                    .and_then(|v| v["lanes"].as_array().cloned())
                    .unwrap_or_default()
                    .iter()
                    .map(|l| (l["partitionId"].as_str().unwrap().parse().unwrap(), l["committed"].as_i64().unwrap()))
                    .collect();
                for &(pid, first, _) in &lanes {
                    if let Some(&to) = applied.get(&pid) {
                        if to >= first {
                            s.advances.entry(group.to_string()).or_default().push((pid, first, to));
                        }
                    }
                }
                if let Some(items) = res.as_ref().and_then(|v| v["items"].as_array().cloned()) {
                    for it in items.iter().filter(|it| it["dlq"].as_bool() == Some(true)) {
                        let pid: uuid::Uuid = it["partitionId"].as_str().unwrap().parse().unwrap();
                        s.dead.entry(group.to_string()).or_default().push((pid, it["offset"].as_i64().unwrap()));
                    }
                }
                for (sq, addr, id) in got {
                    let fate = match applied.get(&addr.0) {
                        Some(&to) if addr.1 <= to => None,
                        Some(_) => Some("nack"),
                        None if outcome == Outcome::NoAck => Some("expiry"),
                        None => Some("ack after expiry"),
                    };
                    s.deliveries.entry(group.to_string()).or_default().push(Delivery { seq: sq, addr, id, fate });
                }
            }
            Err(e) => {
                lost_connection(crashes, &e, "ack");
                // The connection died: the ack may or may not have committed.
                for &(pid, first, last) in &lanes {
                    let to = match signal {
                        Some((sig, spid, e)) if spid == pid => {
                            if sig == "dlq" || sig == "failed" {
                                e
                            } else {
                                e - 1
                            }
                        }
                        _ => last,
                    };
                    s.maybe_advances.entry(group.to_string()).or_default().push((pid, first, to));
                    if let Some((sig, spid, e)) = signal {
                        if spid == pid && (sig == "dlq" || sig == "failed") {
                            s.maybe_dead.entry(group.to_string()).or_default().push((pid, e));
                        }
                    }
                }
                for (sq, addr, id) in got {
                    s.deliveries.entry(group.to_string()).or_default().push(Delivery {
                        seq: sq,
                        addr,
                        id,
                        fate: Some("crash"),
                    });
                }
                drop(s);
                c = connect_retrying(deadline);
            }
        }
    }
}

/// True when every lane of the group is at its head. A crash can leave a connection
/// broken here too: then not drained yet (the caller reconnects on its next pop).
fn drained(c: &mut Client, queue: &str, group: &str) -> bool {
    // Every partition has a lane for the group (a lane is created by a later pop), at its head.
    c.query_one(
        "SELECT (SELECT count(*) FROM queen.status($1) WHERE consumer_group = $2 AND lag = 0)
              = (SELECT count(*) FROM queen.partitions p JOIN queen.queues q USING (queue_id) WHERE q.name = $1)",
        &[&queue, &group],
    )
    .map(|row| row.get(0))
    .unwrap_or(false)
}

/// Crashes the server while the harness runs: SIGKILL of a backend in the middle of a
/// push, a pop, an ack or a dead-lettering ack (the postmaster then restarts every
/// session), or `pg_ctl stop -m immediate` and a restart — whichever kind it has done
/// least. Returns how many of each.
fn chaos(
    kills: usize,
    seed: u64,
    compactor: bool,
    rotator: bool,
    stop: &AtomicBool,
    deadline: Instant,
) -> BTreeMap<&'static str, usize> {
    let mut targets: Vec<(&str, &str)> = vec![
        ("push", "%queen.push%"),
        ("pop", "%queen.pop%"),
        ("ack", "%queen.ack(%"),
        ("dead-lettering ack", "%/* dead-letter */%"),
        ("immediate stop", ""),
    ];
    if compactor {
        targets.push(("compaction", "%queen.compact(%"));
    }
    if rotator {
        targets.push(("retention and rotation", "%queen.retain()%"));
    }
    let mut r = StdRng::seed_from_u64(seed);
    let mut done: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut c = connect_retrying(deadline);
    while done.values().sum::<usize>() < kills && !stop.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(r.gen_range(150..450)));
        // The kind done least so far (pushes first: pushers finish before consumers).
        let &(what, pattern) = targets.iter().min_by_key(|(w, _)| done.get(w).copied().unwrap_or(0)).unwrap();
        if pattern.is_empty() {
            cluster_immediate_restart();
            *done.entry(what).or_default() += 1;
            c = connect_retrying(deadline);
            continue;
        }
        // Wait (a little) for a backend in the middle of that call.
        let until = Instant::now() + Duration::from_secs(3);
        let mut victim = None;
        while victim.is_none() && Instant::now() < until && !stop.load(Ordering::SeqCst) {
            victim = match c.query(
                "SELECT pid FROM pg_stat_activity
                  WHERE state = 'active' AND pid <> pg_backend_pid() AND query LIKE $1
                    AND query NOT LIKE '%pg_stat_activity%' ORDER BY random() LIMIT 1",
                &[&pattern],
            ) {
                Ok(rows) => rows.first().map(|row| row.get::<_, i32>(0)),
                Err(_) => {
                    c = connect_retrying(deadline);
                    None
                }
            };
        }
        let Some(pid) = victim else { continue };
        let ok = Command::new("kill").args(["-9", &pid.to_string()]).status().map(|s| s.success()).unwrap_or(false);
        if ok {
            *done.entry(what).or_default() += 1;
            // The postmaster restarts every session; wait until it accepts connections.
            thread::sleep(Duration::from_millis(200));
            c = connect_retrying(deadline);
        }
    }
    done
}

/// `pg_ctl stop -m immediate`, then start again (the cluster of `make integration`).
pub fn cluster_immediate_restart() {
    let dir = std::env::var("QUEEN_TEST_DIR").expect("QUEEN_TEST_DIR (set by make integration)");
    let port = std::env::var("QUEEN_TEST_PORT").expect("QUEEN_TEST_PORT (set by make integration)");
    let stopped = Command::new("runuser")
        .args(["-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "-D", &dir, "stop", "-m", "immediate"])
        .status()
        .expect("run pg_ctl");
    assert!(stopped.success(), "pg_ctl stop -m immediate failed");
    let started = Command::new("bash")
        .args(["scripts/cluster.sh", "start", &dir, &port])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .status()
        .expect("run scripts/cluster.sh");
    assert!(started.success(), "restart after the immediate stop failed");
}

fn check(cfg: &Config, queue: &str, c: &mut Client, s: &Shared) -> Report {
    let mut report = Report {
        pushed: s.committed.len(),
        rolled_back: s.rolled_back.len(),
        push_unknown: s.unknown.len(),
        ..Report::default()
    };
    let crashes = cfg.kills > 0;
    // Heads of the queue's partitions: each one's readable end, the last offset that holds
    // a committed message (every lane of the group has drained to it).
    let heads: HashMap<uuid::Uuid, i64> = c
        .query("SELECT DISTINCT partition_id, head FROM queen.status($1)", &[&queue])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    // The offsets that hold a message: every committed push's (and, after crashes, those
    // of unknown fate that were delivered, so they committed). Any other offset up to a
    // head is a gap: a push that rolled back or died.
    let mut messages: HashMap<uuid::Uuid, std::collections::BTreeSet<i64>> = HashMap::new();
    for &(pid, off) in s.committed.keys() {
        messages.entry(pid).or_default().insert(off);
    }
    for ds in s.deliveries.values() {
        for d in ds {
            messages.entry(d.addr.0).or_default().insert(d.addr.1);
        }
    }
    for (pid, offs) in &messages {
        let head = heads.get(pid).copied().unwrap_or(0);
        let last = offs.iter().next_back().copied().unwrap_or(0);
        assert!(last <= head, "partition {pid}: a message at {last} beyond the head {head}");
        assert_eq!(last, head, "partition {pid}: the head {head} is not the last message {last}");
    }
    // A stretch of offsets the cursor passed without an ack must hold no message.
    let holds_message = |pid: &uuid::Uuid, from: i64, to: i64| -> bool {
        messages.get(pid).is_some_and(|m| m.range(from..=to).next().is_some())
    };

    for group in &cfg.groups {
        let empty = Vec::new();
        let deliveries = s.deliveries.get(group).unwrap_or(&empty);
        report.deliveries += deliveries.len();
        // What each delivered address carried, and that it came from a committed push.
        let mut by_addr: BTreeMap<Addr, Vec<&Delivery>> = BTreeMap::new();
        let mut addr_of_id: HashMap<&str, Addr> = HashMap::new();
        for d in deliveries {
            assert!(!s.rolled_back.contains(&d.id), "{group}: delivered {} from a rolled-back push", d.id);
            match s.committed.get(&d.addr) {
                Some(id) => assert_eq!(id, &d.id, "{group}: {:?} carried {} but its push returned {id}", d.addr, d.id),
                None => assert!(
                    crashes && s.unknown.contains(&d.id),
                    "{group}: delivered {} at {:?}, which no push returned",
                    d.id,
                    d.addr
                ),
            }
            if let Some(prev) = addr_of_id.insert(&d.id, d.addr) {
                assert_eq!(prev, d.addr, "{group}: message {} delivered at two addresses", d.id);
            }
            by_addr.entry(d.addr).or_default().push(d);
        }
        // Every committed push was delivered.
        for (addr, id) in &s.committed {
            assert!(by_addr.contains_key(addr), "{group}: {id} at {addr:?} was never delivered");
        }
        // Redelivery only after a delivery that no ack committed; count why.
        for (addr, ds) in by_addr.iter_mut() {
            ds.sort_by_key(|d| d.seq);
            for (k, d) in ds.iter().enumerate() {
                let last = k + 1 == ds.len();
                match (last, d.fate) {
                    (false, None) => panic!("{group}: {addr:?} delivered again after an ack committed it"),
                    (false, Some(cause)) => *report.duplicates.entry(cause).or_default() += 1,
                    (true, Some(cause)) if cause != "crash" => {
                        panic!("{group}: {addr:?} last delivered with no committed ack ({cause}) yet the lane drained")
                    }
                    _ => {}
                }
            }
        }
        // Cursor advances tile 1..=head per partition: each offset passed exactly once.
        let mut adv: HashMap<uuid::Uuid, Vec<(i64, i64)>> = HashMap::new();
        for &(pid, from, to) in s.advances.get(group).unwrap_or(&Vec::new()) {
            adv.entry(pid).or_default().push((from, to));
        }

        let mut maybe: HashMap<uuid::Uuid, Vec<(i64, i64)>> = HashMap::new();
        for &(pid, from, to) in s.maybe_advances.get(group).unwrap_or(&Vec::new()) {
            maybe.entry(pid).or_default().push((from, to));
        }
        // Every message in from..=to lies in a span that an ack of unknown fate asked to
        // pass (a span starts at its pop's first message: gaps before it need no cover).
        // Several such acks may tile one stretch: a lane has one ack in flight at a time,
        // but one crash after another can each hide an ack that committed.
        let covered_by_maybe = |pid: &uuid::Uuid, from: i64, to: i64| -> bool {
            let spans = maybe.get(pid).map(Vec::as_slice).unwrap_or(&[]);
            messages.get(pid).is_none_or(|m| m.range(from..=to).all(|&o| spans.iter().any(|&(a, b)| a <= o && o <= b)))
        };
        let cursors: HashMap<uuid::Uuid, i64> = c
            .query("SELECT partition_id, committed FROM queen.status($1) WHERE consumer_group = $2", &[&queue, group])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        for (pid, &head) in &heads {
            assert_eq!(cursors.get(pid).copied(), Some(head), "{group}: partition {pid} did not drain");
            let mut spans = adv.remove(pid).unwrap_or_default();
            spans.sort();
            let mut next = 1;
            for (from, to) in spans {
                assert!(from >= next, "{group}: partition {pid}: offsets {from}..={} passed twice", next - 1);
                if from > next && holds_message(pid, next, from - 1) {
                    // Messages no ack reported: only an ack whose fate a crash hid may have
                    // passed them.
                    assert!(
                        covered_by_maybe(pid, next, from - 1),
                        "{group}: partition {pid}: offsets {next}..={} skipped by the cursor",
                        from - 1
                    );
                }
                next = to + 1;
            }
            if next <= head && holds_message(pid, next, head) {
                assert!(
                    covered_by_maybe(pid, next, head),
                    "{group}: partition {pid}: offsets {next}..={head} passed by no ack"
                );
            }
        }
        // Exactly one log_dlq row per dead-lettered message.
        let rows: Vec<(uuid::Uuid, i64, i64)> = c
            .query(
                "SELECT d.partition_id, d.msg_offset, count(*) FROM queen.log_dlq d JOIN queen.queues q USING (queue_id)
                  WHERE q.name = $1 AND d.consumer_group = $2 GROUP BY 1, 2",
                &[&queue, group],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let dead: HashSet<Addr> = s.dead.get(group).map(|v| v.iter().copied().collect()).unwrap_or_default();
        let maybe_dead: HashSet<Addr> =
            s.maybe_dead.get(group).map(|v| v.iter().copied().collect()).unwrap_or_default();
        assert_eq!(dead.len(), s.dead.get(group).map_or(0, Vec::len), "{group}: an address dead-lettered twice");
        for &(pid, off, n) in &rows {
            assert_eq!(n, 1, "{group}: {n} log_dlq rows for ({pid}, {off})");
            assert!(
                dead.contains(&(pid, off)) || maybe_dead.contains(&(pid, off)),
                "{group}: a log_dlq row for ({pid}, {off}) that no ack reported"
            );
        }
        let filed: HashSet<Addr> = rows.iter().map(|&(p, o, _)| (p, o)).collect();
        for a in &dead {
            assert!(filed.contains(a), "{group}: {a:?} reported dead-lettered but has no log_dlq row");
        }
        report.dead_lettered += rows.len();
    }
    report
}
