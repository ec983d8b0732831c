//! Set-returning C functions: the version-1 declaration, argument access, and a result
//! returned all at once in a tuplestore (PostgreSQL's materialize mode).
//!
//! push, push_batch and pop are plain C functions rather than pgrx set-returning ones:
//! pgrx returns one row per call, and its per-call protocol (a call per row, a memory
//! context, the row type looked up again) cost about 5 % of a one-message push and a
//! quarter of a pop of 100 (with the PL/pgSQL wrapper pop needed for its SET clauses,
//! which a value-per-call function would run once per row).

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::pg::errors;

/// Declares a version-1 C function to PostgreSQL (what `PG_FUNCTION_INFO_V1` does in C).
macro_rules! function_info_v1 {
    ($finfo:ident) => {
        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static pgrx::pg_sys::Pg_finfo_record {
            const V1: pgrx::pg_sys::Pg_finfo_record = pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }
    };
}
pub(crate) use function_info_v1;

/// Defines `$symbol`, a C symbol that an older release's SQL still names (with its `$finfo`
/// record), as a stub that raises `errors::older_sql`. A database whose SQL is still the
/// older one when this library is loaded (after an upgrade's restart, before `ALTER
/// EXTENSION queen UPDATE`) gets that error instead of a call of new code with the wrong
/// arguments, or "could not find function". `$doc` says what the symbol was.
macro_rules! older_sql_symbol {
    ($finfo:ident, $symbol:ident, $doc:literal) => {
        crate::pg::srf::function_info_v1!($finfo);

        #[doc = $doc]
        ///
        /// # Safety
        /// Called by PostgreSQL only.
        #[no_mangle]
        #[pgrx::pg_guard]
        pub unsafe extern "C-unwind" fn $symbol(_fcinfo: pgrx::pg_sys::FunctionCallInfo) -> pgrx::pg_sys::Datum {
            crate::pg::errors::older_sql()
        }
    };
}
pub(crate) use older_sql_symbol;

/// Argument `n` of the call, None when NULL.
///
/// # Safety
/// `fcinfo` is the current call's, with at least `n + 1` arguments, and argument `n` has a
/// SQL type whose datums `T` reads.
pub unsafe fn arg<T: FromDatum>(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<T> {
    // SAFETY: as the caller promises.
    unsafe { pgrx::fcinfo::pg_getarg::<T>(fcinfo, n) }
}

/// Where a set-returning C function's rows go: a tuplestore of `N` columns.
pub struct ResultRows<const N: usize> {
    fcinfo: pg_sys::FunctionCallInfo,
    store: *mut pg_sys::Tuplestorestate,
    desc: pg_sys::TupleDesc,
    /// Where a row's datums are built; reset after each row (the store keeps its copy).
    row_memory: pg_sys::MemoryContext,
}

impl<const N: usize> ResultRows<N> {
    /// Sets up the result, before the function does anything: a caller that cannot take a
    /// set is refused (0A000) first. `row_type` names the declared result type in the
    /// internal error raised when it does not have `N` columns.
    ///
    /// # Safety
    /// `fcinfo` is the current call's, of a function declared `RETURNS SETOF` a composite
    /// type whose `N` columns take the datums `put` is given.
    pub unsafe fn begin(fcinfo: pg_sys::FunctionCallInfo, row_type: &str) -> Self {
        // SAFETY: InitMaterializedSRF checks that the caller takes a tuplestore (and raises
        // 0A000 otherwise), creates it in the query's memory and sets the descriptor, taken
        // from the caller's expected row type when there is one (FROM and the select list
        // both give one for a composite result), else from the function's declared type.
        // After it, `rsinfo` is a valid ReturnSetInfo whose descriptor has `natts`
        // attributes. The row context is a child of the call's current context, so it goes
        // with it whatever happens.
        unsafe {
            let rsinfo = (*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo;
            let expected = !rsinfo.is_null()
                && (*rsinfo).type_ == pg_sys::NodeTag::T_ReturnSetInfo
                && !(*rsinfo).expectedDesc.is_null();
            let flags = if expected { pg_sys::MAT_SRF_USE_EXPECTED_DESC } else { 0 };
            pg_sys::InitMaterializedSRF(fcinfo, flags);
            let (store, desc) = ((*rsinfo).setResult, (*rsinfo).setDesc);
            // N columns, none dropped: anything else is not the declared row type.
            let attrs = (*desc).attrs.as_slice((*desc).natts as usize);
            if attrs.len() != N || attrs.iter().any(|a| a.attisdropped) {
                errors::internal(format_args!("{row_type} does not have the {N} columns this function returns"));
            }
            let row_memory = pg_sys::AllocSetContextCreateExtended(
                pg_sys::CurrentMemoryContext,
                c"queen result row".as_ptr(),
                pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            );
            ResultRows { fcinfo, store, desc, row_memory }
        }
    }

    /// Stores one row: `build` returns its datums (of the columns' types, in order) and
    /// null flags. They are built in a memory context of their own and freed once the
    /// store has copied them, so a call that returns many rows holds each datum once.
    pub fn put(&mut self, build: impl FnOnce() -> ([pg_sys::Datum; N], [bool; N])) {
        // SAFETY: the row context lives until the call's context ends; `build` runs in it
        // and may raise, which leaves the switch to error cleanup (the current context is
        // reset by the abort).
        let old = unsafe { pg_sys::MemoryContextSwitchTo(self.row_memory) };
        let (mut values, mut nulls) = build();
        // SAFETY: the store and its N-column descriptor (checked in `begin`); every value
        // is a datum of its column's type (the caller's promise), copied into the store's
        // own memory. Then the row's datums are freed.
        unsafe {
            pg_sys::tuplestore_putvalues(self.store, self.desc, values.as_mut_ptr(), nulls.as_mut_ptr());
            pg_sys::MemoryContextSwitchTo(old);
            pg_sys::MemoryContextReset(self.row_memory);
        }
    }

    /// Returns from the call (a materialize-mode function returns a null datum).
    pub fn finish(self) -> pg_sys::Datum {
        // SAFETY: the current call's fcinfo.
        unsafe { (*self.fcinfo).isnull = true };
        pg_sys::Datum::from(0)
    }
}
