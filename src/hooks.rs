//! Every hook queen sets in PostgreSQL, in one place: shared memory, the cache
//! invalidation callbacks, the transaction callbacks, the function manager hook (`fmgr`:
//! which queen function a call runs in, for the privilege checks) and the
//! `ProcessUtility` hook.
//!
//! **Shared memory.** With `shared_preload_libraries = 'queen'`, queen keeps these in
//! shared memory: the long-poll wake-up slots (`wake`), the offset registry (`offsets`),
//! the lane registry (`lane::registry`) and the per-database slots (`dbs`: maintenance workers,
//! lane journals, counters). Each module says how much it needs and initialises its part;
//! the hooks here ask for it. Without preloading none of it exists, and each module falls
//! back to what needs no shared memory.
//!
//! **Cache invalidation.** The per-backend caches of OIDs (`catalog`) and of queue
//! settings (`cache`) are told when the catalogs behind them change.
//!
//! **Transaction callbacks.** At commit (after the transaction's rows became visible to
//! new snapshots) and at abort, the registries learn how the transaction ended: its offset
//! reservations commit or leave gaps (`offsets::end`), its lanes are released or put back
//! (`registry::end`), waiting pops are woken (`wake`), a start of this database's worker
//! it asked for is handed to the launcher (`dbs`), and a copy into queen's tables ends
//! (`dbs::copy_in_ends`, first and on its own; at commit the registries then forget what
//! they loaded meanwhile). None of this may raise: after a commit
//! an ERROR is a PANIC, and during an abort it would recurse. Each part catches its own
//! failures (a registry update that fails is undone whole and done later: see
//! `deferred::finish`), and the callbacks catch anything left.
//!
//! **`ProcessUtility`.** Every utility statement passes here:
//! - `COMMIT PREPARED` / `ROLLBACK PREPARED` of a transaction that holds offset
//!   reservations ends them afterwards (`offsets`);
//! - `CREATE EXTENSION queen`, `ALTER EXTENSION queen` and `DROP EXTENSION queen` make this
//!   database's maintenance worker step aside until their transaction ends, and ask for it
//!   again when it commits (`dbs`; after a drop it finds no queen and leaves); a `CREATE`
//!   where queen is absent also forgets what the registries held of an earlier install,
//!   and is refused (55006) while a session of that install still holds some of it;
//! - `COPY ... FROM` into a queen table by a role that may insert there (a restore of a
//!   dump) keeps the maintenance worker away until the copies are over (`dbs::copy_in_begins`);
//! - `DROP DATABASE`, `ALTER DATABASE ... RENAME` or `... SET TABLESPACE`, and
//!   `CREATE DATABASE ... TEMPLATE`, which need a database to themselves, first ask its
//!   maintenance worker to leave (`worker::leave_database`), and let it come back after.

use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

use crate::pg::errors;

static mut PREV_PROCESS_UTILITY: pg_sys::ProcessUtility_hook_type = None;
static mut PREV_REQUEST: Option<unsafe extern "C-unwind" fn()> = None;
static mut PREV_STARTUP: Option<unsafe extern "C-unwind" fn()> = None;
static mut PREV_FMGR: pg_sys::fmgr_hook_type = None;

/// Called from `_PG_init`, after the settings are defined (the sizes of shared memory are
/// settings): every hook and callback.
pub fn init() {
    // SAFETY: registering callbacks is allowed at any time in a backend; these stay for the
    // life of the process, as PostgreSQL's own modules' do.
    unsafe {
        pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
        for cache in [pg_sys::SysCacheIdentifier::NAMESPACENAME, pg_sys::SysCacheIdentifier::RELNAMENSP] {
            pg_sys::CacheRegisterSyscacheCallback(
                cache as i32,
                Some(crate::pg::catalog::forget),
                pg_sys::Datum::from(0),
            );
        }
        pg_sys::CacheRegisterRelcacheCallback(Some(crate::pg::cache::relcache_callback), pg_sys::Datum::from(0));
        PREV_FMGR = pg_sys::fmgr_hook;
        pg_sys::fmgr_hook = Some(fmgr);
        // Loaded by a call (no shared_preload_libraries): the functions that led to it
        // started before the hook was there. The role they run in now stands for them
        // until the transaction ends (the privilege checks ask it too; `fmgr`).
        if !pg_sys::process_shared_preload_libraries_in_progress && pg_sys::IsTransactionState() {
            crate::queue::privileges::entered(pg_sys::InvalidOid, false, pg_sys::GetUserId());
        }
    }
    // SAFETY: _PG_init runs once, single-threaded, in the postmaster while it loads
    // shared_preload_libraries; chaining these hooks there is what PostgreSQL expects.
    unsafe {
        if !pg_sys::process_shared_preload_libraries_in_progress {
            return;
        }
        PREV_REQUEST = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(shmem_request);
        PREV_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
        PREV_PROCESS_UTILITY = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(process_utility);
    }
}

/// The function manager hook: PostgreSQL calls it when a SECURITY DEFINER function (or one
/// with a SET clause) starts, ends or raises. queen notes each such function running
/// (`privileges::entered`, `left`), for the privilege checks: which queen function the
/// application called (a role given EXECUTE directly, the 0.3.0 model, must hold EXECUTE
/// on it), and which roles the functions between the session and queen run as (an
/// application's SECURITY DEFINER function runs as its owner, whose privileges count too).
/// Only a function's start looks up its schema (a syscache lookup); an end or an error
/// only compares OIDs, so nothing here can fail while an error is thrown.
#[pg_guard]
unsafe extern "C-unwind" fn fmgr(
    event: pg_sys::FmgrHookEventType::Type,
    flinfo: *mut pg_sys::FmgrInfo,
    arg: *mut pg_sys::Datum,
) {
    // SAFETY: PostgreSQL passes the called function's FmgrInfo and its private datum, which
    // are passed on untouched to the hook this one chained (queen does not use the datum).
    unsafe {
        let f = (*flinfo).fn_oid;
        // An end or an error is noted first, so that a chained hook that raises cannot
        // leave the frame behind; a start after the chained hook's, which may raise first.
        if event != pg_sys::FmgrHookEventType::FHET_START {
            crate::queue::privileges::left(f);
        }
        if let Some(prev) = PREV_FMGR {
            prev(event, flinfo, arg);
        }
        if event == pg_sys::FmgrHookEventType::FHET_START {
            let queen = crate::pg::catalog::queen_schema();
            let ours = queen != pg_sys::InvalidOid && pg_sys::get_func_namespace(f) == queen;
            crate::queue::privileges::entered(f, ours, pg_sys::GetUserId());
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    // SAFETY: called by the postmaster in its shmem-request phase, the only time these
    // requests are allowed.
    unsafe {
        if let Some(prev) = PREV_REQUEST {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(crate::pg::wake::shmem_size());
        pg_sys::RequestAddinShmemSpace(crate::offsets::shmem_size());
        pg_sys::RequestNamedLWLockTranche(crate::offsets::TRANCHE.as_ptr(), 1);
        pg_sys::RequestAddinShmemSpace(crate::lane::registry::shmem_size());
        pg_sys::RequestNamedLWLockTranche(crate::lane::registry::TRANCHE.as_ptr(), 1);
        pg_sys::RequestAddinShmemSpace(crate::pg::dbs::shmem_size());
        pg_sys::RequestNamedLWLockTranche(crate::pg::dbs::TRANCHE.as_ptr(), 1);
        pg_sys::RequestAddinShmemSpace(crate::lane::limits::shmem_size());
        pg_sys::RequestNamedLWLockTranche(crate::lane::limits::TRANCHE.as_ptr(), 1);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    // SAFETY: called in the postmaster (and after a crash restart) while shared memory is
    // set up; ShmemInitStruct is serialised by AddinShmemInitLock as PostgreSQL requires.
    unsafe {
        if let Some(prev) = PREV_STARTUP {
            prev();
        }
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock; // AddinShmemInitLock
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        crate::pg::wake::shmem_init(alloc(c"queen wake-ups", crate::pg::wake::shmem_size()));
        crate::offsets::shmem_init(alloc(c"queen offsets", crate::offsets::shmem_size()));
        crate::lane::registry::shmem_init(alloc(c"queen lanes", crate::lane::registry::shmem_size()));
        crate::pg::dbs::shmem_init(alloc(c"queen databases", crate::pg::dbs::shmem_size()));
        crate::lane::limits::shmem_init(alloc(c"queen limits", crate::lane::limits::shmem_size()));
        pg_sys::LWLockRelease(lock);
    }
}

/// A named block of shared memory, and whether it existed already (a backend attaching to
/// memory the postmaster initialised).
unsafe fn alloc(name: &std::ffi::CStr, size: usize) -> (*mut u8, bool) {
    let mut found = false;
    // SAFETY: the caller holds AddinShmemInitLock; the name is a static C string.
    let p = unsafe { pg_sys::ShmemInitStruct(name.as_ptr(), size, &mut found) } as *mut u8;
    (p, found)
}

/// Runs `f`, and logs instead of raising if it panics: for work that must not raise
/// (transaction callbacks). Each part already catches its own registry failures; this is
/// the last net.
fn never_raise(what: &str, f: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        pgrx::log!("queen: {what} failed; its work is retried later");
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        // Post-commit: the transaction's rows are visible to every new snapshot. Publish
        // its offsets first, then release its lanes, then wake waiting pops, which will
        // find them readable.
        XACT_EVENT_COMMIT => {
            crate::queue::privileges::forget_entries();
            // First and on its own: a count left up would keep the worker away for good.
            let mut copied = false;
            never_raise("the end of a copy into queen's tables", || copied = crate::pg::dbs::copy_in_ends());
            never_raise("the end of a committed transaction", || {
                crate::offsets::end(true);
                crate::lane::registry::end(true);
                crate::pg::wake::on_commit();
                crate::pg::dbs::on_commit();
                // Rows copied into queen's tables (a restore): what calls loaded from the
                // tables while they held part of a dump goes (the next worker forgets too).
                if copied {
                    forget_registries("rows copied into queen's tables");
                }
            });
        }
        XACT_EVENT_ABORT => {
            crate::queue::privileges::forget_entries();
            never_raise("the end of a copy into queen's tables", || {
                crate::pg::dbs::copy_in_ends();
            });
            never_raise("the end of an aborted transaction", || {
                crate::offsets::end(false);
                crate::offsets::prepare_failed();
                crate::lane::registry::end(false);
                crate::pg::wake::on_abort();
                crate::pg::cache::on_abort();
                crate::pg::dbs::on_abort();
                queen_core::segment::forget_blocks();
            });
        }
        XACT_EVENT_PRE_PREPARE if crate::lane::registry::in_use() => errors::raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "queen: a transaction that popped, acked or extended a lease cannot be prepared (PREPARE TRANSACTION): \
             the lanes it holds live in this session's shared memory and would stay locked"
                .to_string(),
        ),
        // (Before the prepare: an ERROR here still aborts the transaction cleanly.)
        XACT_EVENT_PRE_PREPARE => {
            crate::offsets::prepare();
            crate::pg::dbs::prepare();
        }
        // Prepared: the reservations belong to the prepared transaction now; its commit
        // will wake waiting pops (`offsets::finish_prepared`). What this session cached of
        // queues and partitions the prepared transaction created is gone too: they exist
        // only if it commits.
        XACT_EVENT_PREPARE => {
            crate::queue::privileges::forget_entries();
            never_raise("the end of a copy into queen's tables", || {
                crate::pg::dbs::copy_in_ends();
            });
            never_raise("the end of a prepared transaction", || {
                crate::offsets::prepared();
                crate::lane::registry::prepared();
                crate::pg::wake::on_abort();
                crate::pg::cache::on_abort();
                crate::pg::dbs::on_abort();
                queen_core::segment::forget_blocks();
            });
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
    match event {
        SUBXACT_EVENT_ABORT_SUB => never_raise("a subtransaction's abort", || {
            crate::pg::cache::on_abort();
            queen_core::segment::forget_blocks();
            crate::lane::registry::end_subxact(my_subid, parent_subid, false);
            crate::offsets::end_subxact(my_subid, parent_subid, false);
        }),
        SUBXACT_EVENT_COMMIT_SUB => {
            crate::lane::registry::end_subxact(my_subid, parent_subid, true);
            crate::offsets::end_subxact(my_subid, parent_subid, true);
        }
        _ => {}
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

/// What `process_utility` does around a statement, as one integer (it crosses a guarded
/// C function's boundary): the kind in the bits above 32, an xid or a database below.
#[derive(Clone, Copy)]
enum Around {
    Nothing,
    /// A `COMMIT PREPARED` (true) or `ROLLBACK PREPARED` of a transaction with reservations.
    Resolving(u32, bool),
    /// A statement that needs a database to itself: its worker left, and comes back after.
    Database(u32),
}

impl Around {
    fn encode(self) -> i64 {
        match self {
            Around::Nothing => 0,
            Around::Resolving(xid, commit) => (if commit { 1 } else { 2 } << 32) | i64::from(xid),
            Around::Database(db) => (3 << 32) | i64::from(db),
        }
    }
    fn decode(v: i64) -> Around {
        let low = (v & 0xffff_ffff) as u32;
        match v >> 32 {
            1 => Around::Resolving(low, true),
            2 => Around::Resolving(low, false),
            3 => Around::Database(low),
            _ => Around::Nothing,
        }
    }
}

/// The `ProcessUtility` hook: see the module docs.
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
    // SAFETY: `pstmt` is the statement PostgreSQL passed to this hook.
    let around = unsafe { before_guarded(pstmt) };
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
    after_guarded(around);
}

/// # Safety
/// `pstmt` is the statement `ProcessUtility` received.
#[pg_guard]
unsafe extern "C-unwind" fn before_guarded(pstmt: *mut pg_sys::PlannedStmt) -> i64 {
    // SAFETY: as the caller promises.
    unsafe { before(pstmt) }.encode()
}

#[pg_guard]
extern "C-unwind" fn after_guarded(around: i64) {
    after(Around::decode(around));
}

/// What to do around the statement; the worker of a database the statement needs to
/// itself leaves now.
///
/// # Safety
/// `pstmt` is the statement `ProcessUtility` received (its utility node a valid Node).
unsafe fn before(pstmt: *mut pg_sys::PlannedStmt) -> Around {
    // SAFETY: `pstmt` is the statement being run; its utility node is a valid Node.
    let stmt = unsafe { (*pstmt).utilityStmt };
    if stmt.is_null() {
        return Around::Nothing;
    }
    // SAFETY: `stmt` is the statement's utility node, not null: a valid parse node.
    if unsafe { extension_statement(stmt) && may_change_extension(stmt) } {
        // SAFETY: `stmt` is the statement's utility node, not null: a valid parse node.
        if unsafe { installs_anew(stmt) } {
            forget_earlier_install();
        }
        // The worker steps aside while the extension's objects change under it (it would
        // otherwise hold a table the statement needs, and one of the two would be cancelled
        // as a deadlock), and is asked for again when the statement commits.
        crate::pg::dbs::request_worker_on_commit();
        crate::worker::leave_database(crate::pg::dbs::my_database());
        crate::pg::dbs::resume_at_transaction_end();
        return Around::Nothing;
    }
    // SAFETY: `stmt` is the statement's utility node, not null: a valid parse node.
    if unsafe { copies_into_queen(stmt) } && crate::pg::dbs::copy_in_begins() {
        crate::worker::leave_database(crate::pg::dbs::my_database());
        // Queues and grants may come in with the rows: every backend drops what it cached
        // of them once this commits (a limited role cached as unlimited, say).
        crate::pg::cache::invalidate();
    }
    // SAFETY: as above.
    if let Some(database) = unsafe { database_needed(stmt) } {
        crate::worker::leave_database(database);
        return Around::Database(database);
    }
    // SAFETY: `stmt` is the utility statement ProcessUtility received.
    match unsafe { crate::offsets::resolving(stmt) } {
        Some((xid, commit)) => Around::Resolving(xid, commit),
        None => Around::Nothing,
    }
}

fn after(around: Around) {
    match around {
        Around::Nothing => {}
        // The prepared transaction is over: committed (its rows visible to every new
        // snapshot) or rolled back.
        Around::Resolving(xid, committed) => {
            crate::offsets::finish_prepared(xid, committed);
        }
        Around::Database(database) => crate::worker::resume_database(database),
    }
}

/// `CREATE EXTENSION queen`, `ALTER EXTENSION queen ...` (an update) or `DROP EXTENSION`
/// naming queen.
///
/// # Safety
/// `stmt` is a valid parse node.
unsafe fn extension_statement(stmt: *mut pg_sys::Node) -> bool {
    let queen = |name: *const std::ffi::c_char| {
        // SAFETY: a C string of the parse tree (or null).
        !name.is_null() && unsafe { CStr::from_ptr(name) }.to_bytes() == b"queen"
    };
    // SAFETY: each node is read as its type only after its tag says so; a DROP's objects
    // are String nodes for an extension (the grammar builds them so).
    unsafe {
        match (*stmt).type_ {
            pg_sys::NodeTag::T_CreateExtensionStmt => queen((*(stmt as *mut pg_sys::CreateExtensionStmt)).extname),
            pg_sys::NodeTag::T_AlterExtensionStmt => queen((*(stmt as *mut pg_sys::AlterExtensionStmt)).extname),
            pg_sys::NodeTag::T_DropStmt => {
                let d = stmt as *mut pg_sys::DropStmt;
                (*d).removeType == pg_sys::ObjectType::OBJECT_EXTENSION
                    && pgrx::PgList::<pg_sys::Node>::from_pg((*d).objects)
                        .iter_ptr()
                        .any(|n| (*n).type_ == pg_sys::NodeTag::T_String && queen((*(n as *mut pg_sys::String)).sval))
            }
            _ => false,
        }
    }
}

/// Whether the role running `stmt`, a statement `extension_statement` found to be about
/// queen, may do what it asks, so that its hook may make the worker leave and forget the
/// registries' entries: a `CREATE EXTENSION` where queen is not installed needs a superuser
/// (queen.control), an `ALTER` or `DROP` the extension's owner. A `CREATE` where queen is
/// installed changes nothing (it fails, or `IF NOT EXISTS` skips it), nor does a `DROP ...
/// IF EXISTS` where it is not. These run before PostgreSQL's own checks: any role could
/// otherwise keep the worker away by repeating a statement that fails.
///
/// # Safety
/// `stmt` is a valid parse node.
unsafe fn may_change_extension(stmt: *mut pg_sys::Node) -> bool {
    // SAFETY: catalog lookups (by name, missing_ok; the owner check of an extension that
    // exists) inside the statement's transaction; the node is only asked for its tag.
    unsafe {
        let ext = pg_sys::get_extension_oid(c"queen".as_ptr(), true);
        if (*stmt).type_ == pg_sys::NodeTag::T_CreateExtensionStmt {
            ext == pg_sys::InvalidOid && pg_sys::superuser()
        } else {
            ext != pg_sys::InvalidOid && pg_sys::pg_extension_ownercheck(ext, pg_sys::GetUserId())
        }
    }
}

/// Whether `stmt`, a statement `extension_statement` found to be about queen, is its
/// `CREATE EXTENSION` in a database where queen is not installed (it creates it, or fails).
///
/// # Safety
/// `stmt` is a valid parse node.
unsafe fn installs_anew(stmt: *mut pg_sys::Node) -> bool {
    // SAFETY: the node's tag is read first; the catalog lookup (missing_ok) runs inside the
    // statement's transaction, before the statement, and raises only as the statement's
    // own lookup of the extension would.
    unsafe {
        (*stmt).type_ == pg_sys::NodeTag::T_CreateExtensionStmt
            && pg_sys::get_extension_oid(c"queen".as_ptr(), true) == pg_sys::InvalidOid
    }
}

/// A new install after `DROP EXTENSION`: what the registries still hold of the old install
/// goes, since a restored dump brings its partition ids back with other cursors and
/// offsets (a lane's cursor past the restored one would skip messages; a partition's head
/// behind the restored segments would reserve their offsets again). An entry a
/// transaction still uses cannot go: an ack or a push of the old install that took its
/// lane or offsets in shared memory before the `DROP EXTENSION` in this same transaction
/// locked the tables, and waits for them now. It would put the old state back when it
/// fails, so the install is refused (55006) until those sessions are gone.
fn forget_earlier_install() {
    forget_registries("a new install");
    let (lanes, partitions) = crate::lane::held_in_registries(crate::pg::dbs::my_database());
    if lanes + partitions > 0 {
        errors::raise(
            PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
            format!(
                "queen: {lanes} lanes and {partitions} partitions of the dropped queen install are still in use \
                 by other sessions (acks or pushes waiting for its tables); end those sessions \
                 (pg_terminate_backend), or stop the consumers and producers, and try again"
            ),
        );
    }
}

/// Forgets what the registries hold of this database that nothing uses
/// (`lane::forget_registries`), and logs it at DEBUG1. Raises nothing.
fn forget_registries(why: &str) {
    let (lanes, partitions) = crate::lane::forget_registries(crate::pg::dbs::my_database());
    if lanes + partitions > 0 {
        pgrx::debug1!("queen: {why}: forgot {lanes} lanes and {partitions} partitions held in shared memory");
    }
}

/// Whether `stmt` is a `COPY ... FROM` into one of queen's tables by a role that may insert
/// there (a restore of a dump writes them that way: `dbs::copy_in_begins`).
///
/// # Safety
/// `stmt` is a valid parse node.
unsafe fn copies_into_queen(stmt: *mut pg_sys::Node) -> bool {
    // SAFETY: the node is read as a CopyStmt only after its tag says so; its relation is a
    // RangeVar of the parse tree (or null). The lookups run inside the statement's
    // transaction, before it and before anything here changed shared state, and take no
    // lock; a missing name is no error, and what they can raise (no USAGE on the schema, a
    // cross-database name) the COPY's own lookup would raise too (this hook is guarded).
    unsafe {
        if (*stmt).type_ != pg_sys::NodeTag::T_CopyStmt {
            return false;
        }
        let copy = stmt as *mut pg_sys::CopyStmt;
        if !(*copy).is_from || (*copy).relation.is_null() {
            return false;
        }
        let queen = pg_sys::get_namespace_oid(c"queen".as_ptr(), true);
        let rel = pg_sys::RangeVarGetRelidExtended(
            (*copy).relation,
            pg_sys::NoLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        );
        // Only a role that may write the table counts: another's COPY fails on its
        // privileges, and must not keep the worker away or end other sessions' leases.
        queen != pg_sys::InvalidOid
            && rel != pg_sys::InvalidOid
            && pg_sys::get_rel_namespace(rel) == queen
            && pg_sys::pg_class_aclcheck(rel, pg_sys::GetUserId(), pg_sys::ACL_INSERT as pg_sys::AclMode)
                == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// The database a statement needs to itself (no other session connected to it): the one
/// it drops, renames, moves to another tablespace, or copies as a template. None for any
/// other statement, a database that does not exist, or one the role does not own (nor is
/// a superuser): PostgreSQL refuses those statements to such a role (a database marked as
/// a template may be copied by others, but no worker serves one), and any role could
/// otherwise keep a database's worker away by repeating one that fails.
///
/// # Safety
/// `stmt` is a valid parse node.
unsafe fn database_needed(stmt: *mut pg_sys::Node) -> Option<u32> {
    // SAFETY: each node is read as its type only after its tag says so; lists are
    // PostgreSQL Lists of DefElem (the grammar builds them so).
    let name: *const std::ffi::c_char = unsafe {
        match (*stmt).type_ {
            pg_sys::NodeTag::T_DropdbStmt => (*(stmt as *mut pg_sys::DropdbStmt)).dbname,
            pg_sys::NodeTag::T_RenameStmt => {
                let r = stmt as *mut pg_sys::RenameStmt;
                if (*r).renameType != pg_sys::ObjectType::OBJECT_DATABASE {
                    return None;
                }
                (*r).subname
            }
            pg_sys::NodeTag::T_AlterDatabaseStmt => {
                let a = stmt as *mut pg_sys::AlterDatabaseStmt;
                option((*a).options, c"tablespace")?;
                (*a).dbname
            }
            pg_sys::NodeTag::T_CreatedbStmt => {
                option((*(stmt as *mut pg_sys::CreatedbStmt)).options, c"template")?.as_ptr()
            }
            _ => return None,
        }
    };
    if name.is_null() {
        return None;
    }
    // SAFETY: catalog lookups (by name, missing_ok; the owner check of a database that
    // exists), inside the statement's transaction.
    let oid = unsafe { pg_sys::get_database_oid(name, true) };
    // SAFETY: as above.
    let owns = oid != pg_sys::InvalidOid && unsafe { pg_sys::pg_database_ownercheck(oid, pg_sys::GetUserId()) };
    owns.then(|| oid.to_u32())
}

/// The value of option `name` in a list of DefElem, as a string.
///
/// # Safety
/// `list` is a PostgreSQL List of DefElem nodes (or null).
unsafe fn option(list: *mut pg_sys::List, name: &CStr) -> Option<&'static CStr> {
    // SAFETY: as the caller promises; defGetString reads the element's argument.
    unsafe {
        let list = pgrx::PgList::<pg_sys::DefElem>::from_pg(list);
        for d in list.iter_ptr() {
            if !(*d).defname.is_null() && CStr::from_ptr((*d).defname) == name && !(*d).arg.is_null() {
                return Some(CStr::from_ptr(pg_sys::defGetString(d)));
            }
        }
        None
    }
}
