//! Lane state without row versions: the shared-memory side of `queen_core::lanes`.
//!
//! With `shared_preload_libraries = 'queen'`, a lane's cursor, retry budget and lease live
//! in the registry (`queen_core::lanes`), so pops and acks write no row version that a
//! long transaction could pin:
//!
//! - a pop locks the lanes it claims in the registry and sets their lease: it writes
//!   nothing to the database;
//! - an ack changes the cursor in the registry and appends the new cursor and retry count
//!   to the lane journal (`queen.lane_journal_0` / `_1`), in its own transaction;
//! - every couple of seconds the background worker empties the journal table no ack
//!   writes to any more, with TRUNCATE (which a long transaction does not hold back),
//!   after copying into `queen.lanes` each lane's newest entry in it, unless the other
//!   table holds one at least as new (`rotate_journal`): a lane acked all the time gets
//!   no row version, one that goes quiet gets one;
//! - a clean stop of the worker copies the whole journal into `queen.lanes`.
//!
//! After a crash the registry is rebuilt, lane by lane on first use, from `queen.lanes`
//! and the newest journal entry: every committed ack is there. Leases are not: their
//! messages are delivered again (at-least-once delivery allows it).
//!
//! A transaction that changes a lane holds it until it ends, like a row lock, and an abort
//! (of the transaction, or of the subtransaction that changed it) puts back the state it
//! found. Another pop skips a held lane; another ack or extension waits for the holder's
//! transaction (PostgreSQL's deadlock detector sees that wait).
//!
//! Without preloading there is no registry and `queen.lanes` / `queen.leases` hold
//! everything, as before (see `pop`, `ack`, `leases`).

use std::cell::{Cell, RefCell};
use std::ffi::CStr;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::PgSqlErrorCode;
use queen_core::lanes::{
    group_hash, Busy, Header, Holder, LaneKey, LaneSlot, Layout, LeaseInfo, LeaseSlot, Load, Registry, Seen, State,
    View,
};

use crate::errors::{self, SpiExt};
use crate::shmem::{owner, subxact};
use crate::spi::run;

pub const TRANCHE: &CStr = c"queen lanes";

static TRACKED_LANES: GucSetting<i32> = GucSetting::<i32>::new(16_384);
static MAX_LEASES: GucSetting<i32> = GucSetting::<i32>::new(8_192);

/// The journal's state in shared memory, beside the registry.
#[repr(C)]
#[derive(Default)]
struct Journal {
    /// Acks append to `queen.lane_journal_{current % 2}`.
    current: u64,
    /// Acks in flight (not yet ended) per journal table.
    writers: [u32; 2],
    /// The table not written to has been emptied since it was retired.
    other_empty: u32,
}

struct Shared {
    lock: *mut pg_sys::LWLock,
    base: *mut u8,
    layout: Layout,
}

static mut SHARED: Option<Shared> = None;

/// One lane this transaction holds or changed, for the end of the transaction.
struct Held {
    key: LaneKey,
    /// The subtransaction that saved `found`.
    subxact: u32,
    /// The state before this subtransaction's first change: restored on abort.
    found: State,
    /// This entry took the lock (its abort releases it).
    locked: bool,
    /// The queue and group of `found`'s lease, to recreate it if an aborted ack ended it.
    lease: Option<(i64, String)>,
}

thread_local! {
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
    /// The journal table this transaction wrote to, if any.
    static WROTE: Cell<Option<usize>> = const { Cell::new(None) };
    static LOADING: Cell<Option<LaneKey>> = const { Cell::new(None) };
    /// (The worker) queen.leases holds nothing from a version without the registry.
    static OLD_LEASES_GONE: Cell<bool> = const { Cell::new(false) };
    /// Lanes this transaction removed (`drop_group`), with the subtransaction that did:
    /// the registry forgets them when it commits.
    static FORGET: RefCell<Vec<(u32, LaneKey)>> = const { RefCell::new(Vec::new()) };
}

/// The registry forgets these lanes if, and when, the current transaction commits (their
/// rows are deleted in it; until then the lanes stay, locked by it).
pub fn forget_on_commit(keys: Vec<LaneKey>) {
    if !enabled() {
        return;
    }
    let sub = subxact();
    FORGET.with(|f| f.borrow_mut().extend(keys.into_iter().map(|k| (sub, k))));
}

/// Called from `_PG_init` while preloading: the sizes of shared memory.
pub fn init() {
    // SAFETY: a plain read of a flag the postmaster sets while preloading libraries.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    GucRegistry::define_int_guc(
        c"queen.tracked_lanes",
        c"Lanes (partition x consumer group) whose cursor and lease queen keeps in shared memory at once.",
        c"An idle lane beyond this is dropped and read back from the database when used again.",
        &TRACKED_LANES,
        16,
        1 << 22,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"queen.max_leases",
        c"Live leases (one per pop that claimed something) queen keeps at once.",
        c"Past it, expired leases make room; a pop that finds no room fails with SQLSTATE 53400.",
        &MAX_LEASES,
        16,
        1 << 22,
        GucContext::Postmaster,
        GucFlags::default(),
    );
}

fn layout() -> Layout {
    Layout::new(TRACKED_LANES.get() as usize, MAX_LEASES.get() as usize)
}

fn journal_at(l: Layout) -> usize {
    l.size().next_multiple_of(8)
}

/// Bytes of shared memory the registry and the journal's state take.
pub fn shmem_size() -> usize {
    journal_at(layout()) + std::mem::size_of::<Journal>()
}

/// Formats the registry (or attaches to it): `shmem` calls this once per process.
pub fn shmem_init((base, found): (*mut u8, bool)) {
    let layout = layout();
    // SAFETY: the tranche was requested in the shmem request hook; `base` points at
    // shmem_size() bytes, fresh when !found, and the caller holds AddinShmemInitLock.
    unsafe {
        let lock = &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock;
        SHARED = Some(Shared { lock, base, layout });
        if !found {
            let (h, lanes, leases, journal) = parts(base, layout);
            Registry::format(h, lanes, leases, TRACKED_LANES.get() as usize, MAX_LEASES.get() as usize);
            *journal = Journal { other_empty: 1, ..Journal::default() };
        }
    }
}

/// The registry's parts inside its block.
///
/// SAFETY (for callers): `base` is the block laid out by `l`, and the caller holds the
/// lock in a mode that fits what it does with the parts.
#[allow(clippy::type_complexity)]
unsafe fn parts<'a>(
    base: *mut u8,
    l: Layout,
) -> (&'a mut Header, &'a mut [LaneSlot], &'a mut [LeaseSlot], &'a mut Journal) {
    // SAFETY: every part lies inside the block Layout sized, 8-byte aligned, disjoint.
    unsafe {
        (
            &mut *(base as *mut Header),
            std::slice::from_raw_parts_mut(base.add(l.lanes_at()) as *mut LaneSlot, l.lanes),
            std::slice::from_raw_parts_mut(base.add(l.leases_at()) as *mut LeaseSlot, l.leases),
            &mut *(base.add(journal_at(l)) as *mut Journal),
        )
    }
}

/// True when the registry exists (the library was preloaded).
pub fn enabled() -> bool {
    // SAFETY: SHARED is written once per process, before any query runs.
    unsafe { (*std::ptr::addr_of!(SHARED)).is_some() }
}

fn shared() -> &'static Shared {
    // SAFETY: as in `enabled`; callers check `enabled` first.
    unsafe { (*std::ptr::addr_of!(SHARED)).as_ref().expect("queen lanes: shared memory not set up") }
}

fn with_registry<R>(f: impl FnOnce(&mut Registry<'_>, &mut Journal) -> R) -> R {
    let s = shared();
    // SAFETY: our tranche's lock, held exclusively; the parts lie in the block it guards,
    // and `f` is pure Rust that raises no ERROR.
    unsafe {
        crate::shmem::locked(s.lock, pg_sys::LWLockMode::LW_EXCLUSIVE, || {
            let (h, lanes, leases, journal) = parts(s.base, s.layout);
            f(&mut Registry::new(h, lanes, leases), journal)
        })
    }
}

fn with_view<R>(f: impl FnOnce(&View<'_>) -> R) -> R {
    let s = shared();
    // SAFETY: as `with_registry`; readers only read, under the lock in shared mode.
    unsafe {
        crate::shmem::locked(s.lock, pg_sys::LWLockMode::LW_SHARED, || {
            let (h, lanes, leases, _) = parts(s.base, s.layout);
            f(&View::new(h, lanes, leases))
        })
    }
}

fn me() -> Holder {
    // SAFETY: MyProc is this backend's PGPROC, set for every backend.
    let (backend, lxid) = unsafe { ((*pg_sys::MyProc).backendId, (*pg_sys::MyProc).lxid) };
    Holder { owner: owner(), vxid_backend: backend, vxid_local: lxid }
}

fn full(what: &str) -> ! {
    errors::raise(
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!("queen: {what}; raise it in postgresql.conf (takes a restart)"),
    )
}

/// The key of a lane.
pub fn key(partition_id: pgrx::Uuid, group: &str) -> LaneKey {
    LaneKey { partition: *partition_id.as_bytes(), group: group_hash(group) }
}

/// A lane's state as this transaction sees it (loading it first if needed), and whether
/// another transaction holds it. A lane that does not exist (no row: its group was
/// dropped) reads as held, with no lease: nothing may claim it.
pub fn view(partition_id: pgrx::Uuid, group: &str) -> (State, bool) {
    let k = key(partition_id, group);
    let mine = owner();
    loop {
        match with_view(|v| v.lane(&k)) {
            Seen::Ready(s, h) => return (s, h.is_some_and(|h| h.owner != mine)),
            Seen::Loading => wait_a_moment(),
            Seen::Unknown => {
                if !load(partition_id, group) {
                    return (State::default(), true);
                }
            }
        }
    }
}

/// A lease's queue, group and lanes, if some lane still holds it.
pub fn lease(lease_id: pgrx::Uuid) -> Option<LeaseInfo> {
    if let Some(info) = with_view(|v| v.lease(lease_id.as_bytes())) {
        return Some(info);
    }
    // A lease taken by a version without the registry (before an upgrade) is in
    // queen.leases, and its lanes' rows carry it: loading them takes it over while live.
    let (group, pids) = Spi::connect_mut(|client| {
        let rows = run(
            client,
            "SELECT consumer_group, partition_ids FROM queen.leases WHERE lease_id = $1 AND expires_at > now()",
            &[lease_id.into()],
        );
        let r = rows.into_iter().next()?;
        let group: String = r.get(1).or_raise()?;
        let pids: Vec<pgrx::Uuid> = r.get(2).or_raise()?;
        Some((group, pids))
    })?;
    for pid in pids {
        view(pid, &group);
    }
    with_view(|v| v.lease(lease_id.as_bytes()))
}

fn wait_a_moment() {
    // SAFETY: a plain sleep; interrupts are checked right after.
    unsafe { pg_sys::pg_usleep(100) };
    pgrx::check_for_interrupts!();
}

/// Brings a lane into the registry from the database: `queen.lanes`, and the newest
/// journal entry, if one is newer. False when the lane has no row (it never existed, or
/// its group was dropped): then nothing is loaded.
fn load(partition_id: pgrx::Uuid, group: &str) -> bool {
    let k = key(partition_id, group);
    let me = owner();
    match with_registry(|r, _| r.begin_load(&k, me, crate::clock::clock_now())) {
        Load::Ready => {}
        Load::Loading => wait_a_moment(),
        Load::Full => full("every tracked lane is in use (queen.tracked_lanes)"),
        Load::Mine => {
            LOADING.with(|l| l.set(Some(k)));
            let Some((state, queue_id)) = Spi::connect_mut(|client| stored(client, partition_id, group)) else {
                with_registry(|r, _| r.abandon_load(&k, me));
                LOADING.with(|l| l.set(None));
                return false;
            };
            // SAFETY: a plain read of the current database's id.
            let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
            let now = crate::clock::clock_now();
            with_registry(|r, _| r.finish_load(&k, me, state, Some((queue_id, group)), db, now));
            LOADING.with(|l| l.set(None));
        }
    }
    true
}

/// A lane's stored state: its cursor, retry count and journal number (from `queen.lanes`,
/// or the newest journal entry when it is newer), the lease the row still carries from a
/// version without the registry (taken over if live), and the lane's queue.
fn stored(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid, group: &str) -> Option<(State, i64)> {
    // With a snapshot taken now: a REPEATABLE READ transaction's own may predate acks.
    let row = crate::spi::first_row_now(
        client,
        "SELECT l.queue_id, l.lease_id,
                (extract(epoch FROM l.lease_expires_at - '2000-01-01 UTC') * 1000000)::int8,
                l.batch_end, l.claim_start, l.attempt_count, j.committed, j.retry_count, j.seq
           FROM queen.lanes l
          CROSS JOIN LATERAL (
             SELECT x.committed, x.retry_count, x.seq FROM (
               SELECT l.committed, l.batch_retry_count AS retry_count, l.journal_seq AS seq
               UNION ALL
               (SELECT committed, retry_count, seq FROM queen.lane_journal_0
                 WHERE partition_id = $1 AND consumer_group = $2 ORDER BY seq DESC LIMIT 1)
               UNION ALL
               (SELECT committed, retry_count, seq FROM queen.lane_journal_1
                 WHERE partition_id = $1 AND consumer_group = $2 ORDER BY seq DESC LIMIT 1)
             ) x ORDER BY x.seq DESC LIMIT 1) j
          WHERE l.partition_id = $1 AND l.consumer_group = $2",
        &[partition_id.into(), group.into()],
        |r| {
            let lease: Option<pgrx::Uuid> = r.get(2);
            let state = State {
                committed: r.get(7).unwrap_or(0),
                retry_count: r.get(8).unwrap_or(0),
                journal_seq: r.get(9).unwrap_or(0),
                lease_id: lease.map_or([0; 16], |l| *l.as_bytes()),
                lease_expires: r.get(3).unwrap_or(0),
                batch_end: r.get(4).unwrap_or(0),
                claim_start: r.get(5).unwrap_or(0),
                attempt_count: r.get(6).unwrap_or(0),
                last_claimed: 0,
            };
            (state, r.get(1).unwrap_or(0))
        },
    );
    row
}

/// Locks a lane for this transaction; `wait`: wait for another holder (else None when
/// held). Returns the state this transaction sees.
pub fn lock(partition_id: pgrx::Uuid, group: &str, wait: bool) -> Option<State> {
    let k = key(partition_id, group);
    let holder = me();
    let sub = subxact();
    loop {
        let locked = with_registry(|r, _| {
            r.lock(&k, holder).map(|(s, took)| (s, took, s.has_lease().then(|| r.lease_queue(&s.lease_id)).flatten()))
        });
        match locked {
            Ok((s, took, queue)) => {
                remember(k, sub, s, took, queue.map(|q| (q, group.to_string())));
                return Some(s);
            }
            Err(Busy::Unknown) => {
                if !load(partition_id, group) {
                    return None; // no such lane (its group was dropped)
                }
            }
            Err(Busy::Loading) => wait_a_moment(),
            Err(Busy::Held(_)) if !wait => return None,
            Err(Busy::Held(h)) => {
                let vxid = pg_sys::VirtualTransactionId { backendId: h.vxid_backend, localTransactionId: h.vxid_local };
                // SAFETY: waits, in the lock manager (so deadlocks are detected), for that
                // virtual transaction to end; returns at once if it already has.
                unsafe { pg_sys::VirtualXactLock(vxid, true) };
                pgrx::check_for_interrupts!();
            }
        }
    }
}

/// Keeps what an abort of the current subtransaction must restore.
fn remember(k: LaneKey, sub: u32, found: State, locked: bool, lease: Option<(i64, String)>) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if locked || !h.iter().any(|e| e.key == k && e.subxact == sub) {
            h.push(Held { key: k, subxact: sub, found, locked, lease });
        }
    });
}

impl Held {
    fn lease(&self) -> Option<(i64, &str)> {
        self.lease.as_ref().map(|(q, g)| (*q, g.as_str()))
    }
}

/// Sets the state of a lane this transaction holds. `lease`: the queue and group of a new
/// lease. A change of cursor or retry count takes `journal_seq + 1` (see `journal`).
pub fn set(partition_id: pgrx::Uuid, group: &str, state: State, lease: Option<(i64, &str)>) {
    let k = key(partition_id, group);
    let (mine, now) = (owner(), crate::clock::clock_now());
    if !with_registry(|r, _| r.set(&k, mine, state, lease, now)) {
        full("every lease slot holds a live lease (queen.max_leases)");
    }
}

/// The journal table an ack of this transaction appends to (counted as a writer until the
/// transaction ends, so that the worker does not empty it under the ack).
pub fn journal_table() -> usize {
    if let Some(t) = WROTE.with(|w| w.get()) {
        return t;
    }
    let t = with_registry(|_, j| {
        let t = (j.current % 2) as usize;
        j.writers[t] += 1;
        t
    });
    WROTE.with(|w| w.set(Some(t)));
    t
}

/// Appends lanes' new cursors and retry counts to the journal (directly, or in one
/// statement when the table is not one `heap::insert_rows` can write).
pub fn journal(client: &mut SpiClient<'_>, group: &str, rows: &[(pgrx::Uuid, State)]) {
    if rows.is_empty() {
        return;
    }
    let table = journal_table();
    // Directly (`heap`): an INSERT through SPI cost a fifth of an ack of one message.
    let group_datum = group.into_datum().expect("text is never NULL");
    let direct = rows.iter().map(|(pid, s)| {
        [
            pid.into_datum().expect("a uuid is never NULL"),
            group_datum,
            pg_sys::Datum::from(s.journal_seq),
            pg_sys::Datum::from(s.committed),
            pg_sys::Datum::from(s.retry_count),
        ]
    });
    let relid = crate::catalog::queen_table(if table == 0 { c"lane_journal_0" } else { c"lane_journal_1" });
    let types = [pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::INT8OID, pg_sys::INT8OID, pg_sys::INT4OID];
    if crate::heap::insert_rows(relid, types, direct) {
        return;
    }
    let pids: Vec<pgrx::Uuid> = rows.iter().map(|r| r.0).collect();
    let seqs: Vec<i64> = rows.iter().map(|r| r.1.journal_seq).collect();
    let committed: Vec<i64> = rows.iter().map(|r| r.1.committed).collect();
    let retries: Vec<i32> = rows.iter().map(|r| r.1.retry_count).collect();
    let args = [pids.into(), group.into(), seqs.into(), committed.into(), retries.into()];
    if table == 0 {
        run(
            client,
            "INSERT INTO queen.lane_journal_0 (partition_id, consumer_group, seq, committed, retry_count)
             SELECT u.p, $2, u.s, u.c, u.r FROM unnest($1::uuid[], $3::int8[], $4::int8[], $5::int4[]) AS u(p, s, c, r)",
            &args,
        );
    } else {
        run(
            client,
            "INSERT INTO queen.lane_journal_1 (partition_id, consumer_group, seq, committed, retry_count)
             SELECT u.p, $2, u.s, u.c, u.r FROM unnest($1::uuid[], $3::int8[], $4::int8[], $5::int4[]) AS u(p, s, c, r)",
            &args,
        );
    }
}

// ---- the end of a transaction ----

/// This transaction holds lanes in the registry or wrote to the journal: it cannot be
/// prepared (a prepared transaction has no backend left to release them).
pub fn in_use() -> bool {
    HELD.with(|h| !h.borrow().is_empty()) || WROTE.with(|w| w.get().is_some())
}

/// Commit: releases every lane this transaction holds. Abort: puts back what it found.
pub fn end(committed: bool) {
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    let wrote = WROTE.with(|w| w.take());
    let loading = LOADING.with(|l| l.take());
    let forget: Vec<LaneKey> = FORGET.with(|f| std::mem::take(&mut *f.borrow_mut())).into_iter().map(|e| e.1).collect();
    if (held.is_empty() && wrote.is_none() && loading.is_none() && forget.is_empty()) || !enabled() {
        return;
    }
    let (mine, now) = (owner(), crate::clock::clock_now());
    with_registry(|r, j| {
        // Newest first, so that an older save of the same lane is restored last.
        for e in held.iter().rev() {
            if committed {
                if e.locked {
                    r.unlock(&e.key, mine, None);
                }
            } else if e.locked {
                r.unlock_restoring(&e.key, mine, e.found, e.lease(), now);
            }
        }
        if let Some(t) = wrote {
            j.writers[t] = j.writers[t].saturating_sub(1);
        }
        if let Some(k) = loading {
            r.abandon_load(&k, mine);
        }
        if committed {
            r.forget(&forget);
        }
    });
}

/// A subtransaction aborted: its changes are put back, and the locks it took released.
pub fn end_subxact(sub: u32, parent: u32, committed: bool) {
    if !enabled() {
        return;
    }
    if let Some(k) = LOADING.with(|l| l.take()).filter(|_| !committed) {
        let mine = owner();
        with_registry(|r, _| r.abandon_load(&k, mine));
    }
    FORGET.with(|f| {
        let mut f = f.borrow_mut();
        if committed {
            f.iter_mut().filter(|e| e.0 >= sub).for_each(|e| e.0 = parent);
        } else {
            f.retain(|e| e.0 < sub);
        }
    });
    let undo: Vec<Held> = HELD.with(|h| {
        let mut h = h.borrow_mut();
        if committed {
            for e in h.iter_mut().filter(|e| e.subxact >= sub) {
                e.subxact = parent;
            }
            Vec::new()
        } else {
            let (undo, keep): (Vec<Held>, Vec<Held>) =
                std::mem::take(&mut *h).into_iter().partition(|e| e.subxact >= sub);
            *h = keep;
            undo
        }
    });
    if undo.is_empty() {
        return;
    }
    let (mine, now) = (owner(), crate::clock::clock_now());
    with_registry(|r, _| {
        for e in undo.iter().rev() {
            if e.locked {
                r.unlock_restoring(&e.key, mine, e.found, e.lease(), now);
            } else {
                // Locked by the parent: put back what this subtransaction found, keep the lock.
                r.restore(&e.key, mine, e.found, e.lease(), now);
            }
        }
    });
}

// ---- emptying the journal (the background worker; a clean stop saves it whole with
// `lane_rows::save_journal`) ----

/// What a round of the journal's rotation did, for `rotated` once its transaction commits.
#[derive(Default)]
pub struct Rotation {
    /// The retired table was emptied.
    emptied: bool,
    /// The registry's unsaved lanes when the round began: each one's newest entry is now
    /// in `queen.lanes` or in the current table.
    saved: Vec<(LaneKey, State)>,
}

/// One round of the journal's rotation (in the worker's transaction): when the idle table
/// is empty, make it current; once no ack writes to the retired one any more, empty it
/// (`queen._empty_journal`: it copies each lane's newest entry into `queen.lanes` first,
/// unless the current table holds one at least as new, then TRUNCATEs; without waiting for
/// a lock: else next round). Everything the journal held is thus in `queen.lanes` or in
/// the current table, whatever the registry knows (after a restart it knows nothing), so
/// a lane acked all the time never updates its row, and one that goes quiet does once.
pub fn rotate_journal(client: &mut SpiClient<'_>) -> Rotation {
    // Leases a version without the registry left in queen.leases: gone once expired (the
    // registry never writes there), then not looked at again.
    if !OLD_LEASES_GONE.with(|g| g.get()) {
        let left = run(
            client,
            "WITH d AS (DELETE FROM queen.leases WHERE expires_at < now() RETURNING 1)
             SELECT (SELECT count(*) FROM queen.leases) - (SELECT count(*) FROM d)",
            &[],
        );
        OLD_LEASES_GONE.with(|g| g.set(crate::spi::first_value::<i64>(left) == Some(0)));
    }
    let (retired, writers, other_empty) = with_registry(|_, j| {
        let retired = ((j.current + 1) % 2) as usize;
        (retired, j.writers[retired], j.other_empty)
    });
    if other_empty == 1 {
        with_registry(|_, j| {
            j.current += 1;
            j.other_empty = 0;
        });
        return Rotation::default(); // the table just retired may still have writers: next round
    }
    if writers > 0 {
        return Rotation::default();
    }
    // SAFETY: a plain read of the current database's id.
    let db = unsafe { pg_sys::MyDatabaseId }.to_u32();
    // Taken before the copy: every state listed has committed, so its entry is copied.
    let saved = with_registry(|r, _| r.dirty(db));
    let emptied = run(client, "SELECT queen._empty_journal($1)", &[(retired as i32).into()]);
    let emptied = crate::spi::first_value::<bool>(emptied).unwrap_or(false);
    Rotation { emptied, saved: if emptied { saved } else { Vec::new() } }
}

/// After the rotation round's transaction committed: the emptied table may become current
/// next round, and the lanes saved may be evicted (a reload finds their state).
pub fn rotated(done: Rotation) {
    if !done.emptied {
        return;
    }
    with_registry(|r, j| {
        for (k, s) in &done.saved {
            r.saved(k, s);
        }
        j.other_empty = 1;
    });
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._group_hash(text) IS
  'queen internal: the lane registry''s hash of a group name; not granted';
"#,
    name = "group_hash_sql_home",
    requires = [group_hash_sql]
);

/// `queen._group_hash(name)`: the lane registry's hash of a consumer group's name.
#[pg_extern(name = "_group_hash", immutable, parallel_safe)]
fn group_hash_sql(name: &str) -> Vec<u8> {
    group_hash(name).to_vec()
}

// ---- SQL helpers (internal, not granted) ----

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._lane(uuid, text, bigint, uuid, timestamptz, bigint, int, int) IS
  'queen internal: a lane''s live state (status, totals); not granted';
"#,
    name = "lane_sql_home",
    requires = [lane_sql]
);

/// `queen._lane(...)`: a lane's live state, for `status`, `totals` and `metrics`. With
/// the registry its state; without, the row's own columns (passed in). A lease expiry
/// without a lease is a retry backoff (`queen_core::lane`): returned as `retry_at`.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
#[pg_extern(name = "_lane", volatile, parallel_unsafe)]
fn lane_sql(
    partition_id: pgrx::Uuid,
    consumer_group: &str,
    committed: i64,
    lease_id: Option<pgrx::Uuid>,
    lease_expires_at: Option<pgrx::datum::TimestampWithTimeZone>,
    batch_end: Option<i64>,
    retry_count: i32,
    attempt_count: i32,
) -> TableIterator<
    'static,
    (
        name!(committed, i64),
        name!(lease_id, Option<pgrx::Uuid>),
        name!(lease_expires_at, Option<pgrx::datum::TimestampWithTimeZone>),
        name!(batch_end, Option<i64>),
        name!(retry_count, i32),
        name!(attempt_count, i32),
        name!(retry_at, Option<pgrx::datum::TimestampWithTimeZone>),
    ),
> {
    if !enabled() {
        let (expires, retry_at) = if lease_id.is_some() { (lease_expires_at, None) } else { (None, lease_expires_at) };
        return TableIterator::once((committed, lease_id, expires, batch_end, retry_count, attempt_count, retry_at));
    }
    let (s, _) = view(partition_id, consumer_group);
    let lane = queen_core::lane::Lane::from_registry(&s);
    let lease = lane.lease.map(|_| pgrx::Uuid::from_bytes(s.lease_id));
    TableIterator::once((
        s.committed,
        lease,
        lane.lease.map(|(_, expires)| crate::clock::timestamptz(expires)),
        lease.map(|_| s.batch_end),
        s.retry_count,
        s.attempt_count,
        lane.retry_at.map(crate::clock::timestamptz),
    ))
}

/// The registry forgets these lanes now (`delete_queue`, which holds its queue exclusively).
pub fn forget_now(keys: &[LaneKey]) {
    if enabled() {
        with_registry(|r, _| r.forget(keys));
    }
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._expire_lease(uuid) IS
  'queen internal: end a lease now, as if it had expired (tests); not granted';
"#,
    name = "expire_lease_sql_home",
    requires = [expire_lease_sql]
);

/// `queen._expire_lease(lease_id)`: ends a lease now, as if it had expired. Returns how
/// many lanes it held.
#[pg_extern(name = "_expire_lease", volatile)]
#[search_path(pg_catalog, pg_temp)]
fn expire_lease_sql(lease_id: pgrx::Uuid) -> i64 {
    let now = crate::clock::clock_now();
    if !enabled() {
        return Spi::connect_mut(|client| crate::lane_rows::expire_lease(client, lease_id, now));
    }
    let Some(info) = lease(lease_id) else { return 0 };
    let mut n = 0;
    for k in info.lanes {
        let pid = pgrx::Uuid::from_bytes(k.partition);
        if let Some(s) = lock(pid, &info.group, true) {
            if s.held_by(lease_id.as_bytes(), now) {
                set(pid, &info.group, State { lease_expires: now - 1, ..s }, None);
                n += 1;
            }
        }
    }
    n
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._claimable(uuid, text, bigint) IS
  'queen internal: a lane''s readable end when a pop may claim it (pop''s scan); not granted';
"#,
    name = "claimable_sql_home",
    requires = [claimable_sql]
);

/// `queen._claimable(partition_id, consumer_group, head)`: for a pop's scan of its lanes,
/// the partition's readable end when the lane can be claimed now (no live lease, no retry
/// backoff running, no other transaction holding it, messages past its cursor), else NULL.
/// A backoff's end is noted for a waiting pop (`wake::due_at`).
#[pg_extern(name = "_claimable", volatile, parallel_unsafe)]
fn claimable_sql(partition_id: pgrx::Uuid, consumer_group: &str, head: i64) -> Option<i64> {
    let (s, held) = view(partition_id, consumer_group);
    let now = crate::clock::clock_now();
    if held || s.live_lease(now) {
        return None;
    }
    let readable = crate::offsets::readable(partition_id, head);
    let lane = queen_core::lane::Lane::from_registry(&s);
    match lane.claimability(readable, now) {
        c if c.claimable() => Some(readable),
        queen_core::lane::Claimability::Backoff => {
            crate::wake::due_at(lane.retry_at.unwrap_or(now));
            None
        }
        _ => None,
    }
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._committed(uuid, text, bigint) IS
  'queen internal: a lane''s live cursor (retention); not granted';
"#,
    name = "committed_sql_home",
    requires = [committed_sql]
);

/// `queen._committed(partition_id, consumer_group, committed)`: a lane's live cursor (with
/// the registry; else the row's, passed in). For retention's floor.
#[pg_extern(name = "_committed", volatile, parallel_unsafe)]
fn committed_sql(partition_id: pgrx::Uuid, consumer_group: &str, committed: i64) -> i64 {
    if !enabled() {
        return committed;
    }
    view(partition_id, consumer_group).0.committed
}
