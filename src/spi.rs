//! SPI helpers: kept plans and small conversions.
//!
//! Hot statements are prepared once per backend and kept (`SPI_keepplan`), keyed by their
//! text; argument types come from the first call's arguments.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::PgOid;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiTupleTable};

use crate::errors::SpiExt;

thread_local! {
    static PLANS: RefCell<HashMap<&'static str, Rc<OwnedPreparedStatement>>> =
        RefCell::new(HashMap::new());
}

/// Runs `sql` (a constant, never built from input) as a kept plan with `args`.
pub fn run<'conn>(client: &mut SpiClient<'conn>, sql: &'static str, args: &[DatumWithOid<'_>]) -> SpiTupleTable<'conn> {
    let plan = PLANS.with(|p| p.borrow().get(sql).cloned());
    let plan = match plan {
        Some(p) => p,
        None => {
            let types: Vec<PgOid> = args.iter().map(|a| PgOid::from(a.oid())).collect();
            let kept = Rc::new(client.prepare_mut(sql, &types).or_raise().keep());
            PLANS.with(|p| p.borrow_mut().insert(sql, kept.clone()));
            kept
        }
    };
    client.update(&*plan, None, args).or_raise()
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

/// Current wall-clock time in microseconds since 2000-01-01, the clock of
/// `clock_timestamp()`. Leases use it, not `now()`: a pop or ack inside a long
/// transaction must judge expiry by the real time.
pub fn clock_now() -> i64 {
    // SAFETY: a plain clock read.
    unsafe { pgrx::pg_sys::GetCurrentTimestamp() }
}

pub fn timestamptz(micros: i64) -> pgrx::datum::TimestampWithTimeZone {
    pgrx::datum::TimestampWithTimeZone::try_from(micros).unwrap_or_else(|_| crate::errors::invalid("timestamp", micros))
}

pub fn to_pg_uuid(u: uuid::Uuid) -> pgrx::Uuid {
    pgrx::Uuid::from_bytes(*u.as_bytes())
}

pub fn from_pg_uuid(u: &pgrx::Uuid) -> uuid::Uuid {
    uuid::Uuid::from_bytes(**u)
}

/// The first column of the first row, or None when the statement returned no row.
pub fn first_value<T: pgrx::IntoDatum + pgrx::FromDatum>(table: SpiTupleTable<'_>) -> Option<T> {
    if table.is_empty() {
        return None;
    }
    table.first().get_one::<T>().or_raise()
}

thread_local! {
    static IDS: RefCell<Option<queen_core::ids::Uuid7Gen>> = const { RefCell::new(None) };
}

/// A fresh UUIDv7, minted without a syscall (see `queen_core::ids`).
pub fn new_id() -> uuid::Uuid {
    new_ids(1)[0]
}

/// `n` fresh UUIDv7s, in order, with one clock reading.
pub fn new_ids(n: usize) -> Vec<uuid::Uuid> {
    let ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    IDS.with(|g| {
        let mut g = g.borrow_mut();
        let g = g.get_or_insert_with(queen_core::ids::Uuid7Gen::from_entropy);
        (0..n).map(|_| uuid::Uuid::from_bytes(g.next_at(ms))).collect()
    })
}
