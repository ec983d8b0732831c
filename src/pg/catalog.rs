//! The OIDs of queen's own schemas and tables, looked up by name once per backend.
//!
//! A single-message push used to look up the `queen` schema and a table by name three
//! times (the queue lock's tag, the fresh-segment insert, the Citus check): a syscache probe
//! each, a measurable share of the call. The answers (including "no such schema") are kept
//! per backend until `pg_namespace` or `pg_class` changes: a syscache callback on those
//! catalogs (any row of this database: creating, dropping or renaming a schema or a
//! table, and also the statistics updates VACUUM makes; and any full cache reset) forgets
//! them all, and the next use looks them up again. PostgreSQL runs the callback when it processes invalidations,
//! before a lookup could see the change, and also for this backend's own changes, at the
//! command that makes them and when a transaction rolls them back.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::prelude::*;

thread_local! {
    /// (schema, table or "" for the schema itself) -> OID, InvalidOid when missing, as of
    /// `SEEN`.
    static OIDS: RefCell<Vec<(&'static CStr, &'static CStr, pg_sys::Oid)>> = const { RefCell::new(Vec::new()) };
    static SEEN: Cell<u64> = const { Cell::new(0) };
    /// Bumped by the callback, which may run in the middle of anything: the cache is
    /// cleared at its next use.
    static CHANGES: Cell<u64> = const { Cell::new(0) };
}

/// The syscache callback on `pg_namespace` and `pg_class` (registered by `hooks`): forget
/// every OID.
///
/// # Safety
/// Called by PostgreSQL only, as a syscache callback.
#[pg_guard]
pub unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    CHANGES.with(|c| c.set(c.get() + 1));
}

fn oid(schema: &'static CStr, table: &'static CStr) -> pg_sys::Oid {
    let before = CHANGES.with(Cell::get);
    if SEEN.with(|s| s.replace(before)) != before {
        OIDS.with(|o| o.borrow_mut().clear());
    }
    // The names are static strings: the same literal is usually the same pointer, which
    // is compared first, then the bytes.
    let same = |a: &'static CStr, b: &'static CStr| std::ptr::eq(a, b) || a == b;
    let hit = OIDS.with(|o| o.borrow().iter().find(|e| same(e.0, schema) && same(e.1, table)).map(|e| e.2));
    if let Some(oid) = hit {
        return oid;
    }
    // SAFETY: plain catalog lookups by name (missing_ok), valid inside a transaction.
    let found = unsafe {
        let ns = pg_sys::get_namespace_oid(schema.as_ptr(), true);
        if table.is_empty() || ns == pg_sys::InvalidOid {
            ns
        } else {
            pg_sys::get_relname_relid(table.as_ptr(), ns)
        }
    };
    // Kept only when no change arrived during the lookup (the next call looks again).
    if CHANGES.with(Cell::get) == before {
        OIDS.with(|o| o.borrow_mut().push((schema, table, found)));
    }
    found
}
/// The OID of table `name` in schema `queen`, InvalidOid when there is none.
pub fn queen_table(name: &'static CStr) -> pg_sys::Oid {
    oid(c"queen", name)
}

/// Whether table `table` of schema `queen` has column `column` (a syscache lookup): false
/// on a schema older than the library, before `ALTER EXTENSION queen UPDATE` added it.
pub fn queen_column(table: &'static CStr, column: &'static CStr) -> bool {
    let relid = queen_table(table);
    // SAFETY: a syscache lookup by relation OID and a NUL-terminated name; an invalid OID
    // finds nothing.
    relid != pg_sys::InvalidOid && unsafe { pg_sys::get_attnum(relid, column.as_ptr()) } > 0
}

/// The OID of schema `queen`, InvalidOid when there is none.
pub fn queen_schema() -> pg_sys::Oid {
    oid(c"queen", c"")
}

/// Whether schema `name` exists.
pub fn schema_exists(name: &'static CStr) -> bool {
    oid(name, c"") != pg_sys::InvalidOid
}
