//! Background maintenance (with `shared_preload_libraries = 'queen'`): one launcher for
//! the cluster, and one maintenance worker per database where queen is installed.
//!
//! **The launcher** ("queen launcher") connects to no database. Every few seconds, and at
//! once when a `CREATE EXTENSION queen` or `ALTER EXTENSION queen` commits (`dbs`), it
//! lists the cluster's databases and starts a worker for each one that accepts
//! connections, is not a template, and has no worker running. A worker that finds no
//! queen installed says so and exits; its database is tried again when an extension
//! statement there commits, or after `REPROBE`. When a database is gone, the launcher
//! forgets its state in shared memory (its lanes, its partitions' offsets, its slot).
//!
//! **A database's worker** ("queen maintenance") runs, each in transactions of its own:
//! a compaction pass every `queen.compaction_interval` milliseconds (each partition in its
//! own transaction), a retention pass every `queen.retention_interval` seconds (each queue
//! in its own transaction, then a rotation of the segment generations), the expiry of idle
//! partitions, old dedup entries and old dead letters with it, and every two seconds a round of the lane
//! journal (`lane::registry`) and the sweep of prepared transactions' offsets. It exits when the
//! extension is dropped, and on SIGTERM (a server stop, or a `DROP DATABASE`).
//!
//! **Nothing stops maintenance.** An ERROR in any step is caught: its transaction is
//! rolled back, the error is logged with the partition or queue it concerns and counted
//! (`queen.metrics()`), and the worker goes on with the next step. A partition or queue
//! whose step failed is skipped for a while, twice as long after each failure in a row
//! (`queen_core::backoff`), so one bad partition costs nothing to the others.
//!
//! **`DROP DATABASE` works without `FORCE`.** The `ProcessUtility` hook (`hooks`) asks the
//! database's worker to leave (`leave_database`), waits for it to exit, and keeps the
//! launcher from starting another for a while; so do `ALTER DATABASE ... RENAME`, `SET
//! TABLESPACE` and `CREATE DATABASE ... TEMPLATE`, which also need the database to
//! themselves.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::pg::dbs::{self, Pass};
use crate::pg::settings;
use crate::pg::spi::run;

/// Called from `_PG_init`, after the settings are defined.
pub fn init() {
    // SAFETY: a plain read of a flag the postmaster sets while preloading libraries.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    BackgroundWorkerBuilder::new("queen launcher")
        .set_type("queen launcher")
        .set_library("queen")
        .set_function("queen_launcher_main")
        .enable_spi_access()
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

/// How often the launcher looks at the databases without being woken.
const LAUNCH_ROUND: Duration = Duration::from_secs(5);
/// How long a database where queen was not installed waits before it is probed again
/// (a `CREATE EXTENSION` there wakes the launcher at once).
const REPROBE: Duration = Duration::from_secs(300);
/// Least time between two starts of one database's worker.
const RESTART_DELAY: Duration = Duration::from_secs(5);
/// How long a `DROP DATABASE` (or the like) keeps the worker away, at most.
const LEAVE_PAUSE_MICROS: i64 = 60_000_000;

/// A database of the cluster, as `pg_database` lists it.
struct Database {
    oid: u32,
    name: String,
    serve: bool,
}

/// The cluster's databases, read from `pg_database` (a shared catalog, readable without
/// a database connection).
fn databases() -> Vec<Database> {
    let mut out = Vec::new();
    // SAFETY: a catalog scan as PostgreSQL's own launchers do it: inside a transaction,
    // with the relation opened and closed under AccessShareLock; each tuple's fixed part
    // is read as FormData_pg_database while the scan holds its buffer.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        let rel = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as i32);
        let scan = pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut());
        loop {
            let tup = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tup.is_null() {
                break;
            }
            // GETSTRUCT: the fixed part of the tuple starts t_hoff bytes into its data.
            let data = (*tup).t_data;
            let form = (data as *const u8).add((*data).t_hoff as usize) as *const pg_sys::FormData_pg_database;
            let name = std::ffi::CStr::from_ptr((*form).datname.data.as_ptr()).to_string_lossy().into_owned();
            out.push(Database {
                oid: (*form).oid.to_u32(),
                serve: (*form).datallowconn && !(*form).datistemplate,
                name,
            });
        }
        pg_sys::table_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as i32);
        pg_sys::PopActiveSnapshot();
        pg_sys::CommitTransactionCommand();
    }
    out
}

/// Sends SIGTERM to the maintenance worker `pid` of `database` (the pid its slot names),
/// if that pid is still a process connected to `database`: a worker clears its pid from
/// the slot when it exits (`worker_exit`), and shared memory starts afresh after a crash,
/// so a pid found there is that worker's, unless it exited this very moment. Returns
/// whether the signal was sent.
fn stop_worker(pid: i32, database: u32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: BackendPidGetProc reads the proc array under its own lock and returns null
    // for a pid that is no backend; the PGPROC it returns lives in shared memory for the
    // life of the server, and `databaseId` is a plain field of it. kill() with SIGTERM
    // then only asks that process to stop (our workers exit at their next wait).
    unsafe {
        let proc = pg_sys::BackendPidGetProc(pid);
        !proc.is_null() && (*proc).databaseId.to_u32() == database && libc_kill(pid, SIGTERM) == 0
    }
}

const SIGTERM: i32 = 15;

/// Whether no worker may start in a slot's database now (other than process `me`, 0 for
/// none): a statement that needs the database to itself paused it, rows are being copied
/// into queen's tables (`dbs::copy_in_begins`), or a live worker holds it. The launcher
/// asks before it starts a worker, and a starting worker asks again.
fn kept_away(slot: &dbs::Slot, now: i64, me: i32) -> bool {
    slot.paused_until > now
        || slot.restoring > 0
        || (slot.worker_pid != 0 && slot.worker_pid != me && alive(slot.worker_pid))
}

/// Whether a process still runs.
fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    pid > 0 && unsafe { libc_kill(pid, 0) } == 0
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn queen_launcher_main(_arg: pg_sys::Datum) {
    hold_cancels();
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(None, None);
    // SAFETY: this process's pid and latch (in its PGPROC, in shared memory); the exit
    // callback, registered once, takes them back however the launcher exits (an ERROR
    // included), so that nobody sets a latch this process no longer owns.
    unsafe {
        dbs::set_launcher(pg_sys::MyProcPid, pg_sys::MyLatch);
        pg_sys::before_shmem_exit(Some(launcher_exit), pg_sys::Datum::from(0));
    }
    let mut launcher = Launcher::default();
    loop {
        if BackgroundWorker::sighup_received() {
            // SAFETY: reloading the configuration file is what a worker does on SIGHUP.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        launcher.round();
        if !wait(LAUNCH_ROUND) {
            break; // SIGTERM
        }
    }
    // Exit code 1: the postmaster starts the launcher again unless the server is stopping.
    // SAFETY: ending the process the way PostgreSQL's own workers do.
    unsafe { pg_sys::proc_exit(1) };
}

/// The launcher exits: requests no longer wake it.
#[pg_guard]
unsafe extern "C-unwind" fn launcher_exit(_code: i32, _arg: pg_sys::Datum) {
    // SAFETY: null with pid 0: nobody sets this process's latch any more.
    unsafe { dbs::set_launcher(0, std::ptr::null_mut()) };
}

/// How long a database may wait for a slot before the launcher warns (the slots that
/// workers hold while they look whether queen is installed free up within seconds).
const STARVED_WARNING: Duration = Duration::from_secs(60);

/// What the launcher remembers between its rounds.
#[derive(Default)]
struct Launcher {
    /// When each database's worker was last started (`RESTART_DELAY`).
    last_start: HashMap<u32, Instant>,
    /// Databases where a worker found queen not installed, and when; they hold no slot,
    /// and are looked at again after `REPROBE` (or at once when a `CREATE EXTENSION` there
    /// takes a slot and asks for a worker).
    absent: HashMap<u32, i64>,
    /// Databases that found no free slot, since when, and whether that was logged.
    starved: HashMap<u32, (Instant, bool)>,
    /// Databases whose worker could not be started (no free worker process), logged once.
    unstartable: HashSet<u32>,
}

impl Launcher {
    /// One look at the databases: forget the ones gone, start the workers missing.
    fn round(&mut self) {
        // Prepared transactions that created queen somewhere and have committed since.
        dbs::settle_prepared();
        // The slots before the catalog: a slot taken after this for a database created
        // after the scan is not mistaken for one of a database that is gone.
        let slots = dbs::all();
        let all = databases();
        let only = settings::only_database();
        let present: HashSet<u32> = all.iter().map(|d| d.oid).collect();
        self.absent.retain(|db, _| present.contains(db));
        self.starved.retain(|db, _| present.contains(db));
        self.unstartable.retain(|db| present.contains(db));
        for slot in slots.iter().filter(|s| !present.contains(&s.database)) {
            self.forget(slot.database);
        }
        // A database the filter (`queen.retention_database`, reloadable) leaves out: its
        // worker is asked to stop.
        if let Some(o) = &only {
            for db in all.iter().filter(|d| d.name != *o) {
                if let Some(pid) = dbs::with(db.oid, false, |s| s.worker_pid) {
                    let _ = stop_worker(pid, db.oid);
                }
            }
        }
        let now = crate::pg::clock::clock_now();
        for db in all.iter().filter(|d| d.serve && only.as_ref().is_none_or(|o| *o == d.name)) {
            if self.needs_worker(db, now) {
                self.start(db);
            }
        }
    }

    /// A database that is gone: its lanes, partitions and slot are forgotten.
    fn forget(&mut self, database: u32) {
        let (lanes, partitions) = crate::lane::forget_registries(database);
        dbs::free(database);
        self.last_start.remove(&database);
        pgrx::log!("queen launcher: database {database} is gone; forgot {lanes} lanes and {partitions} partitions");
    }

    /// Whether a database where queen may be installed needs its worker started now: it
    /// has (or takes) a slot, no live worker, no pause, and its last start is not too
    /// recent.
    fn needs_worker(&mut self, db: &Database, now: i64) -> bool {
        // A worker found queen absent here and has exited: the slot goes back (unless a
        // CREATE EXTENSION took it up meanwhile), and the launcher remembers.
        if let Some(s) = dbs::with(db.oid, false, |s| *s) {
            if s.absent_at != 0
                && s.requested == 0
                && !alive(s.worker_pid)
                && dbs::free_if_absent(db.oid, s.worker_pid, now)
            {
                self.absent.insert(db.oid, s.absent_at);
                return false;
            }
        }
        let requested = dbs::with(db.oid, false, |s| s.requested != 0).unwrap_or(false);
        if !requested && self.absent.get(&db.oid).is_some_and(|&at| now - at < REPROBE.as_micros() as i64) {
            return false; // queen is not installed there
        }
        let Some(slot) = dbs::with(db.oid, true, |s| *s) else {
            let (since, logged) = self.starved.entry(db.oid).or_insert((Instant::now(), false));
            if !*logged && since.elapsed() >= STARVED_WARNING {
                *logged = true;
                pgrx::warning!(
                    "queen launcher: no slot for database {:?} (queen.max_databases): it gets no maintenance",
                    db.name
                );
            }
            return false;
        };
        self.starved.remove(&db.oid);
        self.absent.remove(&db.oid);
        if kept_away(&slot, now, 0) {
            return false;
        }
        if slot.absent_at != 0 && slot.requested == 0 {
            return false; // its worker is exiting: freed next round
        }
        self.last_start.get(&db.oid).is_none_or(|t| t.elapsed() >= RESTART_DELAY)
    }

    /// Starts a database's maintenance worker; a failure is logged once per database
    /// until a start succeeds (the launcher tries every round).
    fn start(&mut self, db: &Database) {
        self.last_start.insert(db.oid, Instant::now());
        dbs::with(db.oid, false, |s| s.requested = 0);
        let started = BackgroundWorkerBuilder::new(&format!("queen maintenance {}", db.name))
            .set_type("queen maintenance")
            .set_library("queen")
            .set_function("queen_maintenance_main")
            .set_argument(Some(pg_sys::Datum::from(db.oid)))
            .enable_spi_access()
            .set_restart_time(None)
            .load_dynamic();
        match started {
            Ok(_) => {
                self.unstartable.remove(&db.oid);
            }
            Err(_) => {
                if self.unstartable.insert(db.oid) {
                    pgrx::warning!(
                        "queen launcher: could not start the maintenance worker of database {:?}; raise max_worker_processes",
                        db.name
                    );
                }
            }
        }
    }
}

/// What the database's `pg_extension` says of queen.
#[derive(PartialEq)]
enum Installed {
    No,
    /// Another version: the worker waits for `ALTER EXTENSION queen UPDATE` (the old
    /// schema may lack what this library uses).
    Other,
    Yes,
}

fn installed(client: &mut SpiClient<'_>) -> Installed {
    match crate::pg::spi::first_value::<String>(run(
        client,
        "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'queen'",
        &[],
    )) {
        None => Installed::No,
        Some(v) if v == env!("CARGO_PKG_VERSION") => Installed::Yes,
        Some(_) => Installed::Other,
    }
}

/// Runs `f` in a transaction of its own, as a step (`run_step`). The worker calls every
/// step through this (or `run_step` itself), so that no step can stop the others.
fn in_transaction<R>(f: impl FnOnce() -> R + std::panic::UnwindSafe) -> Result<R, String> {
    run_step(move || {
        // SAFETY: starting a transaction with a snapshot, as BackgroundWorker::transaction
        // does; it is committed below, or rolled back by `run_step`'s catch.
        unsafe {
            pg_sys::SetCurrentStatementStartTimestamp();
            pg_sys::StartTransactionCommand();
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        }
        let out = f();
        // SAFETY: ends the transaction started above.
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        }
        out
    })
}

/// Runs `body`, one step of the worker's, with cancels let in (`hold_cancels`). An ERROR
/// (or a panic) is caught: whatever transaction it left is rolled back, and its message
/// returned.
fn run_step<R>(body: impl FnOnce() -> R + std::panic::UnwindSafe) -> Result<R, String> {
    let body = move || {
        let_cancels_in();
        let out = body();
        hold_cancels();
        Ok(out)
    };
    pgrx::PgTryBuilder::new(body)
        .catch_others(|e| {
            hold_cancels();
            // SAFETY: leaves whatever transaction state the ERROR left, as PostgreSQL's own
            // background workers do after an error (the error state was flushed already);
            // a VACUUM's portal context (`vacuum_fresh_tier`) is gone with it.
            unsafe {
                pg_sys::AbortOutOfAnyTransaction();
                pg_sys::PortalContext = std::ptr::null_mut();
            }
            Err(match e {
                pg_sys::panic::CaughtError::PostgresError(r)
                | pg_sys::panic::CaughtError::ErrorReport(r)
                | pg_sys::panic::CaughtError::RustPanic { ereport: r, .. } => r.message().to_string(),
            })
        })
        .execute()
}

/// The maintenance worker's state between rounds.
struct Maintenance {
    database: u32,
    backoff: queen_core::backoff::Backoff,
    /// A step of the current pass failed, or was skipped while it waits out the backoff of
    /// an earlier failure: the pass does not count as a success (else a step that fails on
    /// every try would look healthy between its tries, and `age_seconds` would never grow).
    errors: bool,
}

impl Maintenance {
    /// Runs one step of `pass` (about `what`) in its own transaction; an ERROR is logged,
    /// counted, and puts the step (`what` of that pass) in backoff. None when it failed or
    /// is in backoff.
    fn step<R>(&mut self, pass: Pass, what: &str, f: impl FnOnce() -> R + std::panic::UnwindSafe) -> Option<R> {
        // Each pass's steps back off on their own ("queue 5" is a retention step and an
        // expiry step).
        let key = format!("{}: {what}", pass.name());
        if !self.backoff.ready(&key, Instant::now()) {
            self.errors = true;
            return None;
        }
        match in_transaction(f) {
            Ok(r) => {
                self.backoff.ok(&key);
                Some(r)
            }
            Err(e) => {
                self.backoff.failed(&key, Instant::now());
                self.errors = true;
                pgrx::warning!("queen maintenance: {} of {what} failed, tried again later: {e}", pass.name());
                dbs::record_pass(pass, false, crate::pg::clock::clock_now());
                None
            }
        }
    }

    /// Ends a pass: counted as run, and as a success unless one of its steps failed.
    fn done(&mut self, pass: Pass) {
        if !std::mem::take(&mut self.errors) {
            dbs::record_pass(pass, true, crate::pg::clock::clock_now());
        }
    }

    fn stopping() -> bool {
        stop_requested()
    }
}

thread_local! {
    /// A SIGTERM arrived. pgrx's `sigterm_received` (and `wait_latch`, which asks it)
    /// forgets the signal once it has told it, so it is kept here: a pass that saw it and
    /// returned early must not leave the round loop waiting on as if nothing came (the
    /// worker would then never leave for a DROP DATABASE).
    static STOP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this worker was asked to stop (SIGTERM), now or earlier.
fn stop_requested() -> bool {
    if BackgroundWorker::sigterm_received() {
        STOP.with(|s| s.set(true));
    }
    STOP.with(|s| s.get())
}

/// Waits on the latch for at most `timeout`; false once the worker was asked to stop.
fn wait(timeout: Duration) -> bool {
    let alive = BackgroundWorker::wait_latch(Some(timeout));
    if !alive {
        STOP.with(|s| s.set(true));
    }
    !stop_requested()
}

/// A queen worker holds cancels (`pg_cancel_backend`) off from its first line, and lets
/// them in only inside a step (`run_step`), where one fails that step alone. Anywhere else it
/// has no statement to cancel: raised there, outside every catch (in its start-up, between
/// two steps, or in the WARNING that reports a failed step), the ERROR would end the worker
/// and stop the database's maintenance until the launcher starts another. The launcher,
/// which has no steps, holds them off for good. A cancel that came while they were held is
/// dropped when a step starts, and when they are held again.
///
/// The hold is set, not counted: an ERROR resets PostgreSQL's count to 0 (`errfinish`),
/// and steps do not nest.
fn hold_cancels() {
    set_cancel_holdoff(1);
}

/// Lets cancels in, for a step (`hold_cancels`).
fn let_cancels_in() {
    set_cancel_holdoff(0);
}

fn set_cancel_holdoff(count: u32) {
    // SAFETY: this process's own interrupt flags (HOLD_CANCEL_INTERRUPTS /
    // RESUME_CANCEL_INTERRUPTS set the count; a pending cancel that is cleared is one
    // nobody is waiting for).
    unsafe {
        pg_sys::QueryCancelPending = 0;
        pg_sys::QueryCancelHoldoffCount = count;
    }
}

/// Longest a retention round spends expiring one queue's idle partitions and old dead
/// letters.
const EXPIRY_BUDGET: Duration = Duration::from_secs(5);

/// How often the lane journal moves on (see `registry::rotate_journal`: a table is emptied
/// within three rounds of its retirement).
const JOURNAL_ROUND: Duration = Duration::from_secs(2);

/// A setting as a period, None when 0 (off).
fn period(value: i32, unit: Duration) -> Option<Duration> {
    (value > 0).then(|| unit * value as u32)
}

/// Clears the worker's pid in its database's slot when it exits.
#[pg_guard]
unsafe extern "C-unwind" fn worker_exit(_code: i32, arg: pg_sys::Datum) {
    let db = arg.value() as u32;
    dbs::with(db, false, |s| {
        // SAFETY: a plain read of this process's pid.
        if s.worker_pid == unsafe { pg_sys::MyProcPid } {
            s.worker_pid = 0;
            s.worker = dbs::WORKER_NONE;
        }
    });
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn queen_maintenance_main(arg: pg_sys::Datum) {
    hold_cancels();
    let database = arg.value() as u32;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(pg_sys::Oid::from(database)), None);
    // SAFETY: a plain read of this process's pid; the exit callback is registered once.
    let pid = unsafe { pg_sys::MyProcPid };
    // One worker per database, and none while a statement needs the database to itself.
    // Under the slot's lock, so that either `leave_database` sees this pid (and stops this
    // worker) or this worker sees its pause (and leaves at once): a worker the launcher
    // started just before the pause, or a second one started while the first was still
    // connecting, never stays in the way of a `CREATE DATABASE ... TEMPLATE`.
    let now = crate::pg::clock::clock_now();
    let taken = dbs::with(database, true, |s| {
        if kept_away(s, now, pid) {
            return false;
        }
        s.worker = dbs::WORKER_RUNNING;
        s.worker_pid = pid;
        s.requested = 0;
        s.absent_at = 0;
        true
    });
    if taken == Some(false) {
        // SAFETY: ending the process before anything was registered; exit code 0 (a
        // dynamic worker is not restarted).
        unsafe { pg_sys::proc_exit(0) };
    }
    // SAFETY: registering a process-exit callback once, with the database as its argument.
    unsafe { pg_sys::before_shmem_exit(Some(worker_exit), pg_sys::Datum::from(database)) };
    configure_session();
    // Is queen here, and at this library's version?
    loop {
        match in_transaction(|| Spi::connect_mut(installed)) {
            Ok(Installed::Yes) => break,
            Ok(Installed::No) => {
                // Unless a CREATE EXTENSION committed since this worker was asked for (it
                // set `requested`): then the launcher starts a worker again.
                dbs::with(database, false, |s| {
                    if s.requested == 0 {
                        s.absent_at = crate::pg::clock::clock_now();
                    }
                });
                // SAFETY: ending the process; exit code 0 (a dynamic worker is not restarted).
                unsafe { pg_sys::proc_exit(0) };
            }
            Ok(Installed::Other) | Err(_) => {}
        }
        if !wait(Duration::from_secs(5)) {
            // SAFETY: as above.
            unsafe { pg_sys::proc_exit(0) };
        }
    }
    // After copies into queen's tables (a restore): what the registries loaded from the
    // tables while they held part of a dump goes.
    if dbs::take_restored(database) {
        let (lanes, partitions) = crate::lane::forget_registries(database);
        pgrx::debug1!("queen maintenance: after rows were copied in, forgot {lanes} lanes and {partitions} partitions");
    }
    let mut m = Maintenance { database, backoff: Default::default(), errors: false };
    rounds(&mut m);
    // A clean stop saves every cursor into queen.lanes, so that a restart without the
    // library preloaded (no registry, no journal) finds them there.
    if crate::lane::registry::enabled() {
        let _ = m.step(Pass::Journal, "the journal's save", || {
            Spi::connect_mut(|client| {
                if installed(client) == Installed::Yes {
                    crate::lane::rows::save_journal(client);
                }
            })
        });
    }
    // SAFETY: ending the process the way PostgreSQL's own workers do.
    unsafe { pg_sys::proc_exit(0) };
}

/// The worker's session settings.
fn configure_session() {
    // Nothing the worker commits needs to wait for its WAL flush: a compaction or a
    // retention pass lost in a crash is undone whole (the small segments, or the old ones,
    // are still there) and simply runs again; and anything that reads its result and then
    // commits flushes that WAL first.
    // The worker runs as the bootstrap superuser: its search path is pinned to pg_catalog
    // (every queen name it uses is schema-qualified), so no schema a user can create in
    // (public, "$user") can put a function or operator in its way.
    // Compaction and rotation need statement snapshots: a database or role default of
    // REPEATABLE READ or SERIALIZABLE must not reach the worker. Nor may these database
    // defaults, which an owner who is not a superuser can set (`ALTER DATABASE ... SET`),
    // stop its passes: read-only transactions (every write fails), and the timeouts (the
    // lock timeout applies to a worker's statements; the others are pinned as a
    // safeguard).
    for (name, value) in [
        (c"synchronous_commit", c"off"),
        (c"default_transaction_isolation", c"read committed"),
        (c"default_transaction_read_only", c"off"),
        (c"default_transaction_deferrable", c"off"),
        (c"statement_timeout", c"0"),
        (c"lock_timeout", c"0"),
        (c"idle_in_transaction_session_timeout", c"0"),
        (c"search_path", c"pg_catalog, pg_temp"),
        // Replica mode turns off the foreign keys' cascades some deletes count on.
        (c"session_replication_role", c"origin"),
    ] {
        // SAFETY: setting configuration options for this process at session level (as the
        // superuser it is: session_replication_role is a superuser's setting).
        unsafe {
            pg_sys::SetConfigOption(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_SUSET,
                pg_sys::GucSource::PGC_S_SESSION,
            )
        };
    }
}

/// The worker's rounds, until SIGTERM or until queen is dropped from the database.
fn rounds(m: &mut Maintenance) {
    let mut compactor = Compactor::default();
    let start = Instant::now();
    let (mut next_compaction, mut next_retention, mut next_journal) = (start, start, start);
    loop {
        let now = Instant::now();
        let compaction = period(settings::compaction_interval_ms(), Duration::from_millis(1));
        let retention = period(settings::retention_interval_s(), Duration::from_secs(1));
        // Sleep until the next pass that is on (the journal's comes every two seconds).
        let due = [compaction.map(|_| next_compaction), retention.map(|_| next_retention), Some(next_journal)];
        let wake_at = due.iter().flatten().min().copied().unwrap_or(now + JOURNAL_ROUND);
        if !wait(wake_at.saturating_duration_since(now)) {
            return; // SIGTERM
        }
        if BackgroundWorker::sighup_received() {
            // SAFETY: reloading the configuration file is what a worker does on SIGHUP.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        let now = Instant::now();
        if now >= next_journal {
            match m.step(Pass::Journal, "the extension's presence", || Spi::connect_mut(installed)) {
                Some(Installed::No) => return, // DROP EXTENSION: the launcher starts a worker again on CREATE
                Some(Installed::Other) => {
                    next_journal = Instant::now() + JOURNAL_ROUND;
                    continue; // an update is under way: wait for ALTER EXTENSION queen UPDATE
                }
                _ => {}
            }
            journal_round(m);
            next_journal = Instant::now() + JOURNAL_ROUND;
        }
        if let Some(p) = compaction.filter(|_| now >= next_compaction) {
            compactor.pass(m);
            next_compaction = Instant::now() + p;
        }
        if let Some(p) = retention.filter(|_| now >= next_retention) {
            retention_round(m);
            next_retention = Instant::now() + p;
        }
        if Maintenance::stopping() {
            return;
        }
    }
}

/// The lane journal moves on, and prepared transactions' offsets that ended unseen go.
fn journal_round(m: &mut Maintenance) {
    if crate::lane::registry::enabled() {
        let done =
            m.step(Pass::Journal, "the lane journal", || Spi::connect_mut(crate::lane::registry::rotate_journal));
        if let Some(done) = done {
            crate::lane::registry::rotated(done);
        }
        m.done(Pass::Journal);
    }
    // Reservations of prepared transactions that ended unseen (`offsets::sweep_prepared`).
    let _ = m.step(Pass::Prepared, "prepared transactions", crate::offsets::sweep_prepared);
    m.done(Pass::Prepared);
}

/// The skip groups' overflow (`ops::overflow::skip_queue`), then retention, queue by queue
/// (each in its own transaction: no lock is held for the whole pass), then the rotation of
/// the segment generations, then the expiry of idle partitions, old dedup entries and old
/// dead letters (`storage::churn::expire_queue`).
fn retention_round(m: &mut Maintenance) {
    // Skip groups past their max_lag first: what they pass over may then go.
    let skips = m.step(Pass::Retention, "the skip groups", || Spi::connect_mut(crate::ops::overflow::queues_to_skip));
    for queue_id in skips.unwrap_or_default() {
        if Maintenance::stopping() {
            return;
        }
        let what = format!("queue {queue_id}'s skip groups");
        let _ = m.step(Pass::Retention, &what, || Spi::connect_mut(|c| crate::ops::overflow::skip_queue(c, queue_id)));
    }
    let queues = m.step(Pass::Retention, "the queue list", || Spi::connect_mut(crate::storage::retention::queues_due));
    let mut bytes = 0;
    for (queue_id, retention) in queues.unwrap_or_default() {
        if Maintenance::stopping() {
            return;
        }
        let what = format!("queue {queue_id}");
        if let Some(Some((_, b))) = m.step(Pass::Retention, &what, || {
            Spi::connect_mut(|c| crate::storage::retention::retain_queue(c, queue_id, retention))
        }) {
            bytes += b;
        }
    }
    let clean = !std::mem::take(&mut m.errors);
    crate::pg::stats::record_retention(crate::pg::clock::clock_now(), bytes, clean);
    let _ = m.step(Pass::Rotation, "the segment generations", || Spi::connect_mut(crate::storage::generations::rotate));
    m.done(Pass::Rotation);
    let queues = m.step(Pass::Expiry, "the queue list", || Spi::connect_mut(crate::storage::churn::queues_to_expire));
    for queue_id in queues.unwrap_or_default() {
        // Step after step (each its own transaction) while there is more, for a few
        // seconds at most: a queue with many idle partitions does not hold the round up.
        let until = Instant::now() + EXPIRY_BUDGET;
        loop {
            if Maintenance::stopping() {
                return;
            }
            let what = format!("queue {queue_id}");
            let more =
                m.step(Pass::Expiry, &what, || Spi::connect_mut(|c| crate::storage::churn::expire_queue(c, queue_id)));
            if more != Some(true) || Instant::now() >= until {
                break;
            }
        }
    }
    m.done(Pass::Expiry);
}

/// `VACUUM (INDEX_CLEANUP on, TRUNCATE off, SKIP_LOCKED) queen.fresh_segments`, as the
/// command does it (and as autovacuum calls it): outside any transaction block, with a
/// portal memory context for VACUUM's cross-transaction state. An ERROR is caught and
/// returned (the next pass vacuums again).
fn vacuum_fresh_tier() -> Result<(), String> {
    run_step(|| {
        // SAFETY: this follows autovacuum's call of vacuum(): a transaction is started, the
        // relation list is built in it (vacuum copies it before its first commit), the
        // params live on this stack for the whole call, PortalContext points at a context
        // that lives across vacuum's own transactions and is reset after, and vacuum leaves
        // a transaction open for the final commit.
        unsafe {
            let cx = pgrx::PgMemoryContexts::new("queen vacuum");
            let portal = cx.value();
            pg_sys::PortalContext = portal;
            pg_sys::StartTransactionCommand();
            let relation = pg_sys::makeRangeVar(
                pg_sys::pstrdup(c"queen".as_ptr()),
                pg_sys::pstrdup(c"fresh_segments".as_ptr()),
                -1,
            );
            let list = pg_sys::lappend(
                std::ptr::null_mut(),
                pg_sys::makeVacuumRelation(relation, pg_sys::InvalidOid, std::ptr::null_mut()).cast(),
            );
            let mut params = pg_sys::VacuumParams {
                options: pg_sys::VACOPT_VACUUM | pg_sys::VACOPT_SKIP_LOCKED | pg_sys::VACOPT_PROCESS_TOAST,
                freeze_min_age: -1,
                freeze_table_age: -1,
                multixact_freeze_min_age: -1,
                multixact_freeze_table_age: -1,
                is_wraparound: false,
                log_min_duration: -1,
                // The index is the point: always clean it.
                index_cleanup: pg_sys::VacOptValue::VACOPTVALUE_ENABLED,
                // Truncating the heap needs an exclusive lock that pushes hold off: VACUUM
                // would retry for up to 5 s, and the pass with it. Free pages are reused.
                truncate: pg_sys::VacOptValue::VACOPTVALUE_DISABLED,
                nworkers: 0,
            };
            pg_sys::vacuum(list, &mut params, std::ptr::null_mut(), true);
            pg_sys::CommitTransactionCommand();
            pg_sys::PortalContext = std::ptr::null_mut();
            drop(cx);
        }
    })
}

/// How often a compaction pass lists every partition of the fresh tier from the table (a
/// skip scan of its primary key) rather than from the offsets registry: at the start, and
/// then for partitions the registry has evicted.
const FULL_LIST_EVERY: Duration = Duration::from_secs(60);

/// The worker's compaction state: where each partition's fresh segments may start (see
/// `compaction::compact_partition`), and when the table was last listed whole.
#[derive(Default)]
struct Compactor {
    from: HashMap<pgrx::Uuid, i64>,
    listed: Option<Instant>,
    /// The oldest transaction horizon at the last VACUUM of the fresh tier.
    vacuumed_at: Option<String>,
}

impl Compactor {
    /// Every partition with small segments, each compacted in a transaction of its own, so
    /// a pass holds no lock for long; then, if anything was merged and the xmin horizon has
    /// moved since the last one, a VACUUM of the fresh tier. A partition whose compaction
    /// fails is skipped for a while (`queen_core::backoff`); the others go on.
    fn pass(&mut self, m: &mut Maintenance) {
        let full = self.listed.is_none_or(|t| t.elapsed() >= FULL_LIST_EVERY);
        let pids: Vec<pgrx::Uuid> = if full {
            let Some(pids) = m.step(Pass::Compaction, "the fresh tier's list", || {
                Spi::connect_mut(|client| crate::storage::compaction::partitions_to_compact(client, None))
            }) else {
                m.done(Pass::Compaction);
                return;
            };
            self.listed = Some(Instant::now());
            // Forget the marks of partitions with nothing fresh left.
            let listed: HashSet<pgrx::Uuid> = pids.iter().copied().collect();
            self.from.retain(|p, _| listed.contains(p));
            pids
        } else {
            // Partitions with something fresh at or above where they may start. (One the
            // registry has evicted meanwhile waits for the next full listing.)
            crate::offsets::fresh_partitions(m.database)
                .into_iter()
                .filter(|(p, max)| self.from.get(p).is_none_or(|from| from <= max))
                .map(|(p, _)| p)
                .collect()
        };
        let mut merged = 0;
        for pid in pids {
            if Maintenance::stopping() {
                return;
            }
            let from = self.from.get(&pid).copied().unwrap_or(0);
            let what = format!("partition {pid}");
            let Some((done, next)) = m.step(Pass::Compaction, &what, || {
                Spi::connect_mut(|client| crate::storage::compaction::compact_partition(client, pid, from))
            }) else {
                continue;
            };
            // (Committed: the marks move only now.)
            if let Some(next) = next {
                self.from.insert(pid, next);
            }
            merged += done.merged;
        }
        if merged > 0 {
            let horizon = m.step(Pass::Compaction, "the xmin horizon", || Spi::connect_mut(xmin_horizon)).flatten();
            if horizon.is_none() || horizon != self.vacuumed_at {
                if let Err(e) = vacuum_fresh_tier() {
                    m.errors = true;
                    pgrx::warning!("queen maintenance: the VACUUM of the fresh tier failed: {e}");
                    dbs::record_pass(Pass::Compaction, false, crate::pg::clock::clock_now());
                } else {
                    self.vacuumed_at = horizon;
                }
            }
        }
        m.done(Pass::Compaction);
    }
}

/// The oldest transaction that holds back what VACUUM may remove (the xmin horizon): of
/// every backend's snapshot and transaction id, replication slot and prepared transaction.
/// While it stays the same, a VACUUM can remove nothing that the last one could not, and
/// only scans: a long transaction makes a pass skip it instead.
fn xmin_horizon(client: &mut SpiClient<'_>) -> Option<String> {
    crate::pg::spi::first_value::<String>(run(
        client,
        "SELECT x::text FROM (
           SELECT backend_xmin AS x FROM pg_catalog.pg_stat_activity
            WHERE backend_xmin IS NOT NULL AND pid <> pg_catalog.pg_backend_pid()
           UNION ALL
           SELECT backend_xid FROM pg_catalog.pg_stat_activity
            WHERE backend_xid IS NOT NULL AND pid <> pg_catalog.pg_backend_pid()
           UNION ALL
           SELECT xmin FROM pg_catalog.pg_replication_slots WHERE xmin IS NOT NULL
           UNION ALL
           SELECT catalog_xmin FROM pg_catalog.pg_replication_slots WHERE catalog_xmin IS NOT NULL
           UNION ALL
           SELECT transaction FROM pg_catalog.pg_prepared_xacts) h
         ORDER BY pg_catalog.age(x) DESC LIMIT 1",
        &[],
    ))
}

/// Asks the worker of `database` to leave it (a `DROP DATABASE` or the like needs the
/// database to itself), and waits until it has: the launcher starts no other until
/// `resume_database`, or for a minute at most. Returns at once when there is none.
pub fn leave_database(database: u32) {
    if !dbs::enabled() {
        return;
    }
    let until = crate::pg::clock::clock_now() + LEAVE_PAUSE_MICROS;
    // (A slot is taken for the pause if the database has none: a database without queen
    // holds none, and the launcher must not start a worker there meanwhile.)
    let Some(pid) = dbs::with(database, true, |s| {
        s.paused_until = until;
        s.worker_pid
    }) else {
        return;
    };
    if pid == 0 || !alive(pid) {
        return;
    }
    if !stop_worker(pid, database) {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while alive(pid) && Instant::now() < deadline {
        // SAFETY: a short sleep on this backend's latch; interrupts are checked after.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                10,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pgrx::check_for_interrupts!();
    }
}

/// The statement that needed `database` to itself is over: the launcher may start its
/// worker again (at once), unless the database is gone.
pub fn resume_database(database: u32) {
    if dbs::enabled() && dbs::with(database, false, |s| s.paused_until = 0).is_some() {
        dbs::wake_launcher();
    }
}
