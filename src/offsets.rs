//! Offsets without a commit-long lock: the shared-memory side of
//! `queen_core::offsets` (the registry and its rules live there).
//!
//! With `shared_preload_libraries = 'queen'` a push reserves its offsets in the registry
//! and holds no row lock; concurrent pushes to one partition run and commit in parallel.
//! A pop reads only up to the partition's readable end (`readable`): everything up to it is
//! decided, so a pop never delivers offset k+1 while offset k may still commit. An aborted
//! push leaves a gap. The registry learns how a transaction ended from the transaction
//! callbacks below, which PostgreSQL runs after the transaction's rows became visible.
//!
//! A transaction that reserved offsets can be prepared (`PREPARE TRANSACTION`, as Citus
//! does to commit a transaction that wrote on two workers): its reservations then pass to
//! the prepared transaction (`Registry::prepare`) and stay in flight until `COMMIT
//! PREPARED` or `ROLLBACK PREPARED` ends them (`process_utility`), so readers stop before
//! them meanwhile. Should that hook miss one, the background worker ends it once its xid
//! is no longer in progress (`sweep_prepared`). A prepared transaction outlives a restart,
//! the registry does not: a partition loaded while a prepared transaction holds a lock on
//! queen's segment tables waits for that transaction first (`wait_for_prepared`), so that its
//! offsets are neither passed by readers nor reserved again.
//!
//! Without preloading there is no registry: a push reserves offsets by updating its
//! partition row and holds that row until it commits (pushes to one partition then commit
//! one at a time), and the readable end is the highest offset any committed segment holds.

use std::cell::Cell;
use std::ffi::CStr;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::PgSqlErrorCode;
use queen_core::offsets::{Header, Layout, Load, Record, Refusal, Registry, Seen, Slot, View};

use crate::errors;
use crate::shmem::{owner, subxact};

pub const TRANCHE: &CStr = c"queen";

static TRACKED_PARTITIONS: GucSetting<i32> = GucSetting::<i32>::new(16_384);
static RESERVATIONS: GucSetting<i32> = GucSetting::<i32>::new(32_768);

struct Shared {
    lock: *mut pg_sys::LWLock,
    base: *mut u8,
    layout: Layout,
}

static mut SHARED: Option<Shared> = None;

thread_local! {
    /// This backend holds reservations in the current transaction.
    static HOLDS: Cell<bool> = const { Cell::new(false) };
    /// The partition this backend is loading into the registry, if a load is under way.
    static LOADING: Cell<Option<[u8; 16]>> = const { Cell::new(None) };
    /// The xid whose reservations passed to a prepared-transaction owner at PRE_PREPARE,
    /// until the prepare is done (or fails, and they end as aborted).
    static PREPARING: Cell<Option<u32>> = const { Cell::new(None) };
}

static mut PREV_PROCESS_UTILITY: pg_sys::ProcessUtility_hook_type = None;

/// Called from `_PG_init`: the settings, and the transaction callbacks (always: they are
/// also what announces wake-ups at commit).
pub fn init() {
    // SAFETY: registering callbacks is allowed at any time in a backend; these stay for the
    // life of the process, as PostgreSQL's own modules' do.
    unsafe {
        pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
    }
    // The sizes of shared memory matter, and can only be defined, at server start.
    // SAFETY: a plain read of a flag the postmaster sets while preloading libraries.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    // SAFETY: _PG_init runs once, single-threaded, in the postmaster while it preloads
    // libraries; chaining the hook there is what PostgreSQL expects.
    unsafe {
        PREV_PROCESS_UTILITY = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(process_utility);
    }
    GucRegistry::define_int_guc(
        c"queen.tracked_partitions",
        c"Partitions whose offsets queen tracks in shared memory at once.",
        c"A partition beyond this is tracked again, from the database, when next pushed to or read.",
        &TRACKED_PARTITIONS,
        16,
        1 << 22,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"queen.max_reservations",
        c"Offset reservations (a transaction's pushes to one partition) in flight at once.",
        c"A push beyond it fails with SQLSTATE 53400 until reservations end.",
        &RESERVATIONS,
        64,
        1 << 24,
        GucContext::Postmaster,
        GucFlags::default(),
    );
}

fn layout() -> Layout {
    // SAFETY: MaxBackends is set before shared memory is sized (PostgreSQL 15's shmem
    // request hook exists for exactly that).
    let backends = unsafe { pg_sys::MaxBackends } as usize;
    Layout::new(TRACKED_PARTITIONS.get() as usize, RESERVATIONS.get() as usize, backends + prepared_owners())
}

/// Owners for prepared transactions' reservations: one per prepared transaction the
/// server allows (`max_prepared_transactions`, fixed at server start).
fn prepared_owners() -> usize {
    // SAFETY: a lookup of a built-in setting by name; the string lives in the GUC system.
    let v = unsafe { pg_sys::GetConfigOption(c"max_prepared_transactions".as_ptr(), false, false) };
    // SAFETY: GetConfigOption returns a valid C string for a built-in setting.
    unsafe { CStr::from_ptr(v) }.to_str().ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Bytes of shared memory the registry takes.
pub fn shmem_size() -> usize {
    layout().size()
}

/// Formats the registry (or attaches to it): `shmem` calls this once per process.
pub fn shmem_init((base, found): (*mut u8, bool)) {
    let layout = layout();
    // SAFETY: the tranche was requested in the shmem request hook.
    let lock = unsafe { &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock };
    // SAFETY: `base` points at shmem_size() fresh bytes when !found; the caller holds
    // AddinShmemInitLock, so nobody else touches them yet.
    unsafe {
        SHARED = Some(Shared { lock, base, layout });
        if !found {
            let (h, slots, recs, owners) = parts(base, layout);
            Registry::format(h, slots, recs, owners, TRACKED_PARTITIONS.get() as usize, prepared_owners());
        }
    }
}

/// The registry's parts inside its block of shared memory.
///
/// SAFETY (for callers): `base` is the registry's block laid out by `layout`, and the
/// caller holds the registry lock in a mode that fits what it does with the parts.
#[allow(clippy::type_complexity)]
unsafe fn parts<'a>(base: *mut u8, l: Layout) -> (&'a mut Header, &'a mut [Slot], &'a mut [Record], &'a mut [u32]) {
    let at = |k: usize| {
        // SAFETY: offsets within the block computed by Layout, which sized it.
        unsafe { base.add(k) }
    };
    let (slots_at, recs_at, owners_at) = (l.slots_at(), l.records_at(), l.owners_at());
    // SAFETY: each part starts 8-byte aligned (the block is MAXALIGNed and every size above
    // is a multiple of 8) and the parts do not overlap.
    unsafe {
        (
            &mut *(at(0) as *mut Header),
            std::slice::from_raw_parts_mut(at(slots_at) as *mut Slot, l.slots),
            std::slice::from_raw_parts_mut(at(recs_at) as *mut Record, l.records),
            std::slice::from_raw_parts_mut(at(owners_at) as *mut u32, l.owners),
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
    unsafe { (*std::ptr::addr_of!(SHARED)).as_ref().expect("queen offsets: shared memory not set up") }
}

/// Runs `f` on the registry under its lock, exclusively.
fn with_registry<R>(f: impl FnOnce(&mut Registry<'_>) -> R) -> R {
    let s = shared();
    // SAFETY: our tranche's lock, held exclusively; the parts lie in the block it guards,
    // and `f` is pure Rust that cannot raise an ERROR.
    unsafe {
        crate::shmem::locked(s.lock, pg_sys::LWLockMode::LW_EXCLUSIVE, || {
            let (h, slots, recs, owners) = parts(s.base, s.layout);
            f(&mut Registry::new(h, slots, recs, owners))
        })
    }
}

/// Runs `f` on a read-only view under the lock in shared mode.
fn with_view<R>(f: impl FnOnce(&View<'_>) -> R) -> R {
    let s = shared();
    // SAFETY: as `with_registry`; readers only read, and writers hold the lock exclusively.
    unsafe {
        crate::shmem::locked(s.lock, pg_sys::LWLockMode::LW_SHARED, || {
            let (h, slots, recs, _) = parts(s.base, s.layout);
            f(&View::new(h, slots, recs))
        })
    }
}

/// Another backend is loading a partition: give it a moment.
fn wait_for_load() {
    // SAFETY: a plain sleep; interrupts are checked right after.
    unsafe { pg_sys::pg_usleep(100) };
    pgrx::check_for_interrupts!();
}

fn full(what: &str) -> ! {
    errors::raise(
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!(
            "queen: {what}; raise it in postgresql.conf (takes a restart) or push to fewer partitions per transaction"
        ),
    )
}

/// Reserves `n` offsets of a partition for the current transaction; returns the first.
/// `writes_all`: every reserved offset will be written (else report them with `wrote`);
/// `fresh`: they go to the fresh tier.
pub fn reserve(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid, n: i64, writes_all: bool, fresh: bool) -> i64 {
    let key = *partition_id.as_bytes();
    let (me, sub) = (owner(), subxact());
    loop {
        match with_registry(|r| r.reserve(&key, n, me, sub, writes_all, fresh)) {
            Ok(first) => {
                HOLDS.with(|h| h.set(true));
                return first;
            }
            Err(Refusal::Unknown) => load(client, partition_id),
            Err(Refusal::Loading) => wait_for_load(),
            Err(Refusal::Full) => full("every offset reservation is in use (queen.max_reservations)"),
        }
    }
}

/// False when no segment of the fresh tier can hold an offset from `start` on (a read
/// then skips that tier). Without the registry, or before it knows the partition: true.
pub fn may_be_fresh(partition_id: pgrx::Uuid, start: i64) -> bool {
    if !enabled() {
        return true;
    }
    let key = *partition_id.as_bytes();
    with_view(|v| v.fresh_max(&key)).is_none_or(|max| start <= max)
}

/// The partitions the registry tracks that a push wrote to the fresh tier of, each with
/// the highest offset that may be there (empty without the registry).
pub fn fresh_partitions() -> Vec<(pgrx::Uuid, i64)> {
    if !enabled() {
        return Vec::new();
    }
    with_view(|v| v.fresh_partitions()).into_iter().map(|(k, max)| (pgrx::Uuid::from_bytes(k), max)).collect()
}

/// Records that the current transaction wrote offsets of a partition up to `last`.
pub fn wrote(partition_id: pgrx::Uuid, last: i64) {
    let key = *partition_id.as_bytes();
    let me = owner();
    with_registry(|r| r.wrote(&key, me, last));
}

/// The readable end of a partition as this transaction sees it (see the module docs; its
/// own pushes count as committed for itself). Without the registry: the
/// highest offset a committed segment holds (pushes then commit in offset order, under
/// their partition row lock, so nothing below it is in flight). `head` is the partition
/// row's head, which only the registry's absence keeps current; it is not needed here.
pub fn readable(partition_id: pgrx::Uuid, head: i64) -> i64 {
    if !enabled() {
        let _ = head; // a reserved head may end in a gap; only stored segments count
        return Spi::connect_mut(|client| stored_ends(client, partition_id).readable);
    }
    let key = *partition_id.as_bytes();
    let me = owner();
    loop {
        match with_view(|v| v.readable_for(&key, me)) {
            Seen::Readable(end) => return end,
            Seen::Loading => wait_for_load(),
            Seen::Unknown => Spi::connect_mut(|client| load(client, partition_id)),
        }
    }
}

/// Brings a partition into the registry: its head and readable end are the highest
/// offset the database holds for it, read with a snapshot taken after the slot was
/// claimed (nothing was in flight for it before: it had no slot), whatever the
/// transaction's isolation level (`spi::first_row_now`).
fn load(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid) {
    let key = *partition_id.as_bytes();
    let me = owner();
    match with_registry(|r| r.begin_load(&key, me)) {
        Load::Ready => {}
        Load::Loading => wait_for_load(),
        Load::Full => full("every tracked partition has pushes in flight (queen.tracked_partitions)"),
        Load::Mine => {
            LOADING.with(|l| l.set(Some(key)));
            wait_for_prepared(client);
            let e = stored_ends(client, partition_id);
            with_registry(|r| r.finish_load(&key, me, e.head, e.readable, e.fresh_max));
            LOADING.with(|l| l.set(None));
        }
    }
}

/// Waits for the prepared transactions of this database that the registry does not know
/// (they were prepared before the server last started) and that wrote to queen's segment
/// tables (they pushed): their reservations are lost with the registry, and their rows
/// are invisible until they commit. The database's view of a partition is complete once
/// they are over. Prepared transactions the registry holds need no wait: their partitions
/// stay tracked until they end, and are never loaded meanwhile. Cheap when nothing is
/// prepared (one look at the prepared transactions; the lock table only when there are).
fn wait_for_prepared(client: &mut SpiClient<'_>) {
    loop {
        let known = with_registry(|r| r.prepared());
        let prepared: Vec<i64> = crate::spi::run(
            client,
            "SELECT x.transaction::text::int8 FROM pg_catalog.pg_prepared_xacts x
              WHERE x.database = pg_catalog.current_database()",
            &[],
        )
        .filter_map(|row| row.get::<i64>(1).ok().flatten())
        .filter(|&x| !known.contains(&(x as u32)))
        .collect();
        if prepared.is_empty() {
            return;
        }
        let wrote: Vec<i64> = crate::spi::run(
            client,
            "SELECT DISTINCT x FROM pg_catalog.unnest($1::int8[]) AS u(x)
              WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                             JOIN pg_catalog.pg_class c ON c.oid = l.relation
                            WHERE l.locktype = 'relation' AND l.pid IS NULL AND l.mode = 'RowExclusiveLock'
                              AND l.virtualtransaction = '-1/' || u.x::text
                              AND c.relnamespace = 'queen'::regnamespace
                              AND c.relname ~ '^(fresh_)?segments')",
            &[prepared.into()],
        )
        .filter_map(|row| row.get::<i64>(1).ok().flatten())
        .collect();
        if wrote.is_empty() {
            return;
        }
        for xid in wrote {
            // SAFETY: waits on the transaction lock that a prepared transaction holds until
            // it is committed or rolled back; interrupts are served while waiting.
            unsafe {
                pg_sys::XactLockTableWait(
                    pg_sys::TransactionId::from_inner(xid as u32),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    pg_sys::XLTW_Oper::XLTW_None,
                )
            };
        }
    }
}

/// What the database says of a partition.
struct Stored {
    /// At least `readable`, and anything else that names an offset: the partition row's
    /// head (kept by pushes without the registry) and every lane's cursor.
    head: i64,
    /// The highest offset a segment of either tier holds (a segment ends on a message) or
    /// that retention deleted.
    readable: i64,
    /// The last offset of the fresh tier's last segment.
    fresh_max: i64,
}

fn stored_ends(client: &mut SpiClient<'_>, partition_id: pgrx::Uuid) -> Stored {
    let row = crate::spi::first_row_now(
        client,
        "WITH t AS (
           SELECT (SELECT s.last_offset FROM queen.segments s WHERE s.partition_id = $1
                    ORDER BY s.first_offset DESC LIMIT 1) AS durable,
                  (SELECT f.last_offset FROM queen.fresh_segments f WHERE f.partition_id = $1
                    ORDER BY f.first_offset DESC LIMIT 1) AS fresh,
                  (SELECT p.retained_through FROM queen.partitions p WHERE p.partition_id = $1) AS retained
         ), r AS (
           SELECT greatest(t.durable, t.fresh, t.retained, 0) AS readable, coalesce(t.fresh, 0) AS fresh FROM t
         )
         SELECT greatest(r.readable,
                         (SELECT p.head FROM queen.partitions p WHERE p.partition_id = $1),
                         (SELECT max(l.committed) FROM queen.lanes l WHERE l.partition_id = $1)),
                r.readable, r.fresh
           FROM r",
        &[partition_id.into()],
        |row| Stored {
            head: row.get::<i64>(1).unwrap_or(0),
            readable: row.get::<i64>(2).unwrap_or(0),
            fresh_max: row.get::<i64>(3).unwrap_or(0),
        },
    );
    row.unwrap_or(Stored { head: 0, readable: 0, fresh_max: 0 })
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._readable(uuid, bigint) IS
  'queen internal: a partition''s readable end (offsets below it are decided); not granted';
"#,
    name = "readable_sql_home",
    requires = [readable_sql]
);

/// `queen._readable(partition_id, head)`: the readable end of a partition, for queen's own
/// SQL (the claim query of pop, status, totals, group creation). Not granted.
#[pg_extern(name = "_readable", volatile, parallel_unsafe)]
fn readable_sql(partition_id: pgrx::Uuid, head: i64) -> i64 {
    readable(partition_id, head)
}

/// PRE_PREPARE of a transaction that reserved offsets: they pass to a prepared-transaction
/// owner under the transaction's xid (`Registry::prepare`).
fn prepare() {
    // SAFETY: a plain read of the current transaction's xid; a push assigned it.
    let xid = unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner();
    if prepared_owners() == 0 {
        return; // PostgreSQL refuses the prepare itself: prepared transactions are disabled
    }
    let me = owner();
    if !with_registry(|r| r.prepare(me, xid)) {
        errors::raise(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            "queen: every slot for a prepared transaction's offsets is in use (one per max_prepared_transactions); \
             commit or roll back prepared transactions first"
                .to_string(),
        );
    }
    HOLDS.with(|h| h.set(false));
    PREPARING.with(|p| p.set(Some(xid)));
}

/// A prepared transaction ended (`COMMIT PREPARED`, `ROLLBACK PREPARED`, or a prepare that
/// failed): its reservations end. Waiting pops look again: its messages, or those that
/// committed after it (a rollback frees them too), may be readable now. Returns whether
/// it held reservations.
fn finish_prepared(xid: u32, committed: bool) -> bool {
    let ended = with_registry(|r| r.finish_prepared(xid, committed));
    if ended {
        crate::wake::broadcast_all();
    }
    ended
}

/// Ends the reservations of prepared transactions that are over, should `process_utility`
/// have missed one (the background worker calls this). Returns how many it ended.
pub fn sweep_prepared() -> usize {
    if !enabled() {
        return 0;
    }
    let mut ended = 0;
    for xid in with_registry(|r| r.prepared()) {
        // SAFETY: plain reads of the transaction status; `xid` is a normal xid that a
        // prepared transaction of this server held.
        let (running, committed) = unsafe {
            let x = pg_sys::TransactionId::from_inner(xid);
            (pg_sys::TransactionIdIsInProgress(x), pg_sys::TransactionIdDidCommit(x))
        };
        if !running && finish_prepared(xid, committed) {
            ended += 1;
        }
    }
    ended
}

/// The xid of the prepared transaction that a `COMMIT PREPARED` / `ROLLBACK PREPARED` names,
/// when it holds reservations; with whether it commits.
fn resolving(pstmt: *mut pg_sys::PlannedStmt) -> Option<(u32, bool)> {
    // SAFETY: `pstmt` is the statement being run; its utility node is a valid Node.
    let stmt = unsafe { (*pstmt).utilityStmt };
    // SAFETY: as above; a TransactionStmt is read only after its tag says so.
    unsafe {
        if stmt.is_null() || (*stmt).type_ != pg_sys::NodeTag::T_TransactionStmt {
            return None;
        }
        let t = stmt as *mut pg_sys::TransactionStmt;
        let commit = match (*t).kind {
            pg_sys::TransactionStmtKind::TRANS_STMT_COMMIT_PREPARED => true,
            pg_sys::TransactionStmtKind::TRANS_STMT_ROLLBACK_PREPARED => false,
            _ => return None,
        };
        if (*t).gid.is_null() || with_registry(|r| r.prepared().is_empty()) {
            return None;
        }
        let gid = CStr::from_ptr((*t).gid).to_string_lossy().into_owned();
        let xid = Spi::connect_mut(|client| {
            crate::spi::first_value::<i64>(crate::spi::run(
                client,
                "SELECT transaction::text::int8 FROM pg_catalog.pg_prepared_xacts WHERE gid = $1",
                &[gid.into()],
            ))
        })?;
        Some((xid as u32, commit))
    }
}

unsafe extern "C-unwind" {
    /// PostgreSQL's `standard_ProcessUtility`, declared here so that `process_utility` can
    /// call it without pgrx's FFI guard (pgrx's binding of it has one).
    #[link_name = "standard_ProcessUtility"]
    fn standard_process_utility_unguarded(
        pstmt: *mut pg_sys::PlannedStmt,
        query_string: *const std::ffi::c_char,
        read_only_tree: bool,
        context: pg_sys::ProcessUtilityContext::Type,
        params: pg_sys::ParamListInfo,
        query_env: *mut pg_sys::QueryEnvironment,
        dest: *mut pg_sys::DestReceiver,
        qc: *mut pg_sys::QueryCompletion,
    );
}

/// The `ProcessUtility` hook: runs the statement, and when it is a `COMMIT PREPARED` or
/// `ROLLBACK PREPARED` of a transaction that holds reservations, ends them afterwards.
///
/// Every utility statement of the database passes here (DO, CALL, COPY, EXECUTE, DDL), so
/// an ERROR the statement raises must reach PostgreSQL untouched. pgrx's guards catch an
/// ERROR and raise a copy of it, which loses its CONTEXT and its schema, table, column and
/// constraint names, and appends a Rust backtrace to its DETAIL when `RUST_BACKTRACE` is
/// set. So this function has no guard of its own, and calls the statement without one:
/// the ERROR unwinds (longjmp) over this frame straight to PostgreSQL's handler. The frame
/// holds nothing to drop (a plain frame, in the terms of Rust's `C-unwind` ABI). queen's
/// own work before and after runs in guarded functions, which turn a Rust panic into an
/// ERROR of their own.
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    let resolving = resolving_guarded(pstmt);
    // SAFETY: the previous hook (or the standard function) with the arguments PostgreSQL
    // passed to this one. Nothing in this frame needs dropping if it raises an ERROR.
    unsafe {
        match PREV_PROCESS_UTILITY {
            Some(prev) => prev(pstmt, query_string, read_only_tree, context, params, query_env, dest, qc),
            None => standard_process_utility_unguarded(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
        }
    }
    // The prepared transaction is over: committed (its rows visible to every new snapshot)
    // or rolled back.
    if resolving >= 0 {
        finish_prepared_guarded(resolving as u32, resolving & (1 << 32) != 0);
    }
}

/// `resolving` for `process_utility`, guarded: -1 when the statement ends no prepared
/// transaction of the registry's, else the xid, plus 2^32 when it commits.
#[pg_guard]
extern "C-unwind" fn resolving_guarded(pstmt: *mut pg_sys::PlannedStmt) -> i64 {
    if !enabled() {
        return -1;
    }
    resolving(pstmt).map_or(-1, |(xid, commit)| i64::from(xid) | (i64::from(commit) << 32))
}

/// `finish_prepared` for `process_utility`, guarded.
#[pg_guard]
extern "C-unwind" fn finish_prepared_guarded(xid: u32, committed: bool) {
    finish_prepared(xid, committed);
}

/// Ends this backend's part in the registry for the current transaction.
fn end(committed: bool) {
    let holds = HOLDS.with(|h| h.replace(false));
    let loading = LOADING.with(|l| l.take());
    if !(holds || loading.is_some()) || !enabled() {
        return;
    }
    let me = owner();
    with_registry(|r| {
        r.finish(me, committed);
        if let Some(key) = loading {
            r.abandon_load(&key, me);
        }
    });
}

#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        // Post-commit: the transaction's rows are visible to every new snapshot. Publish
        // its offsets first, then wake waiting pops, which will find them readable.
        XACT_EVENT_COMMIT => {
            end(true);
            crate::lanes::end(true);
            crate::wake::on_commit();
        }
        XACT_EVENT_ABORT => {
            end(false);
            if let Some(xid) = PREPARING.with(|p| p.take()) {
                finish_prepared(xid, false); // the prepare failed after PRE_PREPARE
            }
            crate::lanes::end(false);
            crate::wake::on_abort();
            crate::queues::on_abort();
            queen_core::segment::forget_blocks();
        }
        XACT_EVENT_PRE_PREPARE if crate::lanes::in_use() => errors::raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "queen: a transaction that popped, acked or extended a lease cannot be prepared (PREPARE TRANSACTION): \
             the lanes it holds live in this session's shared memory and would stay locked"
                .to_string(),
        ),
        XACT_EVENT_PRE_PREPARE if HOLDS.with(|h| h.get()) && enabled() => prepare(),
        // Prepared: the reservations belong to the prepared transaction now; its commit
        // will wake waiting pops (`finish_prepared`).
        // What this session cached of queues and partitions the prepared transaction
        // created is gone too: they exist only if it commits.
        XACT_EVENT_PREPARE => {
            PREPARING.with(|p| p.set(None));
            crate::wake::on_abort();
            crate::queues::on_abort();
            queen_core::segment::forget_blocks();
        }
        _ => {}
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn subxact_callback(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    parent_subid: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::SubXactEvent::*;
    if event == SUBXACT_EVENT_ABORT_SUB {
        crate::queues::on_abort();
        queen_core::segment::forget_blocks();
        crate::lanes::end_subxact(my_subid, parent_subid, false);
    }
    if event == SUBXACT_EVENT_COMMIT_SUB {
        crate::lanes::end_subxact(my_subid, parent_subid, true);
    }
    if !enabled() {
        return;
    }
    let me = owner();
    match event {
        SUBXACT_EVENT_ABORT_SUB => {
            // A load cut short by an error in a subtransaction: let others load it.
            if let Some(key) = LOADING.with(|l| l.take()) {
                with_registry(|r| r.abandon_load(&key, me));
            }
            if HOLDS.with(|h| h.get()) {
                with_registry(|r| r.abort_subxact(me, my_subid));
            }
        }
        SUBXACT_EVENT_COMMIT_SUB if HOLDS.with(|h| h.get()) => {
            with_registry(|r| r.commit_subxact(me, my_subid, parent_subid));
        }
        _ => {}
    }
}
