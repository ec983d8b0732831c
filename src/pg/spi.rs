//! SPI helpers: kept plans and small conversions.
//!
//! Hot statements are prepared once per backend and kept (`SPI_keepplan`), keyed by their
//! text; argument types come from the first call's arguments.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::PgOid;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiCursor, SpiHeapTupleData, SpiTupleTable};

use crate::pg::errors::SpiExt;

thread_local! {
    static PLANS: RefCell<HashMap<&'static str, Rc<OwnedPreparedStatement>>> =
        RefCell::new(HashMap::new());
}

/// One row of `first_row_now`'s result.
pub struct NowRow {
    tuple: pgrx::pg_sys::HeapTuple,
    desc: pgrx::pg_sys::TupleDesc,
}

impl NowRow {
    /// Column `col` (from 1), None when NULL.
    pub fn get<T: pgrx::FromDatum>(&self, col: usize) -> Option<T> {
        let mut isnull = false;
        // SAFETY: the tuple and descriptor are SPI's result of the query just run, alive
        // until the next SPI call; `col` is checked by SPI_getbinval (an ERROR if out of
        // range); the value is converted (copied) at its column's own type.
        unsafe {
            let d = pgrx::pg_sys::SPI_getbinval(self.tuple, self.desc, col as i32, &mut isnull);
            let oid = pgrx::pg_sys::SPI_gettypeid(self.desc, col as i32);
            T::from_polymorphic_datum(d, isnull, oid)
        }
    }
}

thread_local! {
    static NOW_PLANS: RefCell<HashMap<&'static str, pgrx::pg_sys::SPIPlanPtr>> = RefCell::new(HashMap::new());
}

/// Runs a query of queen's own (a constant) with a snapshot taken now, not the
/// transaction's, and reads its first row with `read` (None: no row). For loading the
/// registries from the database: what they load must be the latest committed state even
/// in a REPEATABLE READ or SERIALIZABLE transaction, whose snapshot may predate commits
/// (a stale load would hand out offsets again, or move a cursor back). `_client` is
/// proof that SPI is connected.
pub fn first_row_now<R>(
    _client: &mut SpiClient<'_>,
    sql: &'static str,
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(&NowRow) -> R,
) -> Option<R> {
    use pgrx::pg_sys;
    let plan = now_plan(sql, args);
    let (mut values, nulls) = datums(args);
    // The plan's locks first, then the snapshot: a TRUNCATE that commits while this waits
    // for its lock (the worker emptying a journal table it has just saved) is then seen
    // whole, the rows it saved included. The locks last until the transaction ends, as
    // any query's do.
    // SAFETY: a kept (saved) plan of this backend; the cached plan is released at once with
    // the resource owner it was taken with (a saved plan's: CurrentResourceOwner).
    unsafe {
        let cplan = pg_sys::SPI_plan_get_cached_plan(plan);
        if !cplan.is_null() {
            pg_sys::ReleaseCachedPlan(cplan, pg_sys::CurrentResourceOwner);
        }
    }
    // SAFETY: a kept plan of this backend, with as many arguments as it was prepared
    // with (the same call site's); the snapshot GetLatestSnapshot returns is valid until
    // the next one is taken, and SPI registers it for the query's duration; read-only,
    // so the query runs on exactly that snapshot. The result is read before any other
    // SPI call.
    unsafe {
        let rc = pg_sys::SPI_execute_snapshot(
            plan,
            values.as_mut_ptr(),
            nulls.as_ptr(),
            pg_sys::GetLatestSnapshot(),
            std::ptr::null_mut(),
            true,
            false,
            1,
        );
        if rc != pg_sys::SPI_OK_SELECT as i32 {
            crate::pg::errors::internal(format_args!("SPI_execute_snapshot returned {rc}"));
        }
        let table = pg_sys::SPI_tuptable;
        if pg_sys::SPI_processed == 0 || table.is_null() {
            return None;
        }
        Some(read(&NowRow { tuple: *(*table).vals, desc: (*table).tupdesc }))
    }
}

/// `first_row_now`'s plan of `sql`: prepared with the types of `args` on first use, and
/// kept for the backend's life.
fn now_plan(sql: &'static str, args: &[DatumWithOid<'_>]) -> pgrx::pg_sys::SPIPlanPtr {
    use pgrx::pg_sys;
    if let Some(plan) = NOW_PLANS.with(|p| p.borrow().get(sql).copied()) {
        return plan;
    }
    let text = std::ffi::CString::new(sql).expect("no NUL in queen's SQL");
    let mut types: Vec<pg_sys::Oid> = args.iter().map(|a| a.oid()).collect();
    // SAFETY: SPI is connected (the caller's `_client`); the text and types outlive the
    // call; the plan is kept (moved out of the SPI procedure's memory) before it is cached.
    let plan = unsafe {
        let plan = pg_sys::SPI_prepare(text.as_ptr(), types.len() as i32, types.as_mut_ptr());
        if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
            crate::pg::errors::internal(format_args!("cannot prepare {sql}"));
        }
        plan
    };
    NOW_PLANS.with(|p| p.borrow_mut().insert(sql, plan));
    plan
}

/// The arguments as SPI takes them: datums, and a null flag each (`'n'` or `' '`).
fn datums(args: &[DatumWithOid<'_>]) -> (Vec<pgrx::pg_sys::Datum>, Vec<std::os::raw::c_char>) {
    let mut values = Vec::with_capacity(args.len());
    let mut nulls = Vec::with_capacity(args.len());
    for a in args {
        match a.datum() {
            Some(d) => {
                values.push(d.sans_lifetime());
                nulls.push(b' ' as std::os::raw::c_char);
            }
            None => {
                values.push(pgrx::pg_sys::Datum::from(0usize));
                nulls.push(b'n' as std::os::raw::c_char);
            }
        }
    }
    (values, nulls)
}

/// The kept plan of `sql`, prepared on first use with the types of `args`.
fn kept_plan(client: &mut SpiClient<'_>, sql: &'static str, args: &[DatumWithOid<'_>]) -> Rc<OwnedPreparedStatement> {
    if let Some(p) = PLANS.with(|p| p.borrow().get(sql).cloned()) {
        return p;
    }
    let types: Vec<PgOid> = args.iter().map(|a| PgOid::from(a.oid())).collect();
    let kept = Rc::new(client.prepare_mut(sql, &types).or_raise().keep());
    PLANS.with(|p| p.borrow_mut().insert(sql, kept.clone()));
    kept
}

/// Runs `sql` (a constant, never built from input) as a kept plan with `args`.
///
/// Not through pgrx's `update`: that asks for a transaction id first (`mark_mutable`), so a
/// read would give its transaction an xid, and with it a commit record, a clog entry and a
/// WAL writer wake-up at commit: the cost of a write, for a pop that writes nothing. The
/// plan is prepared as mutating (`kept_plan`), so SPI runs it read-write either way (a
/// new snapshot, and the command counter moved on after it); a statement that writes gets
/// its xid from PostgreSQL when it writes, as any statement does.
pub fn run<'conn>(client: &mut SpiClient<'conn>, sql: &'static str, args: &[DatumWithOid<'_>]) -> SpiTupleTable<'conn> {
    let plan = kept_plan(client, sql, args);
    client.select(&*plan, None, args).or_raise()
}

/// Runs `sql` like `run`, maps its rows with `f`, and frees its result at once rather than
/// when the SPI connection ends (see `fetch_one`): for a statement run once per item of a
/// loop, such as per partition.
pub fn run_map<T>(
    client: &mut SpiClient<'_>,
    sql: &'static str,
    args: &[DatumWithOid<'_>],
    f: impl FnMut(SpiHeapTupleData<'_>) -> T,
) -> Vec<T> {
    let (result, out) = {
        let table = run(client, sql, args);
        // SAFETY: a plain read of the result the statement just set.
        let result = unsafe { pgrx::pg_sys::SPI_tuptable };
        (result, table.map(f).collect())
    };
    if !result.is_null() {
        // SAFETY: the statement's own result, of this SPI connection, freed once: its rows
        // were converted (copied) by `f`, and the table pgrx made of it is gone.
        unsafe { pgrx::pg_sys::SPI_freetuptable(result) };
    }
    out
}

/// Opens a cursor over `sql` (a constant query) as a kept plan with `args`: its rows are
/// read with `fetch_one`. It is closed when dropped.
pub fn cursor<'conn>(client: &mut SpiClient<'conn>, sql: &'static str, args: &[DatumWithOid<'_>]) -> SpiCursor<'conn> {
    let plan = kept_plan(client, sql, args);
    // Read-write, without asking for an xid first (see `run`).
    client.try_open_cursor(&*plan, args).or_raise()
}

/// Reads the next row of `cursor` with `read` (None at the end), then frees the row. pgrx
/// keeps every result an SPI connection fetched until the connection ends (a
/// `SpiTupleTable` does not free its tuples when dropped); a loop over many rows frees
/// each one here instead. `read` may run other statements.
pub fn fetch_one<R>(cursor: &mut SpiCursor<'_>, read: impl FnOnce(SpiHeapTupleData<'_>) -> R) -> Option<R> {
    let (result, out) = {
        let mut table = cursor.fetch(1).or_raise();
        // SAFETY: a plain read of the result the fetch just set.
        let result = unsafe { pgrx::pg_sys::SPI_tuptable };
        (result, table.next().map(read))
    };
    if !result.is_null() {
        // SAFETY: the fetch's own result, of this SPI connection, freed once: nothing refers
        // to it any more (the row and the table that pgrx made of it are gone; a statement
        // that `read` ran has a result of its own).
        unsafe { pgrx::pg_sys::SPI_freetuptable(result) };
    }
    out
}

/// Runs a statement built at run time (utility statements whose object names are quoted
/// identifiers or `regprocedure` text from the catalog, never raw input), without keeping
/// a plan.
pub fn run_built(client: &mut SpiClient<'_>, sql: &str) {
    client.update(sql, None, &[]).or_raise();
}

/// Runs `f` with the search path pinned to `pg_catalog` alone (no `pg_temp`, nothing of the
/// caller's): the same protection as a function's `SET search_path`, without the cost of
/// a configuration change on every call. Every name queen's SQL uses is schema-qualified
/// or in `pg_catalog`, and kept plans are checked against this path, so a caller's
/// `search_path` can neither hijack an operator nor force a re-plan. An ERROR inside `f`
/// ends the transaction or subtransaction, which drops the pinned path with it.
pub fn with_pinned_search_path<R>(f: impl FnOnce() -> R) -> R {
    let mut path = pgrx::pg_sys::OverrideSearchPath {
        schemas: std::ptr::null_mut(),
        addCatalog: true,
        addTemp: false,
        generation: 0,
    };
    // SAFETY: PushOverrideSearchPath copies the struct into its own memory; the matching
    // Pop below runs unless `f` raises, and then transaction cleanup pops it.
    unsafe { pgrx::pg_sys::PushOverrideSearchPath(&mut path) };
    let out = f();
    // SAFETY: pops the entry pushed above (queen pushes no other override in between).
    unsafe { pgrx::pg_sys::PopOverrideSearchPath() };
    out
}

/// Runs `f` as queen's hot calls (pop, ack, extend_lease) run their statements: the
/// search path pinned (`with_pinned_search_path`), and two planner settings set for the
/// call only, as a function's `SET` clauses would set them, but without their cost (a
/// `SET` clause is a configuration change on entry and another on exit, about 18,000
/// instructions each on every call; a pop and an ack had five between them):
/// - `plan_cache_mode = force_generic_plan`: queen's statements are kept plans over
///   indexes whose best plan does not depend on the parameter values; without it
///   PostgreSQL re-plans them for every call (custom plans), which cost about a sixth of a
///   pop;
/// - `enable_seqscan = off`: a generic plan is made once per session, from the statistics
///   of that moment; on a young queue's tiny tables they favour sequential scans and hash
///   joins, which the kept plan then repeats as the tables grow. Every hot statement of
///   queen has an index made for it.
///
/// The two settings are the server's own variables, written directly and put back when
/// `f` returns or unwinds: an ERROR inside `f` reaches here as a Rust panic, so the guard
/// restores them before the ERROR propagates. (The search path, by contrast, is a stack
/// that transaction cleanup pops; these variables have no such cleanup, hence the guard.)
///
/// Rule: nothing inside `f` may set either setting: no `SET LOCAL` or `set_config` of
/// them in queen's statements, and no call of a function with a `SET` clause of them (as
/// `queen.peek` has). Such a change saves the forced value as its prior one, and the
/// transaction's end (or an ERROR's) would put that forced value back after this guard
/// ran: the session would keep it.
pub fn with_queen_plan_settings<R>(f: impl FnOnce() -> R) -> R {
    struct Restore {
        seqscan: bool,
        mode: std::ffi::c_int,
    }
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: plain writes of two configuration variables of this backend, putting
            // back the values read below.
            unsafe {
                pgrx::pg_sys::enable_seqscan = self.seqscan;
                pgrx::pg_sys::plan_cache_mode = self.mode;
            }
        }
    }
    // SAFETY: plain reads and writes of two configuration variables of this backend (a
    // single thread); the planner reads them when it plans or chooses a plan.
    let _restore = unsafe {
        let before = Restore { seqscan: pgrx::pg_sys::enable_seqscan, mode: pgrx::pg_sys::plan_cache_mode };
        pgrx::pg_sys::enable_seqscan = false;
        pgrx::pg_sys::plan_cache_mode =
            pgrx::pg_sys::PlanCacheMode::PLAN_CACHE_MODE_FORCE_GENERIC_PLAN as std::ffi::c_int;
        before
    };
    with_pinned_search_path(f)
}

/// The first column of the first row, or None when the statement returned no row.
pub fn first_value<T: pgrx::IntoDatum + pgrx::FromDatum>(table: SpiTupleTable<'_>) -> Option<T> {
    if table.is_empty() {
        return None;
    }
    table.first().get_one::<T>().or_raise()
}
