//! Every database queen serves: one slot per database in shared memory, with
//!
//! - its maintenance worker: the pid, and whether the launcher should start one (a
//!   `CREATE EXTENSION` or `ALTER EXTENSION` committed, a pause for `DROP DATABASE`, the
//!   worker found no queen there);
//! - its lane journal's state: which of the two journal tables acks append to, and how
//!   many acks in flight write to each (`registry::journal_table`, `registry::rotate_journal`);
//! - its maintenance counters, per pass: runs, errors, the time of the last success and of
//!   the last error (`queen.metrics()`), and what retention freed.
//!
//! A slot is taken by the first backend or worker of a database that needs one, and freed
//! by the launcher once the database is gone, or once a worker found that queen is not
//! installed there (`worker::launch_round`: the launcher then remembers that itself, and
//! looks again after a while, or at once on `CREATE EXTENSION`). So databases without
//! queen hold a slot only for the moment a worker looks. There are `queen.max_databases`
//! slots (default 64), for the databases where queen is installed (and a few being looked
//! at); a database beyond them gets no maintenance and its acks fail with `53400`.

use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::PgSqlErrorCode;

use crate::pg::errors;
use crate::pg::settings;
use crate::pg::shmem::{Parts, Region};

pub const TRANCHE: &CStr = c"queen databases";

/// The lane journal of one database (see `lane::registry`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Journal {
    /// Acks append to `queen.lane_journal_{current % 2}`.
    pub current: u64,
    /// Acks in flight (not yet ended) per journal table.
    pub writers: [u32; 2],
    /// The table not written to has been emptied since it was retired.
    pub other_empty: u32,
}

/// The maintenance passes a database's worker runs, for their counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Compaction = 0,
    Retention = 1,
    Rotation = 2,
    Journal = 3,
    Prepared = 4,
    Expiry = 5,
}

pub const PASSES: [Pass; 6] =
    [Pass::Compaction, Pass::Retention, Pass::Rotation, Pass::Journal, Pass::Prepared, Pass::Expiry];

impl Pass {
    pub fn name(self) -> &'static str {
        match self {
            Pass::Compaction => "compaction",
            Pass::Retention => "retention",
            Pass::Rotation => "rotation",
            Pass::Journal => "journal",
            Pass::Prepared => "prepared",
            Pass::Expiry => "expiry",
        }
    }
}

/// One pass's counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PassStats {
    pub runs: i64,
    pub errors: i64,
    /// When the pass last ended without an error (microseconds; 0: never).
    pub last_ok: i64,
    pub last_error: i64,
    /// When the pass first ended, with or without an error (0: never).
    pub first: i64,
}

/// What the worker of a database is doing.
pub const WORKER_NONE: u32 = 0;
pub const WORKER_RUNNING: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Slot {
    /// The database (0: a free slot).
    pub database: u32,
    pub worker: u32,
    pub worker_pid: i32,
    /// A start was asked for (an extension created or updated here committed).
    pub requested: u32,
    /// No worker until then (microseconds): a `DROP DATABASE` or the like is under way.
    pub paused_until: i64,
    /// The worker found queen not installed here at this time (0: not known so).
    pub absent_at: i64,
    /// A prepared transaction that created or updated the extension here (its xid; 0:
    /// none): the launcher asks for a worker once it commits (`settle_prepared`). Citus
    /// creates the extension on its workers this way, with two-phase commit.
    pub prepared_request: u32,
    pub journal: Journal,
    pub passes: [PassStats; 6],
    pub retention_bytes_last: i64,
    pub retention_bytes_total: i64,
    /// Fresh segments compaction could not decode and kept as they were.
    pub corrupt_segments: i64,
    /// Transactions in flight that copy rows into queen's tables (`COPY queen.x FROM`, as
    /// a restore of a dump does: `copy_in_begins`): no worker runs meanwhile, nor until
    /// `RESTORE_QUIET_MICROS` after the last one ended.
    pub restoring: u32,
    /// Such a transaction ended since the worker last started: the next worker forgets
    /// the database's idle lanes and partition offsets first (`take_restored`).
    pub restored: u32,
}

/// How long after the last copy into queen's tables ends the worker stays away
/// (microseconds): a restore's copies follow each other, and between two of them the
/// tables hold part of the dump.
const RESTORE_QUIET_MICROS: i64 = 30_000_000;

#[repr(C)]
struct Header {
    slots: u32,
    launcher_pid: i32,
    /// The launcher's latch (in shared memory), to wake it: 0 while there is none.
    launcher_latch: usize,
}

/// How the block divides: the header, then `slots` slots.
#[derive(Clone, Copy)]
struct Layout {
    slots: usize,
}

impl Parts for Layout {
    type Mut<'a> = (&'a mut Header, &'a mut [Slot]);
    type Ref<'a> = (&'a Header, &'a [Slot]);

    unsafe fn parts_mut<'a>(self, base: *mut u8) -> Self::Mut<'a> {
        // SAFETY: as the trait requires of the caller; the header starts the (MAXALIGNed)
        // block and the slots follow it at an 8-byte boundary, inside the block.
        unsafe {
            (&mut *(base as *mut Header), std::slice::from_raw_parts_mut(base.add(slots_at()) as *mut Slot, self.slots))
        }
    }

    unsafe fn parts_ref<'a>(self, base: *const u8) -> Self::Ref<'a> {
        // SAFETY: as `parts_mut`; nothing here writes.
        unsafe {
            (&*(base as *const Header), std::slice::from_raw_parts(base.add(slots_at()) as *const Slot, self.slots))
        }
    }
}

static mut SHARED: Option<Region<Layout>> = None;

thread_local! {
    /// This backend's database's slot, once found (a backend never changes database).
    static MINE: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    /// Ask the launcher for this database's worker when the transaction commits.
    static REQUEST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// This transaction made this database's worker step aside: it may come back when the
    /// transaction ends, however it ends.
    static RESUME: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// This transaction copies rows into queen's tables (`copy_in_begins`).
    static RESTORING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn slot_count() -> usize {
    settings::max_databases()
}

fn slots_at() -> usize {
    std::mem::size_of::<Header>().next_multiple_of(8)
}

pub fn shmem_size() -> usize {
    slots_at() + slot_count() * std::mem::size_of::<Slot>()
}

/// Sets up the database slots (or attaches to them): `hooks` calls this once per process.
///
/// # Safety
/// The block given points at `shmem_size()` bytes of shared memory named for this part, fresh when
/// `!found`; the caller holds AddinShmemInitLock while shared memory is set up, once per
/// process.
pub unsafe fn shmem_init((base, found): (*mut u8, bool)) {
    let n = slot_count();
    // SAFETY: the tranche was requested in the shmem request hook.
    let lock = unsafe { &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock };
    // SAFETY: `base` points at shmem_size() bytes laid out by `Layout`, fresh when !found;
    // the caller holds AddinShmemInitLock, so nobody else touches them yet, and SHARED is
    // written here once per process, before any query runs.
    unsafe {
        let region = Region::new(lock, base, Layout { slots: n });
        if !found {
            let (h, slots) = region.parts_for_format();
            *h = Header { slots: n as u32, launcher_pid: 0, launcher_latch: 0 };
            slots.fill(Slot::default());
        }
        SHARED = Some(region);
    }
}

pub fn enabled() -> bool {
    // SAFETY: SHARED is written once per process, before any query runs.
    unsafe { (*std::ptr::addr_of!(SHARED)).is_some() }
}

fn shared() -> &'static Region<Layout> {
    // SAFETY: SHARED is set once per process before any query runs; callers check enabled().
    unsafe { (*std::ptr::addr_of!(SHARED)).as_ref().expect("queen databases: shared memory not set up") }
}

/// Runs `f` on the header and the slots, under the lock held exclusively. `f` is pure
/// Rust; the lock is released even if it panics (`shmem::Region`).
fn with_slots<R>(f: impl FnOnce(&mut Header, &mut [Slot]) -> R) -> R {
    shared().exclusive(|(h, slots)| f(h, slots))
}

/// Runs `f` on the header and the slots, read only, under the lock held in shared mode.
fn read_slots<R>(f: impl FnOnce(&Header, &[Slot]) -> R) -> R {
    shared().share(|(h, slots)| f(h, slots))
}

fn find_or_take(slots: &mut [Slot], database: u32) -> Option<usize> {
    if let Some(i) = slots.iter().position(|s| s.database == database) {
        return Some(i);
    }
    let i = slots.iter().position(|s| s.database == 0)?;
    slots[i] = Slot { database, ..Slot::default() };
    Some(i)
}

/// The current database's OID.
pub fn my_database() -> u32 {
    // SAFETY: a plain read of this backend's database id.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// Runs `f` on the current database's slot (taking one when it has none). A database
/// beyond `queen.max_databases` is an ERROR (53400).
pub fn mine<R>(f: impl FnOnce(&mut Slot) -> R) -> R {
    let db = my_database();
    let cached = MINE.with(|m| m.get());
    let out = with_slots(|_, slots| {
        let i = match cached.filter(|&i| slots[i].database == db) {
            Some(i) => Some(i),
            None => find_or_take(slots, db),
        }?;
        Some((i, f(&mut slots[i])))
    });
    match out {
        Some((i, r)) => {
            MINE.with(|m| m.set(Some(i)));
            r
        }
        None => errors::raise(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            "queen: every database slot is taken (queen.max_databases); raise it in postgresql.conf (takes a restart)"
                .to_string(),
        ),
    }
}

/// Runs `f` on the slot of `database` if it has one (or, with `take`, after taking one);
/// None when it has none (and none is free).
pub fn with<R>(database: u32, take: bool, f: impl FnOnce(&mut Slot) -> R) -> Option<R> {
    with_slots(|_, slots| {
        let i =
            if take { find_or_take(slots, database)? } else { slots.iter().position(|s| s.database == database)? };
        Some(f(&mut slots[i]))
    })
}

/// A copy of every slot in use.
pub fn all() -> Vec<Slot> {
    read_slots(|_, slots| slots.iter().filter(|s| s.database != 0).copied().collect())
}

/// Frees the slot of a database that no longer exists.
pub fn free(database: u32) {
    with_slots(|_, slots| {
        if let Some(s) = slots.iter_mut().find(|s| s.database == database) {
            *s = Slot::default();
        }
    });
}

/// Frees the slot of a database where the worker found queen not installed, unless
/// something took it up meanwhile: a start requested (`CREATE EXTENSION` committed), a
/// pause under way, acks in flight, or a worker other than `dead_pid` (the one that
/// found queen absent, which has exited). Returns whether it was freed.
pub fn free_if_absent(database: u32, dead_pid: i32, now: i64) -> bool {
    with_slots(|_, slots| {
        let Some(s) = slots.iter_mut().find(|s| s.database == database) else { return false };
        let idle = s.absent_at != 0
            && s.requested == 0
            && s.prepared_request == 0
            && s.paused_until <= now
            && s.journal.writers == [0, 0]
            && (s.worker_pid == 0 || s.worker_pid == dead_pid);
        if idle {
            *s = Slot::default();
        }
        idle
    })
}

/// At `PREPARE TRANSACTION` (before it: `hooks`): a request made by
/// `request_worker_on_commit` waits for the prepared transaction's end, which a commit
/// callback of this session will not see (`COMMIT PREPARED` may come from any session).
/// The launcher looks at its outcome (`settle_prepared`). Raises nothing: a database
/// without a slot (all taken) gets no worker.
pub fn prepare() {
    if !REQUEST.with(|r| r.replace(false)) || !enabled() {
        return;
    }
    // SAFETY: a plain read of the transaction's xid (CREATE EXTENSION assigned one).
    let xid = unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner();
    if xid != 0 {
        with(my_database(), true, |s| {
            s.prepared_request = xid;
            s.absent_at = 0;
        });
    }
}

/// The launcher, each round: a prepared transaction that asked for a worker and has
/// committed since turns into a request; one that rolled back is forgotten. Returns
/// whether a request was made.
pub fn settle_prepared() -> bool {
    let pending: Vec<(u32, u32)> = with_slots(|_, slots| {
        slots
            .iter()
            .filter(|s| s.database != 0 && s.prepared_request != 0)
            .map(|s| (s.database, s.prepared_request))
            .collect()
    });
    let mut requested = false;
    for (database, xid) in pending {
        // SAFETY: plain reads of a transaction's status; `xid` is a normal xid that a
        // prepared transaction of this server held.
        let (running, committed) = unsafe {
            let x = pg_sys::TransactionId::from_inner(xid);
            (pg_sys::TransactionIdIsInProgress(x), pg_sys::TransactionIdDidCommit(x))
        };
        if running {
            continue;
        }
        with(database, false, |s| {
            if s.prepared_request == xid {
                s.prepared_request = 0;
                if committed {
                    s.requested = 1;
                    s.absent_at = 0;
                }
            }
        });
        requested |= committed;
    }
    requested
}

/// The launcher registers itself, so that requests can wake it (`wake_launcher` sets the
/// latch from any process).
///
/// # Safety
/// `latch` is the calling process's own latch (its PGPROC's, in shared memory), or null
/// with `pid` 0; the process takes it back (`set_launcher(0, null)`) before it exits.
pub unsafe fn set_launcher(pid: i32, latch: *mut pg_sys::Latch) {
    with_slots(|h, _| {
        h.launcher_pid = pid;
        h.launcher_latch = latch as usize;
    });
}

/// Wakes the launcher (it looks at every database again). Raises nothing.
pub fn wake_launcher() {
    let latch = read_slots(|h, _| h.launcher_latch);
    if latch != 0 {
        // SAFETY: the launcher's own latch, in shared memory (its PGPROC's), set by
        // `set_launcher`; SetLatch may be called from any process and raises nothing.
        unsafe { pg_sys::SetLatch(latch as *mut pg_sys::Latch) };
    }
}

/// This transaction created or updated the extension: when it commits, the launcher
/// starts this database's worker (or lets the running one see the new version).
pub fn request_worker_on_commit() {
    if enabled() {
        REQUEST.with(|r| r.set(true));
    }
}

/// The worker this transaction made step aside (`worker::leave_database`) may come back
/// once the transaction ends.
pub fn resume_at_transaction_end() {
    if enabled() {
        RESUME.with(|r| r.set(true));
    }
}

/// At commit (`hooks`): hands over a request made by `request_worker_on_commit`, and lets
/// a worker this transaction made step aside come back. Raises nothing: a database without
/// a slot (all taken) gets no worker.
pub fn on_commit() {
    let request = REQUEST.with(|r| r.replace(false));
    let resume = RESUME.with(|r| r.replace(false));
    if !(request || resume) || !enabled() {
        return;
    }
    let db = my_database();
    let taken = with(db, request, |s| {
        if request {
            s.requested = 1;
            s.absent_at = 0;
        }
        if resume {
            s.paused_until = 0;
        }
    });
    if taken.is_some() {
        wake_launcher();
    }
}

/// At abort: no request; a worker this transaction made step aside comes back.
pub fn on_abort() {
    REQUEST.with(|r| r.set(false));
    if RESUME.with(|r| r.replace(false)) && enabled() && with(my_database(), false, |s| s.paused_until = 0).is_some() {
        wake_launcher();
    }
}

/// Records a pass of the current database's worker: it ended at `now`, with or without
/// an error.
pub fn record_pass(pass: Pass, ok: bool, now: i64) {
    if !enabled() {
        return;
    }
    mine(|s| {
        let p = &mut s.passes[pass as usize];
        p.runs += 1;
        if p.first == 0 {
            p.first = now;
        }
        if ok {
            p.last_ok = now;
        } else {
            p.errors += 1;
            p.last_error = now;
        }
    });
}

/// This transaction copies rows into queen's tables (`COPY queen.x FROM`, as a restore of a
/// dump does, table after table): until it ends, and for `RESTORE_QUIET_MICROS` after the
/// last such transaction of the database ends, its worker stays away, since the tables
/// may hold only part of a dump (compaction would take offsets whose segments are not
/// copied yet for gaps, and retention or the removal of idle partitions would act on
/// cursors and partitions not copied yet). Returns true the first time in a transaction:
/// the caller then makes a running worker leave. Raises nothing; a database without a
/// slot (all taken) has no worker to keep away.
pub fn copy_in_begins() -> bool {
    if !enabled() || RESTORING.with(|r| r.get()) {
        return false;
    }
    let counted = with(my_database(), true, |s| s.restoring += 1).is_some();
    RESTORING.with(|r| r.set(counted));
    counted
}

/// At the end of a transaction (`hooks`, first of all, so that nothing before it can leave
/// the count up): one that copied into queen's tables is no longer in flight, and the
/// last one starts the quiet time (never shortening a pause already longer, such as the
/// minute `worker::leave_database` set when the copy began; but a restore in one
/// transaction with its `CREATE EXTENSION` lets the worker back at its commit, `on_commit`:
/// everything is there then). Returns whether this transaction was such a copy. Raises
/// nothing.
pub fn copy_in_ends() -> bool {
    if !RESTORING.with(|r| r.replace(false)) || !enabled() {
        return false;
    }
    let quiet_until = crate::pg::clock::clock_now() + RESTORE_QUIET_MICROS;
    with(my_database(), false, |s| {
        s.restoring = s.restoring.saturating_sub(1);
        s.restored = 1;
        if s.restoring == 0 {
            s.paused_until = s.paused_until.max(quiet_until);
        }
    });
    true
}

/// For a starting worker: whether rows were copied into queen's tables since the last
/// worker started (the flag is cleared).
pub fn take_restored(database: u32) -> bool {
    enabled() && with(database, false, |s| std::mem::take(&mut s.restored) != 0).unwrap_or(false)
}

/// Whether a `pg_dump` is connected to the current database (`queen._dump_running()`, which
/// says why the generations' rotation and the lane journal's emptying wait for it).
pub fn dump_running(client: &mut pgrx::spi::SpiClient<'_>) -> bool {
    crate::pg::spi::first_value::<bool>(crate::pg::spi::run(client, "SELECT queen._dump_running()", &[]))
        .unwrap_or(false)
}
