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
//!   expiry, a nack, a rolled-back ack, an injected fault, or a crash), and these
//!   duplicates are counted by cause;
//! - no call failed with an error that neither an injected fault nor a crash explains
//!   (such an error is recorded, its call counted as rolled back, and the run goes on).
//!
//! The soak's options (all off by default): acks that roll back (`rollback_acks`), fail
//! points armed now and then in the sessions' own calls (`failpoints`), half the sessions
//! through PgBouncer (`pooler_dsn`), a database of the run's own (`dsn`), pushing for a
//! time instead of a count (`duration`), and crashes caused by another run's chaos thread
//! (`crashes`).
//!
//! Sizes come from the environment so that the same code is the CI run and the large run:
//! QUEEN_HARNESS_MESSAGES, QUEEN_HARNESS_CONSUMERS (per group), QUEEN_HARNESS_PUSHERS,
//! QUEEN_HARNESS_SEED.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls, Row};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::{dsn, unique};

pub struct Config {
    pub messages: usize,
    pub pushers: usize,
    pub consumers_per_group: usize,
    pub partitions: usize,
    /// Most messages per push; 1: single-message `queen.push` calls.
    pub batch_max: usize,
    /// The share of push calls that are single-message `queen.push` calls (the fresh
    /// tier) when `batch_max` > 1 (0: none).
    pub single_share: f64,
    /// A session runs `queen.compact` over and over (the chaos thread may kill it).
    pub compactor: bool,
    pub groups: Vec<String>,
    pub lease_seconds: i32,
    pub retry_limit: i32,
    /// `kill -9` this many busy backends during the run (0: none).
    pub kills: usize,
    /// The chaos thread's pause between two crashes, in milliseconds (from, to).
    pub chaos_pause_ms: (u64, u64),
    /// Crashes may happen although this run's chaos thread does none (`kills` = 0):
    /// another run on the same cluster crashes it. Calls may then fail with a lost
    /// connection. (`kills` > 0 implies it.)
    pub crashes: bool,
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
    /// About one ack in ten runs in a transaction that rolls back (the ack, sometimes a
    /// `pg_sleep(0.05)`, then ROLLBACK, or ROLLBACK TO a savepoint): nothing advances, and
    /// half the time the planned ack follows with the same lease. With `retention` and the
    /// compactor and rotator, retention runs while acks roll back.
    pub rollback_acks: bool,
    /// Pushers and consumers arm a random fail point (`FAIL_POINTS`) in their own session
    /// before a few percent of their calls. A call that fails with one is an injected
    /// fault: its transaction rolled back (a push never committed, an ack advanced
    /// nothing, a pop delivered nothing).
    pub failpoints: bool,
    /// Every other pusher and consumer connects here (PgBouncer in transaction pooling
    /// mode, naming the run's database) instead of directly.
    pub pooler_dsn: Option<String>,
    /// The database the run uses (None: `queen_it::dsn()`).
    pub dsn: Option<String>,
    /// Pushers push until this has passed (instead of `messages` in all); then the
    /// consumers drain the queue.
    pub duration: Option<Duration>,
    /// Pushers wait while more than this many messages are committed but not yet acked by
    /// every group (0: no limit). Bounds the drain of a long run.
    pub max_backlog: usize,
    /// The queue's message ttl in milliseconds (0: none). Messages a group has not
    /// consumed within it become dead letters with reason 'expired'; the checks count them
    /// as accounted for, as long as the cursor passed them in order.
    pub ttl_ms: u64,
    /// A session pauses and resumes the queue and its groups (`queen.pause`,
    /// `queen.resume`) at random, each pause for up to 300 ms, and resumes everything when
    /// the run ends: delivery stops and starts again, and nothing may be lost or skipped.
    pub pauser: bool,
    /// The last group of `groups` is a skip group with this `max_lag` (0: none), and a
    /// session calls `queen.retain(queue)` every 30 to 120 ms, which moves it past its
    /// oldest messages wherever its lag passed it. Each span passed is one `skipped`
    /// dead-letter row; the checks count its messages as accounted for, and its span as
    /// one advance of the group's cursor (so a span passed twice, or a message delivered
    /// and acked inside a span, is caught).
    pub skip_max_lag: i64,
    /// The first group gets a rate limit and a concurrency cap on the partitions whose name
    /// starts with `p1` (p1, p10 to p15: `queen.configure_limit(..., 'p1', rate => 300,
    /// burst => 30, max_in_flight => 2)`), and a per-partition rate on every partition
    /// (`'*'`, 200 a second): claims are held back and resumed all along; nothing may be
    /// lost, skipped or delivered twice.
    pub limits: bool,
    /// A session redrives dead letters (`queen.dlq_redrive(queue, group, max_messages =>
    /// 50)`, to the group that failed them) every 100 to 300 ms while the pushers run, and
    /// for 3 s after (it counts as a pusher: the consumers drain after it). Each
    /// copy is a new message (found by `peek` at the end, by its `queen.redrive` header)
    /// that its group must get (or dead-letter again) and no other group may get: they
    /// pass over it.
    pub redriver: bool,
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
            single_share: 0.0,
            compactor: false,
            groups: vec!["ga".into(), "gb".into()],
            lease_seconds: 1,
            retry_limit: 2,
            kills,
            chaos_pause_ms: (150, 450),
            crashes: false,
            seed: env_or("QUEEN_HARNESS_SEED", 0x51ee) as u64,
            deadline: Duration::from_secs(env_or("QUEEN_HARNESS_DEADLINE_S", 900) as u64),
            held_snapshot: false,
            retention: 0,
            rotator: false,
            queue: None,
            check_dsn: None,
            routed: false,
            rollback_acks: false,
            failpoints: false,
            pooler_dsn: None,
            dsn: None,
            duration: None,
            max_backlog: 0,
            ttl_ms: 0,
            pauser: false,
            skip_max_lag: 0,
            limits: false,
            redriver: false,
        }
    }

    fn crashes(&self) -> bool {
        self.kills > 0 || self.crashes
    }
}

/// Every fail point a session can arm (`SET queen.failpoint`): the core's
/// (`queen_core::fail::POINTS`, inside the registries' updates) and the extension's
/// (`src/pg/failpoints.rs`: the transaction callbacks' registry work, whose failure never
/// raises, and two maintenance steps). A unit test below keeps this list equal to both.
pub const FAIL_POINTS: &[&str] = &[
    "lanes.begin_load",
    "lanes.finish_load",
    "lanes.remove",
    "lanes.lock",
    "lanes.set",
    "lanes.chain",
    "lanes.unlock",
    "lanes.put_back",
    "lanes.evict",
    "lanes.sweep",
    "lanes.forget",
    "lanes.cursor",
    "offsets.reserve",
    "offsets.wrote",
    "offsets.finish",
    "offsets.prepare",
    "offsets.subxact",
    "offsets.begin_load",
    "offsets.finish_load",
    "offsets.remove",
    "offsets.drop",
    "xact.commit.lanes",
    "xact.abort.lanes",
    "xact.subabort.lanes",
    "xact.commit.offsets",
    "xact.abort.offsets",
    "xact.subabort.offsets",
    "compaction.partition",
    "retention.queue",
];

/// What a run saw, for the issue note and the test output.
#[derive(Debug, Default)]
pub struct Report {
    /// Pushes that returned (committed, offsets known).
    pub pushed: usize,
    pub rolled_back: usize,
    pub push_unknown: usize,
    /// Messages that committed: the pushes that returned, and those of unknown fate (a
    /// crash during the call) that were delivered.
    pub committed: usize,
    /// Per group, the committed messages delivered at least once, summed over the groups
    /// (`committed` times the number of groups when nothing is lost).
    pub delivered: usize,
    /// Rows that pops returned, redeliveries included.
    pub deliveries: usize,
    /// Per group, committed messages never delivered, summed.
    pub lost: usize,
    /// Messages the cursor passed without an ack (or an ack of unknown fate) covering them.
    pub skipped: usize,
    /// Deliveries after a delivery whose ack committed (to the same group).
    pub duplicated_after_commit: usize,
    /// Offsets the cursor passed twice, according to the acks.
    pub passed_twice: usize,
    pub duplicates: BTreeMap<&'static str, usize>,
    pub dead_lettered: usize,
    /// Acks whose transaction rolled back (or rolled back to a savepoint).
    pub rolled_back_acks: usize,
    /// Calls made with a fail point armed, and the injected faults (calls that failed with
    /// a fail point), by point.
    pub armed: usize,
    pub faults: usize,
    pub faults_by_point: BTreeMap<String, usize>,
    /// Errors that neither an injected fault nor a crash explains, by call and SQLSTATE (each
    /// one is also a violation).
    pub errors: BTreeMap<String, usize>,
    /// Transaction ends the registries could not take at once (a fail point in a
    /// transaction callback fired twice): retried at the session's next call.
    pub deferred_ends: usize,
    /// Sessions of the run that went through the pooler, and how many in all.
    pub pooled_sessions: usize,
    pub sessions: usize,
    pub kills: BTreeMap<&'static str, usize>,
    pub seconds: f64,
    /// With a held snapshot: lane journal entries written during the run, and how many
    /// of them are still in the journal tables at the end.
    pub journal_written: i64,
    pub journal_left: i64,
    /// Rotations of the segment generations by the rotator session.
    pub rotations: usize,
    /// Messages filed as expired dead letters (the queue's ttl), summed over the groups.
    pub expired: usize,
    /// Pauses the pauser session committed (queue and group pauses).
    pub pauses: usize,
    /// Messages the skip group passed over (`skip_max_lag`), and in how many spans.
    pub skipped_by_overflow: usize,
    pub skip_spans: usize,
    /// Redriven copies found at the end, and how many of them their group got.
    pub redriven: usize,
    pub redriven_delivered: usize,
    /// Every broken invariant (the first 50), empty when the run kept them all.
    pub violations: Vec<String>,
}

impl Report {
    /// Panics if the run broke an invariant, after printing its figures.
    pub fn assert_clean(&self) {
        if !self.violations.is_empty() {
            eprintln!("{self:#?}");
            panic!(
                "the run broke {} invariant(s) (lost {}, skipped {}, delivered again after a committed ack {}):\n{}",
                self.violations.len(),
                self.lost,
                self.skipped,
                self.duplicated_after_commit,
                self.violations.join("\n")
            );
        }
    }
}

type Addr = (uuid::Uuid, i64); // (partition_id, offset)

#[derive(Default)]
struct Shared {
    /// Committed pushes: address -> message id (the payload's "id").
    committed: HashMap<Addr, String>,
    /// Ids of pushes whose transaction rolled back (an injected fault included).
    rolled_back: HashSet<String>,
    /// Ids of pushes whose fate is unknown (the connection died during the call).
    unknown: HashSet<String>,
    /// Per group: every delivery, in the order pops returned.
    deliveries: HashMap<String, Vec<Delivery>>,
    /// Per group: deliveries whose ack committed (for the pushers' backlog limit).
    acked: HashMap<String, usize>,
    /// Per group: cursor advances reported by acks: (partition, from, to), inclusive.
    advances: HashMap<String, Vec<(uuid::Uuid, i64, i64)>>,
    /// Per group: spans an ack of unknown fate (connection died) might have committed.
    maybe_advances: HashMap<String, Vec<(uuid::Uuid, i64, i64)>>,
    /// Per group: addresses an ack reported dead-lettered.
    dead: HashMap<String, Vec<Addr>>,
    maybe_dead: HashMap<String, Vec<Addr>>,
    rolled_back_acks: usize,
    armed: usize,
    faults: BTreeMap<String, usize>,
    /// Errors no fault or crash explains, by call and SQLSTATE; the first texts.
    errors: BTreeMap<String, usize>,
    error_texts: Vec<String>,
}

struct Delivery {
    seq: u64,
    addr: Addr,
    id: String,
    /// How this delivery ended: None if an ack committed its offset, else why not.
    fate: Option<&'static str>,
}

/// The fail point an error names, if a fail point caused it (SQLSTATE XX000, "queen fail
/// point NAME").
fn fault_point(e: &postgres::Error) -> Option<String> {
    let db = e.as_db_error()?;
    if db.code() != &SqlState::INTERNAL_ERROR {
        return None;
    }
    let rest = db.message().split("queen fail point").nth(1)?;
    Some(rest.split_whitespace().next().unwrap_or("?").to_string())
}

/// An error that a crash explains: the connection is gone, the server is shutting down or
/// starting (57P01-57P03), or the pooler lost its server connection (class 08).
fn is_disconnect(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        None => true,
        Some(code) => {
            let c = code.code();
            c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03")
        }
    }
}

/// Without crashes every call must succeed: an error is a finding, not noise. With them,
/// only an error a crash explains is.
fn lost_connection(crashes: bool, e: &postgres::Error, what: &str) {
    assert!(crashes, "{what} failed without any crash: {e}");
    assert!(is_disconnect(e), "{what} failed, and not because of a crash: {e} ({:?})", e.code());
}

/// How a call failed.
enum Failure {
    /// An injected fault: the call's transaction rolled back.
    Fault,
    /// Another error the server reported (its transaction rolled back too): a finding,
    /// recorded (`Report::errors`) and, at the end, a violation.
    Error,
    /// The connection died during the call: its fate is unknown. Without crashes, also a
    /// finding.
    Lost,
}

/// The text of an error, with its SQLSTATE and, for a server error, its detail.
fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "{} {}{}",
            db.code().code(),
            db.message(),
            db.detail().map(|d| format!(" ({})", d.lines().next().unwrap_or(""))).unwrap_or_default()
        ),
        None => e.to_string(),
    }
}

/// Connects to `dsn`, retrying every 50 ms until `deadline` (a server restarting after a
/// crash or an immediate stop refuses connections meanwhile; so does PgBouncer while it
/// cannot reach it). Warnings that a registry deferred a transaction's end are counted.
fn connect(dsn: &str, deadline: Instant, deferred: &Arc<AtomicUsize>) -> Client {
    loop {
        let mut config: postgres::Config = dsn.parse().expect("a valid DSN");
        let deferred = deferred.clone();
        config.notice_callback(move |n| {
            if n.message().contains("could not take a transaction's end") {
                deferred.fetch_add(1, Ordering::Relaxed);
            }
        });
        match config.connect(NoTls) {
            Ok(c) => return c,
            Err(e) => {
                assert!(Instant::now() < deadline, "cannot connect (the server did not come back?): {e}");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// A pusher's or consumer's connection, direct or through the pooler. Through the pooler
/// every statement goes out with `query_typed` (one unnamed statement per call: protocol
/// level prepared statements do not survive transaction pooling), and a fail point is
/// armed with SET LOCAL inside a transaction around the call (a session's SET would stay
/// on whichever server connection the pooler chose).
struct Session {
    c: Client,
    dsn: String,
    pooled: bool,
    deadline: Instant,
    deferred: Arc<AtomicUsize>,
    /// Open transaction levels: BEGIN, then savepoints.
    depth: usize,
    /// A direct session's fail point is set (a RESET is due).
    armed: bool,
    /// The connection must be replaced before the next call.
    broken: bool,
}

type Param<'a> = (&'a (dyn ToSql + Sync), Type);

impl Session {
    fn open(dsn: &str, pooled: bool, deadline: Instant, deferred: &Arc<AtomicUsize>) -> Session {
        Session {
            c: connect(dsn, deadline, deferred),
            dsn: dsn.to_string(),
            pooled,
            deadline,
            deferred: deferred.clone(),
            depth: 0,
            armed: false,
            broken: false,
        }
    }

    /// A new connection, once the server answers through it: while the server restarts,
    /// PgBouncer takes clients and fails their calls at once (no spinning on those).
    fn reconnect(&mut self) {
        loop {
            self.c = connect(&self.dsn, self.deadline, &self.deferred);
            if self.c.batch_execute("SELECT 1").is_ok() {
                break;
            }
            assert!(Instant::now() < self.deadline, "the server did not come back");
            thread::sleep(Duration::from_millis(100));
        }
        (self.depth, self.armed, self.broken) = (0, false, false);
    }

    /// Before a call: a connection a crash broke is replaced.
    fn ensure(&mut self) {
        if self.broken || self.c.is_closed() {
            self.reconnect();
        }
    }

    fn query(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, postgres::Error> {
        if self.pooled {
            self.c.query_typed(sql, params)
        } else {
            let ps: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.0).collect();
            self.c.query(sql, &ps)
        }
    }

    fn query_one(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Row, postgres::Error> {
        let mut rows = self.query(sql, params)?;
        assert_eq!(rows.len(), 1, "{sql} returned {} rows", rows.len());
        Ok(rows.remove(0))
    }

    fn batch(&mut self, sql: &str) -> Result<(), postgres::Error> {
        self.c.batch_execute(sql)
    }

    fn begin(&mut self) -> Result<(), postgres::Error> {
        let sql = if self.depth == 0 { "BEGIN".to_string() } else { format!("SAVEPOINT h{}", self.depth) };
        self.batch(&sql)?;
        self.depth += 1;
        Ok(())
    }

    fn commit(&mut self) -> Result<(), postgres::Error> {
        self.depth -= 1;
        let sql = if self.depth == 0 { "COMMIT".to_string() } else { format!("RELEASE SAVEPOINT h{}", self.depth) };
        self.batch(&sql)
    }

    fn rollback(&mut self) -> Result<(), postgres::Error> {
        self.depth -= 1;
        let sql = match self.depth {
            0 => "ROLLBACK".to_string(),
            d => format!("ROLLBACK TO SAVEPOINT h{d}; RELEASE SAVEPOINT h{d}"),
        };
        self.batch(&sql)
    }

    /// Runs `op`, with `point` armed in this session if given. Through the pooler the call
    /// and its SET LOCAL share a transaction, committed here: an error of that COMMIT is
    /// the call's (its fate unknown).
    fn call<T>(
        &mut self,
        point: Option<&str>,
        op: impl FnOnce(&mut Session) -> Result<T, postgres::Error>,
    ) -> Result<T, postgres::Error> {
        if let Some(p) = point {
            if self.pooled {
                self.begin()?;
                self.batch(&format!("SET LOCAL queen.failpoint = '{p}'"))?;
            } else {
                self.batch(&format!("SET queen.failpoint = '{p}'"))?;
                self.armed = true;
            }
        }
        let res = op(self)?;
        if point.is_some() {
            if self.pooled {
                self.commit()?;
            } else if self.batch("RESET queen.failpoint").is_err() {
                // The call is done (committed); the connection died after it.
                self.broken = true;
            } else {
                self.armed = false;
            }
        }
        Ok(res)
    }

    /// After a call failed: an injected fault, a lost connection (one a crash explains,
    /// when crashes happen), or another error (recorded: a finding). The session is usable
    /// again afterwards: whatever transaction the call left open is rolled back, and its
    /// fail point reset.
    fn failed(&mut self, e: &postgres::Error, ctx: &Ctx, what: &str) -> Failure {
        let kind = if let Some(point) = fault_point(e) {
            ctx.fault(point);
            Failure::Fault
        } else if is_disconnect(e) {
            if !ctx.crashes {
                ctx.error(what, &format!("failed without any crash: {}", describe(e)));
            }
            Failure::Lost
        } else {
            ctx.error(what, &describe(e));
            Failure::Error
        };
        if matches!(kind, Failure::Lost) || self.c.is_closed() {
            self.broken = true;
            return kind;
        }
        if self.depth > 0 && self.batch("ROLLBACK").is_err() {
            self.broken = true;
        }
        self.depth = 0;
        if self.armed && self.batch("RESET queen.failpoint").is_err() {
            self.broken = true;
        }
        self.armed = false;
        kind
    }
}

/// What the sessions of one run share.
struct Ctx {
    queue: String,
    shared: Mutex<Shared>,
    seq: AtomicU64,
    pushers_left: AtomicUsize,
    crashes: bool,
    deadline: Instant,
    /// Pushers stop here (with `duration`).
    push_until: Option<Instant>,
    dsn: String,
    pooler_dsn: Option<String>,
    check_dsn: Option<String>,
    failpoints: bool,
    rollback_acks: bool,
    partitions: usize,
    batch_max: usize,
    single_share: f64,
    routed: bool,
    lease_seconds: i32,
    groups: usize,
    max_backlog: usize,
    deferred: Arc<AtomicUsize>,
}

impl Ctx {
    /// Session k of its kind: every other one through the pooler, if there is one.
    fn session(&self, k: usize) -> Session {
        match &self.pooler_dsn {
            Some(p) if k % 2 == 1 => Session::open(p, true, self.deadline, &self.deferred),
            _ => Session::open(&self.dsn, false, self.deadline, &self.deferred),
        }
    }

    /// Now and then (with `failpoints`), a fail point to arm for the next call: one of
    /// `FAIL_POINTS`, for its next pass or (less often) its next two or three.
    fn pick_point(&self, r: &mut StdRng) -> Option<String> {
        if !self.failpoints || !r.gen_bool(0.04) {
            return None;
        }
        let name = FAIL_POINTS[r.gen_range(0..FAIL_POINTS.len())];
        let spec = match r.gen_range(0..10) {
            0..=6 => name.to_string(),
            n => format!("{name}:{}", n - 5),
        };
        self.shared.lock().unwrap().armed += 1;
        Some(spec)
    }

    fn fault(&self, point: String) {
        *self.shared.lock().unwrap().faults.entry(point).or_default() += 1;
    }

    /// An error no fault or crash explains (`Report::errors`).
    fn error(&self, what: &str, text: &str) {
        let mut s = self.shared.lock().unwrap();
        let code = text.split_whitespace().next().unwrap_or("?");
        *s.errors.entry(format!("{what}: {code}")).or_default() += 1;
        if s.error_texts.len() < 20 {
            s.error_texts.push(format!("{what} failed: {text}"));
        }
    }

    fn directly(&self, deadline: Instant) -> Client {
        connect(&self.dsn, deadline, &self.deferred)
    }
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

/// Runs the harness and checks the invariants: panics (after printing the figures) if
/// any broke.
pub fn run(cfg: &Config) -> Report {
    let report = run_report(cfg);
    report.assert_clean();
    report
}

/// Runs the harness; the invariants it broke are in `Report::violations` (and counted in
/// `lost`, `skipped`, `duplicated_after_commit`, ...), for the caller to print and assert.
pub fn run_report(cfg: &Config) -> Report {
    let t0 = Instant::now();
    let deadline = t0 + cfg.deadline;
    let queue = cfg.queue.clone().unwrap_or_else(|| unique("harness"));
    let ctx = Arc::new(Ctx {
        queue: queue.clone(),
        shared: Mutex::new(Shared::default()),
        seq: AtomicU64::new(0),
        pushers_left: AtomicUsize::new(cfg.pushers),
        crashes: cfg.crashes(),
        deadline,
        push_until: cfg.duration.map(|d| t0 + d),
        dsn: cfg.dsn.clone().unwrap_or_else(dsn),
        pooler_dsn: cfg.pooler_dsn.clone(),
        check_dsn: cfg.check_dsn.clone(),
        failpoints: cfg.failpoints,
        rollback_acks: cfg.rollback_acks,
        partitions: cfg.partitions,
        batch_max: cfg.batch_max,
        single_share: cfg.single_share,
        routed: cfg.routed,
        lease_seconds: cfg.lease_seconds,
        groups: cfg.groups.len(),
        max_backlog: cfg.max_backlog,
        deferred: Arc::new(AtomicUsize::new(0)),
    });
    let mut admin = ctx.directly(deadline);
    // (With crashes from another run, the server may be restarting: try again.)
    loop {
        match admin.execute(
            "SELECT queen.configure($1, lease_time => 30, retry_limit => $2, dead_letter_queue => true,
                                    retention => $3, ttl => make_interval(secs => $4::float8 / 1000))",
            &[&queue, &cfg.retry_limit, &cfg.retention, &(cfg.ttl_ms as f64)],
        ) {
            Ok(_) => break,
            Err(e) => {
                lost_connection(ctx.crashes, &e, "configure");
                admin = ctx.directly(deadline);
            }
        }
    }
    if cfg.limits {
        let group = cfg.groups.first().expect("a group to limit");
        admin
            .execute(
                "SELECT queen.configure_limit($1, $2, 'p1', rate => 300, burst => 30, max_in_flight => 2)",
                &[&queue, group],
            )
            .unwrap();
        admin.execute("SELECT queen.configure_limit($1, $2, '*', rate => 200, burst => 20)", &[&queue, group]).unwrap();
    }
    if cfg.skip_max_lag > 0 {
        let group = cfg.groups.last().expect("a group to skip");
        admin
            .execute(
                "SELECT queen.configure_group($1, $2, max_lag => $3, on_overflow => 'skip')",
                &[&queue, group, &cfg.skip_max_lag],
            )
            .unwrap();
    }
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
        let mut h = ctx.directly(deadline);
        h.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM queen.partitions;").unwrap();
        let pid: i32 = h.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
        holder = Some((h, pid, Instant::now()));
    }
    let stop_chaos = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();

    for p in 0..cfg.pushers {
        let share = cfg.messages / cfg.pushers + usize::from(p < cfg.messages % cfg.pushers);
        let ctx = ctx.clone();
        let seed = cfg.seed ^ ((p as u64 + 1) * 0x9e37);
        handles.push(thread::spawn(move || {
            pusher(p, share, seed, &ctx);
            ctx.pushers_left.fetch_sub(1, Ordering::SeqCst);
        }));
    }
    for g in &cfg.groups {
        for k in 0..cfg.consumers_per_group {
            let (ctx, group) = (ctx.clone(), g.clone());
            let seed = cfg.seed ^ ((k as u64 + 7) << 20) ^ group.len() as u64 ^ g.as_bytes()[1] as u64;
            handles.push(thread::spawn(move || consumer(k, &group, seed, &ctx)));
        }
    }
    let chaos = (cfg.kills > 0).then(|| {
        let (stop, kills, seed, compactor, rotator, pause) =
            (stop_chaos.clone(), cfg.kills, cfg.seed, cfg.compactor, cfg.rotator, cfg.chaos_pause_ms);
        let (dsn, until) = (ctx.dsn.clone(), ctx.push_until.unwrap_or(deadline));
        thread::spawn(move || chaos(&dsn, kills, pause, seed, compactor, rotator, &stop, until, deadline))
    });
    let compactor = cfg.compactor.then(|| {
        let (stop, ctx) = (stop_chaos.clone(), ctx.clone());
        thread::spawn(move || {
            let mut c = ctx.directly(deadline);
            let mut passes = 0usize;
            while !stop.load(Ordering::SeqCst) {
                match c.execute("SELECT queen.compact($1)", &[&ctx.queue]) {
                    Ok(_) => passes += 1,
                    Err(e) => {
                        // Killed by a crash: a new session. Any other error is a finding.
                        if !is_disconnect(&e) {
                            ctx.error("queen.compact", &describe(&e));
                        } else if !ctx.crashes {
                            ctx.error("queen.compact", &format!("failed without any crash: {}", describe(&e)));
                        }
                        c = ctx.directly(deadline);
                    }
                }
                thread::sleep(Duration::from_millis(20));
            }
            passes
        })
    });
    let rotator = cfg.rotator.then(|| {
        let (stop, ctx) = (stop_chaos.clone(), ctx.clone());
        thread::spawn(move || {
            let session = || loop {
                // (The chaos thread may kill the server between the two.)
                let mut c = ctx.directly(deadline);
                if c.batch_execute("SET queen.rotation_min_size = 0").is_ok() {
                    return c;
                }
            };
            let mut c = session();
            let mut rotations = 0usize;
            while !stop.load(Ordering::SeqCst) {
                match c.query_one("SELECT (queen.retain()->>'generationRotated')::bool", &[]) {
                    Ok(row) => rotations += usize::from(row.get::<_, bool>(0)),
                    // Killed by a crash: a new session. Any other error is a finding.
                    Err(e) if is_disconnect(&e) && ctx.crashes => c = session(),
                    Err(e) => {
                        ctx.error("queen.retain", &describe(&e));
                        c = session();
                    }
                }
                thread::sleep(Duration::from_millis(50));
            }
            rotations
        })
    });
    let pauser = cfg.pauser.then(|| {
        let (stop, ctx, groups, seed) = (stop_chaos.clone(), ctx.clone(), cfg.groups.clone(), cfg.seed);
        thread::spawn(move || pauser(&ctx, &groups, seed, &stop, deadline))
    });
    // The redriver counts as a pusher: consumers drain only after its last copies are in.
    if cfg.redriver {
        ctx.pushers_left.fetch_add(1, Ordering::SeqCst);
    }
    let redriver = cfg.redriver.then(|| {
        let (ctx, groups, seed) = (ctx.clone(), cfg.groups.clone(), cfg.seed);
        thread::spawn(move || {
            redriver(&ctx, &groups, seed, deadline);
            ctx.pushers_left.fetch_sub(1, Ordering::SeqCst);
        })
    });
    let skipper = (cfg.skip_max_lag > 0).then(|| {
        let (stop, ctx, seed) = (stop_chaos.clone(), ctx.clone(), cfg.seed);
        thread::spawn(move || skipper(&ctx, seed, &stop, deadline))
    });
    for h in handles {
        h.join().expect("a harness session panicked");
    }
    if let Some(h) = redriver {
        h.join().expect("redriver thread");
    }
    stop_chaos.store(true, Ordering::SeqCst);
    if let Some(h) = skipper {
        h.join().expect("skipper thread");
    }
    let pauses = pauser.map(|h| h.join().expect("pauser thread")).unwrap_or(0);
    if let Some(h) = compactor {
        assert!(h.join().expect("compactor thread") > 0, "the compactor never finished a pass");
    }
    let rotations = rotator.map(|h| h.join().expect("rotator thread")).unwrap_or(0);
    let kills = chaos.map(|h| h.join().expect("chaos thread")).unwrap_or_default();

    let mut admin = match &cfg.check_dsn {
        Some(d) => connect(d, deadline, &ctx.deferred),
        None => ctx.directly(deadline),
    };
    let shared = ctx.shared.lock().unwrap();
    let mut report = check(cfg, &queue, &mut admin, &shared);
    report.errors = shared.errors.clone();
    report.violations.extend(shared.error_texts.iter().cloned());
    report.rotations = rotations;
    report.pauses = pauses;
    report.rolled_back_acks = shared.rolled_back_acks;
    report.armed = shared.armed;
    report.faults = shared.faults.values().sum();
    report.faults_by_point = shared.faults.clone();
    report.deferred_ends = ctx.deferred.load(Ordering::Relaxed);
    report.sessions = cfg.pushers + cfg.groups.len() * cfg.consumers_per_group;
    if cfg.pooler_dsn.is_some() {
        report.pooled_sessions = cfg.pushers / 2 + cfg.groups.len() * (cfg.consumers_per_group / 2);
    }
    if let Some((mut h, pid, held_at)) = holder {
        report.journal_written = journal_written(&mut admin) - written_before;
        report.journal_left = crate::journal_entries(&mut admin);
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
fn push_call(s: &mut Session, single: bool, routed: bool, items: &Value) -> Result<Vec<Row>, postgres::Error> {
    if routed && !single {
        let queue = items[0]["queue"].as_str().unwrap();
        return s.query(
            "SELECT idx, partition_id, msg_offset FROM queen.push_batch($1::text, $2)",
            &[(&queue, Type::TEXT), (items, Type::JSONB)],
        );
    }
    if single {
        let it = &items[0];
        let (queue, partition) = (it["queue"].as_str().unwrap(), it["partition"].as_str().unwrap());
        s.query(
            "SELECT 0::int4, partition_id, msg_offset FROM queen.push($1, $2, $3)",
            &[(&queue, Type::TEXT), (&it["payload"], Type::JSONB), (&partition, Type::TEXT)],
        )
    } else {
        s.query("SELECT idx, partition_id, msg_offset FROM queen.push_batch($1)", &[(items, Type::JSONB)])
    }
}

/// Committed messages not yet acked by every group (for `max_backlog`).
fn backlog(ctx: &Ctx) -> usize {
    let s = ctx.shared.lock().unwrap();
    let acked = if s.acked.len() < ctx.groups { 0 } else { s.acked.values().copied().min().unwrap_or(0) };
    s.committed.len().saturating_sub(acked)
}

fn pusher(p: usize, share: usize, seed: u64, ctx: &Ctx) {
    let mut r = StdRng::seed_from_u64(seed);
    let mut s = ctx.session(p);
    let (mut done, mut n) = (0usize, 0u64);
    let more = |done: usize| match ctx.push_until {
        Some(until) => Instant::now() < until,
        None => done < share,
    };
    while more(done) {
        assert!(Instant::now() < ctx.deadline, "pusher {p}: deadline passed");
        if ctx.max_backlog > 0 {
            while backlog(ctx) > ctx.max_backlog && more(done) {
                assert!(Instant::now() < ctx.deadline, "pusher {p}: deadline passed waiting for the consumers");
                thread::sleep(Duration::from_millis(20));
            }
            if !more(done) {
                break;
            }
        }
        s.ensure();
        let single = ctx.batch_max == 1 || (ctx.single_share > 0.0 && r.gen_bool(ctx.single_share));
        let mut k = if single { 1 } else { r.gen_range(1..=ctx.batch_max) };
        if ctx.push_until.is_none() {
            k = k.min(share - done);
        }
        let ids: Vec<String> = (0..k).map(|i| format!("{p}-{}", n + i as u64)).collect();
        n += k as u64;
        let items: Vec<Value> = ids
            .iter()
            .map(|id| {
                json!({"queue": ctx.queue, "partition": format!("p{}", r.gen_range(0..ctx.partitions)), "payload": {"id": id}})
            })
            .collect();
        let items = Value::Array(items);
        let point = ctx.pick_point(&mut r);
        if r.gen_bool(0.2) {
            // Pushed, then rolled back: none of these may ever be delivered.
            let res = s.call(point.as_deref(), |s| {
                s.begin()?;
                push_call(s, single, ctx.routed, &items)?;
                s.rollback()
            });
            match res {
                Ok(()) => ctx.shared.lock().unwrap().rolled_back.extend(ids),
                // Faulted or lost: either way never committed.
                Err(e) => match s.failed(&e, ctx, "a rolled-back push") {
                    Failure::Fault | Failure::Error => ctx.shared.lock().unwrap().rolled_back.extend(ids),
                    Failure::Lost => ctx.shared.lock().unwrap().unknown.extend(ids),
                },
            }
            continue;
        }
        match s.call(point.as_deref(), |s| push_call(s, single, ctx.routed, &items)) {
            Ok(rows) => {
                let mut sh = ctx.shared.lock().unwrap();
                for row in rows {
                    let idx: i32 = row.get(0);
                    sh.committed.insert((row.get(1), row.get(2)), ids[idx as usize].clone());
                }
                done += k;
            }
            Err(e) => match s.failed(&e, ctx, "push") {
                // The push's transaction rolled back.
                Failure::Fault | Failure::Error => ctx.shared.lock().unwrap().rolled_back.extend(ids),
                Failure::Lost => ctx.shared.lock().unwrap().unknown.extend(ids),
            },
        }
    }
}

const POP: &str = "SELECT lease_id, partition_id, msg_offset, payload ->> 'id'
   FROM queen.pop($1, $2, batch => $3, max_partitions => $4, lease_seconds => $5, wait_ms => $6)";
const ACK: &str = "SELECT queen.ack($1, $2::jsonb)";
// A dead-lettering ack carries its own statement text, so that the chaos thread can find it.
const ACK_DLQ: &str = "SELECT queen.ack($1, $2::jsonb) /* dead-letter */";

fn consumer(k: usize, group: &str, seed: u64, ctx: &Ctx) {
    let mut r = StdRng::seed_from_u64(seed);
    let mut s = ctx.session(k);
    let (queue, lease_seconds) = (ctx.queue.as_str(), ctx.lease_seconds);
    // Where `drained` reads the queue's state: the sessions' server, or `check_dsn`.
    let mut checker = ctx.check_dsn.as_deref().map(|d| connect(d, ctx.deadline, &ctx.deferred));
    loop {
        assert!(Instant::now() < ctx.deadline, "consumer in {group}: deadline passed before the queue drained");
        s.ensure();
        let batch = r.gen_range(1..=20i32);
        let max_partitions = r.gen_range(1..=3i32);
        let wait_ms = if r.gen_bool(0.3) { 200 } else { 0 };
        let point = ctx.pick_point(&mut r);
        let rows = match s.call(point.as_deref(), |s| {
            s.query(
                POP,
                &[
                    (&queue, Type::TEXT),
                    (&group, Type::TEXT),
                    (&batch, Type::INT4),
                    (&max_partitions, Type::INT4),
                    (&lease_seconds, Type::INT4),
                    (&wait_ms, Type::INT4),
                ],
            )
        }) {
            Ok(rows) => rows,
            Err(e) => {
                // Rolled back: nothing delivered. A lost connection: the lease, if any, expires.
                s.failed(&e, ctx, "pop");
                continue;
            }
        };
        if rows.is_empty() {
            if ctx.pushers_left.load(Ordering::SeqCst) == 0 {
                let done = match checker.as_mut() {
                    Some(c) => drained(c, queue, group),
                    None => drained_session(&mut s, queue, group),
                };
                if done {
                    return;
                }
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
            got.push((ctx.seq.fetch_add(1, Ordering::SeqCst), (pid, off), row.get(3)));
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
        let acks = Value::Array(
            lanes
                .iter()
                .map(|&(pid, _, last)| match signal {
                    Some((s, spid, e)) if spid == pid => {
                        json!({"partitionId": pid.to_string(), "offset": e, "status": s, "error": "harness"})
                    }
                    _ => json!({"partitionId": pid.to_string(), "offset": last, "status": "completed"}),
                })
                .collect(),
        );
        let ack_sql = if outcome == Outcome::Signal("dlq") { ACK_DLQ } else { ACK };
        // First, maybe, the same ack in a transaction that rolls back: nothing advances.
        if ctx.rollback_acks && outcome != Outcome::NoAck && r.gen_bool(0.1) {
            let (pause, savepoint, point) = (r.gen_bool(0.5), r.gen_bool(0.3), ctx.pick_point(&mut r));
            let res = s.call(point.as_deref(), |s| {
                s.begin()?;
                if savepoint {
                    s.begin()?;
                }
                s.query(ack_sql, &[(&lease, Type::UUID), (&acks, Type::JSONB)])?;
                if pause {
                    s.batch("SELECT pg_sleep(0.05)")?;
                }
                s.rollback()?;
                if savepoint {
                    s.commit()?;
                }
                Ok(())
            });
            // Whatever happened, no COMMIT covered the ack: it advanced nothing.
            let follow = match res {
                Ok(()) => {
                    ctx.shared.lock().unwrap().rolled_back_acks += 1;
                    r.gen_bool(0.5)
                }
                Err(e) => match s.failed(&e, ctx, "a rolled-back ack") {
                    Failure::Fault | Failure::Error => r.gen_bool(0.5),
                    Failure::Lost => false,
                },
            };
            if !follow {
                let mut sh = ctx.shared.lock().unwrap();
                for (sq, addr, id) in got {
                    sh.deliveries.entry(group.to_string()).or_default().push(Delivery {
                        seq: sq,
                        addr,
                        id,
                        fate: Some("rolled-back ack"),
                    });
                }
                continue;
            }
            s.ensure();
        }
        let point = if outcome == Outcome::NoAck { None } else { ctx.pick_point(&mut r) };
        let result: Result<Option<Value>, postgres::Error> = match outcome {
            Outcome::NoAck => Ok(None),
            Outcome::ExtendThenComplete => s.call(point.as_deref(), |s| {
                s.query("SELECT queen.extend_lease($1, 30)", &[(&lease, Type::UUID)])?;
                s.query_one(ack_sql, &[(&lease, Type::UUID), (&acks, Type::JSONB)]).map(|row| Some(row.get(0)))
            }),
            _ => s.call(point.as_deref(), |s| {
                s.query_one(ack_sql, &[(&lease, Type::UUID), (&acks, Type::JSONB)]).map(|row| Some(row.get(0)))
            }),
        };
        match result {
            Ok(res) => {
                let mut sh = ctx.shared.lock().unwrap();
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
                            sh.advances.entry(group.to_string()).or_default().push((pid, first, to));
                        }
                    }
                }
                if let Some(items) = res.as_ref().and_then(|v| v["items"].as_array().cloned()) {
                    for it in items.iter().filter(|it| it["dlq"].as_bool() == Some(true)) {
                        let pid: uuid::Uuid = it["partitionId"].as_str().unwrap().parse().unwrap();
                        sh.dead.entry(group.to_string()).or_default().push((pid, it["offset"].as_i64().unwrap()));
                    }
                }
                for (sq, addr, id) in got {
                    let fate = match applied.get(&addr.0) {
                        Some(&to) if addr.1 <= to => None,
                        Some(_) => Some("nack"),
                        None if outcome == Outcome::NoAck => Some("expiry"),
                        None => Some("ack after expiry"),
                    };
                    if fate.is_none() {
                        *sh.acked.entry(group.to_string()).or_default() += 1;
                    }
                    sh.deliveries.entry(group.to_string()).or_default().push(Delivery { seq: sq, addr, id, fate });
                }
            }
            Err(e) => {
                let failure = s.failed(&e, ctx, "ack");
                let mut sh = ctx.shared.lock().unwrap();
                let fate = match failure {
                    // The ack's transaction rolled back: nothing advanced.
                    Failure::Fault => "fault",
                    Failure::Error => "error",
                    Failure::Lost => {
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
                            sh.maybe_advances.entry(group.to_string()).or_default().push((pid, first, to));
                            if let Some((sig, spid, e)) = signal {
                                if spid == pid && (sig == "dlq" || sig == "failed") {
                                    sh.maybe_dead.entry(group.to_string()).or_default().push((pid, e));
                                }
                            }
                        }
                        "crash"
                    }
                };
                for (sq, addr, id) in got {
                    sh.deliveries.entry(group.to_string()).or_default().push(Delivery {
                        seq: sq,
                        addr,
                        id,
                        fate: Some(fate),
                    });
                }
            }
        }
    }
}

const DRAINED: &str = "SELECT (SELECT count(*) FROM queen.status($1) WHERE consumer_group = $2 AND lag = 0)
          = (SELECT count(*) FROM queen.partitions p JOIN queen.queues q USING (queue_id) WHERE q.name = $1)";

/// True when every lane of the group is at its head. A crash can leave a connection
/// broken here too: then not drained yet (the caller reconnects on its next pop).
fn drained(c: &mut Client, queue: &str, group: &str) -> bool {
    // Every partition has a lane for the group (a lane is created by a later pop), at its head.
    c.query_one(DRAINED, &[&queue, &group]).map(|row| row.get(0)).unwrap_or(false)
}

fn drained_session(s: &mut Session, queue: &str, group: &str) -> bool {
    match s.query(DRAINED, &[(&queue, Type::TEXT), (&group, Type::TEXT)]) {
        Ok(rows) => rows[0].get(0),
        Err(_) => {
            s.broken = true;
            false
        }
    }
}

/// The pauser session: pauses the queue or one of its groups, waits up to 300 ms, resumes
/// it, and so on until `stop`; then resumes everything (an interrupted resume, a crash,
/// must not leave the queue paused for the drain). Returns the pauses that committed.
fn pauser(ctx: &Ctx, groups: &[String], seed: u64, stop: &AtomicBool, deadline: Instant) -> usize {
    let mut r = StdRng::seed_from_u64(seed ^ 0x9a05e);
    let mut c = ctx.directly(deadline);
    let mut pauses = 0;
    let call = |c: &mut Client, sql: &str, group: Option<&str>| -> bool {
        match c.execute(sql, &[&ctx.queue, &group]) {
            Ok(_) => true,
            Err(e) => {
                // Killed by a crash: a new session. Any other error is a finding.
                if !(is_disconnect(&e) && ctx.crashes) {
                    ctx.error(sql, &describe(&e));
                }
                *c = ctx.directly(deadline);
                false
            }
        }
    };
    while !stop.load(Ordering::SeqCst) {
        let group = r.gen_bool(0.7).then(|| groups[r.gen_range(0..groups.len())].as_str());
        if call(&mut c, "SELECT queen.pause($1, $2)", group) {
            pauses += 1;
        }
        thread::sleep(Duration::from_millis(r.gen_range(20..300)));
        call(&mut c, "SELECT queen.resume($1, $2)", group);
        thread::sleep(Duration::from_millis(r.gen_range(50..400)));
    }
    for group in std::iter::once(None).chain(groups.iter().map(|g| Some(g.as_str()))) {
        while !call(&mut c, "SELECT queen.resume($1, $2)", group) {}
    }
    pauses
}

/// The redriver session: redrives up to 50 dead letters of a random group to that group,
/// every 100 to 300 ms, until 3 s after the pushers are done (most dead letters come late:
/// after a message's retries).
fn redriver(ctx: &Ctx, groups: &[String], seed: u64, deadline: Instant) {
    let mut r = StdRng::seed_from_u64(seed ^ 0x4ed1);
    let mut c = ctx.directly(deadline);
    let mut until = None;
    loop {
        if ctx.pushers_left.load(Ordering::SeqCst) <= 1
            && Instant::now() >= *until.get_or_insert(Instant::now() + Duration::from_secs(3))
        {
            break;
        }
        let group = &groups[r.gen_range(0..groups.len())];
        if let Err(e) = c.execute("SELECT queen.dlq_redrive($1, $2, max_messages => 50)", &[&ctx.queue, group]) {
            // Killed by a crash: a new session. Any other error is a finding.
            if !(is_disconnect(&e) && ctx.crashes) {
                ctx.error("queen.dlq_redrive", &describe(&e));
            }
            c = ctx.directly(deadline);
        }
        thread::sleep(Duration::from_millis(r.gen_range(100..300)));
    }
}

/// The redriven copies in the queue, by address: (the payload's id, the group it is for),
/// read with `peek` (no lease, no cursor move) over every partition.
fn redriven_copies(c: &mut Client, queue: &str) -> HashMap<Addr, (String, String)> {
    let mut copies = HashMap::new();
    let partitions: Vec<String> = c
        .query("SELECT DISTINCT partition FROM queen.status($1)", &[&queue])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for p in partitions {
        let mut from = 1i64;
        loop {
            let rows = c
                .query(
                    "SELECT partition_id, msg_offset, payload ->> 'id', headers ->> 'queen.redrive'
                       FROM queen.peek($1, partition => $2, from_offset => $3, max_messages => 1000)",
                    &[&queue, &p, &from],
                )
                .unwrap();
            let Some(last) = rows.last() else { break };
            from = last.get::<_, i64>(1) + 1;
            for r in &rows {
                if let Some(group) = r.get::<_, Option<String>>(3) {
                    copies.insert((r.get(0), r.get(1)), (r.get::<_, Option<String>>(2).unwrap_or_default(), group));
                }
            }
        }
    }
    copies
}

/// The skipper session: `queen.retain(queue)` every 30 to 120 ms, which moves the skip
/// group past its oldest messages wherever its lag passed its `max_lag`.
fn skipper(ctx: &Ctx, seed: u64, stop: &AtomicBool, deadline: Instant) {
    let mut r = StdRng::seed_from_u64(seed ^ 0x5c1b);
    let mut c = ctx.directly(deadline);
    while !stop.load(Ordering::SeqCst) {
        if let Err(e) = c.execute("SELECT queen.retain($1)", &[&ctx.queue]) {
            // Killed by a crash: a new session. Any other error is a finding.
            if !(is_disconnect(&e) && ctx.crashes) {
                ctx.error("queen.retain", &describe(&e));
            }
            c = ctx.directly(deadline);
        }
        thread::sleep(Duration::from_millis(r.gen_range(30..120)));
    }
}

/// Crashes the server while the harness runs: SIGKILL of a backend in the middle of a
/// push, a pop, an ack or a dead-lettering ack (the postmaster then restarts every
/// session), or `pg_ctl stop -m immediate` and a restart — whichever kind it has done
/// least — until `kills` are done or `until`. Returns how many of each.
#[allow(clippy::too_many_arguments)]
fn chaos(
    dsn: &str,
    kills: usize,
    pause_ms: (u64, u64),
    seed: u64,
    compactor: bool,
    rotator: bool,
    stop: &AtomicBool,
    until: Instant,
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
    let connect_retrying = || crate::connect_to_retrying(dsn, deadline);
    let mut c = connect_retrying();
    let go_on = || !stop.load(Ordering::SeqCst) && Instant::now() < until;
    while done.values().sum::<usize>() < kills && go_on() {
        thread::sleep(Duration::from_millis(r.gen_range(pause_ms.0..=pause_ms.1)));
        if !go_on() {
            break;
        }
        // The kind done least so far (pushes first: pushers finish before consumers).
        let &(what, pattern) = targets.iter().min_by_key(|(w, _)| done.get(w).copied().unwrap_or(0)).unwrap();
        if pattern.is_empty() {
            cluster_immediate_restart();
            *done.entry(what).or_default() += 1;
            c = connect_retrying();
            continue;
        }
        // Wait (a little) for a backend in the middle of that call.
        let wait_until = Instant::now() + Duration::from_secs(3);
        let mut victim = None;
        while victim.is_none() && Instant::now() < wait_until && go_on() {
            victim = match c.query(
                "SELECT pid FROM pg_stat_activity
                  WHERE state = 'active' AND pid <> pg_backend_pid() AND query LIKE $1
                    AND query NOT LIKE '%pg_stat_activity%' ORDER BY random() LIMIT 1",
                &[&pattern],
            ) {
                Ok(rows) => rows.first().map(|row| row.get::<_, i32>(0)),
                Err(_) => {
                    c = connect_retrying();
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
            c = connect_retrying();
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

/// The invariants, checked on what the sessions saw and the queue's final state. Every
/// broken one goes to `Report::violations`, and is counted.
fn check(cfg: &Config, queue: &str, c: &mut Client, s: &Shared) -> Report {
    let mut report = Report {
        pushed: s.committed.len(),
        rolled_back: s.rolled_back.len(),
        push_unknown: s.unknown.len(),
        ..Report::default()
    };
    let mut violations: Vec<String> = Vec::new();
    let mut violation = |v: String| {
        if violations.len() < 50 {
            violations.push(v);
        }
    };
    let crashes = cfg.crashes();
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
    let mut messages: HashMap<uuid::Uuid, BTreeSet<i64>> = HashMap::new();
    for &(pid, off) in s.committed.keys() {
        messages.entry(pid).or_default().insert(off);
    }
    // Redriven copies (`redriver`): messages too, each for one group.
    let copies = if cfg.redriver { redriven_copies(c, queue) } else { HashMap::new() };
    report.redriven = copies.len();
    // Each dead letter marked redriven made exactly one copy (a redrive that marks rows but
    // stores nothing, or stores twice, shows here).
    let marked: i64 = c
        .query_one(
            "SELECT count(*) FROM queen.log_dlq d JOIN queen.queues q USING (queue_id)
              WHERE q.name = $1 AND d.redriven_at IS NOT NULL",
            &[&queue],
        )
        .unwrap()
        .get(0);
    if marked as usize != copies.len() {
        violation(format!("{marked} dead letters marked redriven, {} copies in the queue", copies.len()));
    }
    // The only span rows (no payload, offsets from..to) are a skip group's.
    let other_spans: i64 = c
        .query_one(
            "SELECT count(*) FROM queen.log_dlq d JOIN queen.queues q USING (queue_id)
              WHERE q.name = $1 AND d.last_offset IS NOT NULL AND d.reason <> 'skipped'",
            &[&queue],
        )
        .unwrap()
        .get(0);
    if other_spans != 0 {
        violation(format!("{other_spans} span rows in the DLQ that no skip group filed"));
    }
    for &(pid, off) in copies.keys() {
        messages.entry(pid).or_default().insert(off);
    }
    for ds in s.deliveries.values() {
        for d in ds {
            messages.entry(d.addr.0).or_default().insert(d.addr.1);
        }
    }
    report.committed = messages.values().map(BTreeSet::len).sum();
    for (pid, offs) in &messages {
        let head = heads.get(pid).copied().unwrap_or(0);
        let last = offs.iter().next_back().copied().unwrap_or(0);
        if last > head {
            violation(format!("partition {pid}: a message at {last} beyond the head {head}"));
        } else if last != head {
            violation(format!("partition {pid}: the head {head} is not the last message {last}"));
        }
    }
    // The messages in from..=to.
    let messages_in = |pid: &uuid::Uuid, from: i64, to: i64| -> Vec<i64> {
        messages.get(pid).map(|m| m.range(from..=to).copied().collect()).unwrap_or_default()
    };

    for group in &cfg.groups {
        let empty = Vec::new();
        let deliveries = s.deliveries.get(group).unwrap_or(&empty);
        report.deliveries += deliveries.len();
        // What each delivered address carried, and that it came from a committed push.
        let mut by_addr: BTreeMap<Addr, Vec<&Delivery>> = BTreeMap::new();
        let mut addr_of_id: HashMap<&str, Addr> = HashMap::new();
        for d in deliveries {
            // A redriven copy: for its group only, carrying the id of the message it copies.
            if let Some((id, target)) = copies.get(&d.addr) {
                if target != group {
                    violation(format!("{group}: delivered a copy redriven to {target} at {:?}", d.addr));
                } else if id != &d.id {
                    violation(format!("{group}: the copy at {:?} carried {} instead of {id}", d.addr, d.id));
                }
                by_addr.entry(d.addr).or_default().push(d);
                continue;
            }
            if s.rolled_back.contains(&d.id) {
                violation(format!("{group}: delivered {} from a rolled-back push", d.id));
            }
            match s.committed.get(&d.addr) {
                Some(id) if id != &d.id => {
                    violation(format!("{group}: {:?} carried {} but its push returned {id}", d.addr, d.id))
                }
                Some(_) => {}
                None if crashes && s.unknown.contains(&d.id) => {}
                None => violation(format!("{group}: delivered {} at {:?}, which no push returned", d.id, d.addr)),
            }
            if let Some(prev) = addr_of_id.insert(&d.id, d.addr) {
                if prev != d.addr {
                    violation(format!("{group}: message {} delivered at two addresses", d.id));
                }
            }
            by_addr.entry(d.addr).or_default().push(d);
        }
        report.delivered += by_addr.len();
        // Messages the group's pops found older than the queue's ttl: filed as dead letters
        // (reason 'expired') instead of delivered, and passed by the cursor.
        let expired: HashSet<Addr> = c
            .query(
                "SELECT d.partition_id, d.msg_offset FROM queen.log_dlq d JOIN queen.queues q USING (queue_id)
                  WHERE q.name = $1 AND d.consumer_group = $2 AND d.reason = 'expired'",
                &[&queue, group],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        report.expired += expired.len();
        // Spans a skip group passed over past its max_lag (`skip_max_lag`): one row each.
        let spans: Vec<(uuid::Uuid, i64, i64)> = c
            .query(
                "SELECT d.partition_id, d.msg_offset, d.last_offset FROM queen.log_dlq d JOIN queen.queues q USING (queue_id)
                  WHERE q.name = $1 AND d.consumer_group = $2 AND d.reason = 'skipped'",
                &[&queue, group],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        if !spans.is_empty() && (cfg.skip_max_lag == 0 || cfg.groups.last() != Some(group)) {
            violation(format!("{group}: {} skipped spans, but it is not a skip group", spans.len()));
        }
        let mut spans_of: HashMap<uuid::Uuid, Vec<(i64, i64)>> = HashMap::new();
        for &(pid, from, to) in &spans {
            spans_of.entry(pid).or_default().push((from, to));
        }
        let skipped: HashSet<Addr> = s
            .committed
            .keys()
            .chain(copies.keys())
            .filter(|(pid, off)| spans_of.get(pid).is_some_and(|v| v.iter().any(|&(a, b)| a <= *off && *off <= b)))
            .copied()
            .collect();
        report.skip_spans += spans.len();
        report.skipped_by_overflow += skipped.len();
        // Every committed push was delivered, expired, or skipped by a skip group.
        for (addr, id) in &s.committed {
            if !by_addr.contains_key(addr) && !expired.contains(addr) && !skipped.contains(addr) {
                report.lost += 1;
                violation(format!("{group}: {id} at {addr:?} was never delivered"));
            }
        }
        // Every copy redriven to this group was delivered to it (or dead-lettered again,
        // after a delivery); the other groups passed over it (`passed`).
        let dead_here: HashSet<Addr> = s.dead.get(group).map(|v| v.iter().copied().collect()).unwrap_or_default();
        let mut passed: HashSet<Addr> = HashSet::new();
        for (addr, (id, target)) in &copies {
            if target != group {
                passed.insert(*addr);
            } else if by_addr.contains_key(addr) {
                report.redriven_delivered += 1;
            } else if !dead_here.contains(addr) && !expired.contains(addr) && !skipped.contains(addr) {
                report.lost += 1;
                violation(format!("{group}: the copy of {id} redriven to it at {addr:?} was never delivered"));
            }
        }
        // Redelivery only after a delivery that no ack committed; count why.
        for (addr, ds) in by_addr.iter_mut() {
            ds.sort_by_key(|d| d.seq);
            for (k, d) in ds.iter().enumerate() {
                let last = k + 1 == ds.len();
                match (last, d.fate) {
                    (false, None) => {
                        report.duplicated_after_commit += 1;
                        violation(format!("{group}: {addr:?} delivered again after an ack committed it"));
                    }
                    (false, Some(cause)) => *report.duplicates.entry(cause).or_default() += 1,
                    (true, Some(cause)) if cause != "crash" && !expired.contains(addr) && !skipped.contains(addr) => {
                        violation(format!(
                            "{group}: {addr:?} last delivered with no committed ack ({cause}) yet the lane drained"
                        ))
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
        // A skipped span is an advance of the cursor too.
        for &(pid, from, to) in &spans {
            adv.entry(pid).or_default().push((from, to));
        }

        let mut maybe: HashMap<uuid::Uuid, Vec<(i64, i64)>> = HashMap::new();
        for &(pid, from, to) in s.maybe_advances.get(group).unwrap_or(&Vec::new()) {
            maybe.entry(pid).or_default().push((from, to));
        }
        // The messages in from..=to that no span of an ack of unknown fate asked to pass
        // (a span starts at its pop's first message: gaps before it need no cover). Several
        // such acks may tile one stretch: a lane has one ack in flight at a time, but one
        // crash after another can each hide an ack that committed.
        let uncovered = |pid: &uuid::Uuid, from: i64, to: i64| -> usize {
            let spans = maybe.get(pid).map(Vec::as_slice).unwrap_or(&[]);
            messages_in(pid, from, to)
                .iter()
                .filter(|&&o| {
                    !expired.contains(&(*pid, o))
                        && !passed.contains(&(*pid, o))
                        && !spans.iter().any(|&(a, b)| a <= o && o <= b)
                })
                .count()
        };
        let cursors: HashMap<uuid::Uuid, i64> = c
            .query("SELECT partition_id, committed FROM queen.status($1) WHERE consumer_group = $2", &[&queue, group])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        for (pid, &head) in &heads {
            if cursors.get(pid).copied() != Some(head) {
                violation(format!("{group}: partition {pid} did not drain ({:?} of {head})", cursors.get(pid)));
            }
            let mut spans = adv.remove(pid).unwrap_or_default();
            spans.sort();
            let mut next = 1;
            for (from, to) in spans {
                if from < next {
                    report.passed_twice += (next - from).min(to - from + 1) as usize;
                    violation(format!("{group}: partition {pid}: offsets {from}..={} passed twice", next - 1));
                }
                if from > next {
                    // Messages no ack reported: only an ack whose fate a crash hid may have
                    // passed them.
                    let n = uncovered(pid, next, from - 1);
                    if n > 0 {
                        report.skipped += n;
                        violation(format!(
                            "{group}: partition {pid}: offsets {next}..={} skipped by the cursor ({n} messages)",
                            from - 1
                        ));
                    }
                }
                next = next.max(to + 1);
            }
            if next <= head {
                let n = uncovered(pid, next, head);
                if n > 0 {
                    report.skipped += n;
                    violation(format!(
                        "{group}: partition {pid}: offsets {next}..={head} passed by no ack ({n} messages)"
                    ));
                }
            }
        }
        // Exactly one log_dlq row per dead-lettered message.
        let rows: Vec<(uuid::Uuid, i64, i64)> = c
            .query(
                "SELECT d.partition_id, d.msg_offset, count(*) FROM queen.log_dlq d JOIN queen.queues q USING (queue_id)
                  WHERE q.name = $1 AND d.consumer_group = $2 AND d.last_offset IS NULL GROUP BY 1, 2",
                &[&queue, group],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let dead: HashSet<Addr> = s.dead.get(group).map(|v| v.iter().copied().collect()).unwrap_or_default();
        let maybe_dead: HashSet<Addr> =
            s.maybe_dead.get(group).map(|v| v.iter().copied().collect()).unwrap_or_default();
        if dead.len() != s.dead.get(group).map_or(0, Vec::len) {
            violation(format!("{group}: an address dead-lettered twice"));
        }
        for &(pid, off, n) in &rows {
            if n != 1 {
                violation(format!("{group}: {n} log_dlq rows for ({pid}, {off})"));
            }
            if !dead.contains(&(pid, off)) && !maybe_dead.contains(&(pid, off)) && !expired.contains(&(pid, off)) {
                violation(format!("{group}: a log_dlq row for ({pid}, {off}) that no ack reported"));
            }
        }
        let filed: HashSet<Addr> = rows.iter().map(|&(p, o, _)| (p, o)).collect();
        for a in &expired {
            if !s.committed.contains_key(a) && !messages.get(&a.0).is_some_and(|m| m.contains(&a.1)) {
                violation(format!("{group}: an expired dead letter at {a:?}, where no committed message is"));
            }
        }
        for a in &dead {
            if !filed.contains(a) {
                violation(format!("{group}: {a:?} reported dead-lettered but has no log_dlq row"));
            }
        }
        report.dead_lettered += rows.len();
    }
    report.violations = violations;
    report
}

#[cfg(test)]
mod tests {
    /// The extension's fail points: the `POINTS` array of `src/pg/failpoints.rs`, read from
    /// its source so that the list here cannot drift from it.
    fn extension_points() -> Vec<String> {
        let src = include_str!("../../src/pg/failpoints.rs");
        let start = src.find("pub const POINTS").expect("src/pg/failpoints.rs declares POINTS");
        let body = &src[start..];
        let body = &body[body.find("= &[").expect("POINTS is an array") + 4..];
        let body = &body[..body.find("];").expect("the array ends")];
        body.lines()
            .map(|l| l.split("//").next().unwrap())
            .flat_map(|l| l.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.trim_matches('"').to_string())
            .collect()
    }

    #[test]
    fn the_harness_knows_every_fail_point() {
        let ext = extension_points();
        assert!(
            ext.iter().any(|p| p.starts_with("xact.")),
            "parsed no xact.* point from src/pg/failpoints.rs: {ext:?}"
        );
        let mut expected: Vec<String> = queen_core::fail::POINTS.iter().map(|p| p.to_string()).collect();
        expected.extend(ext);
        let listed: Vec<String> = super::FAIL_POINTS.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            listed, expected,
            "harness::FAIL_POINTS must be queen_core::fail::POINTS then src/pg/failpoints.rs' POINTS"
        );
    }
}
