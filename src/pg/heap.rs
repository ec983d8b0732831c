//! Direct row inserts for the hottest writes queen has: the segment of a single-message
//! push into `queen.fresh_segments`, in the table of its generation (`fresh_segments_0` or
//! `_1`, a partition: the row goes straight to it, as tuple routing would send it), and the
//! lane journal rows an ack appends (`queen.lane_journal_0` / `_1`).
//!
//! An INSERT through SPI starts and ends a whole executor for a row or two, which profiles
//! showed to be a large share of a one-message push and of an ack of one message. This
//! inserts the heap tuples and their index entries the way PostgreSQL's own catalog code
//! does (`CatalogTupleInsert`): `heap_insert` (which WAL-logs, TOASTs and counts the row),
//! then `index_insert` into every index with the uniqueness check. Nothing the executor
//! would add applies to these internal tables as queen creates them: no triggers,
//! constraints beyond NOT NULL (never violated here), expression, partial or exclusion
//! indexes, deferred uniqueness, rules, partitions of their own or row security (on the
//! table, or on the parent a fallback INSERT names). A DBA may add some of those (an audit
//! or replication trigger, a CHECK, row security): then, as when the table has not the
//! columns given, `insert_rows` reports that it did nothing and the caller uses SQL,
//! whose executor honours them.

use pgrx::pg_sys;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::IntoDatum;

use crate::pg::raw;

/// Inserts one row into `queen.fresh_segments`, generation `generation`. Returns false
/// (having done nothing) when the table is not one this code can write directly.
pub fn insert_fresh_segment(
    pid: pgrx::Uuid,
    first: i64,
    last: i64,
    created_at: i64,
    data: &[u8],
    generation: i16,
) -> bool {
    let table = match generation {
        0 => c"fresh_segments_0",
        1 => c"fresh_segments_1",
        _ => return false,
    };
    // Columns: partition_id, first_offset, last_offset, created_at, data, generation.
    let types =
        [pg_sys::UUIDOID, pg_sys::INT8OID, pg_sys::INT8OID, pg_sys::TIMESTAMPTZOID, pg_sys::BYTEAOID, pg_sys::INT2OID];
    let row = [
        pid.into_datum().unwrap(),
        pg_sys::Datum::from(first),
        pg_sys::Datum::from(last),
        pg_sys::Datum::from(created_at),
        data.into_datum().unwrap(),
        generation.into_datum().unwrap(),
    ];
    // The SQL fallback inserts through the parent, whose statement triggers and row
    // security apply then: they count too.
    let parent = crate::pg::catalog::queen_table(c"fresh_segments");
    insert_rows(crate::pg::catalog::queen_table(table), parent, types, std::iter::once(row))
}

/// Inserts rows of `N` non-null columns of types `types` (datums of those types, in
/// order) into the plain table `relid`, with their index entries, in one pass: the table
/// and its indexes are opened once. Returns false, having done nothing, when `relid` is
/// invalid or is not a table `Target::open` can write, or when `parent` (the table an
/// INSERT of the caller's fallback names, when `relid` is its partition; else
/// `InvalidOid`) has triggers, rules or row security. An index not ready for inserts (one
/// that CREATE INDEX CONCURRENTLY is building) is left to its build, as the executor
/// leaves it. Later statements of the transaction see the rows.
pub fn insert_rows<const N: usize>(
    relid: pg_sys::Oid,
    parent: pg_sys::Oid,
    types: [pg_sys::Oid; N],
    rows: impl IntoIterator<Item = [pg_sys::Datum; N]>,
) -> bool {
    if relid == pg_sys::InvalidOid {
        return false;
    }
    // SAFETY: called inside a transaction from a queen function. Every pointer comes from
    // PostgreSQL and is used while the relation is open and locked (RowExclusiveLock, held
    // to the end of the transaction as an INSERT would); the tuples and the slot are freed
    // here; an ERROR (a unique violation, say) unwinds through pgrx and the transaction's
    // resource owner closes what is open. The caller promises each datum's type. The
    // guarded closures make only `raw` calls on plain values and pointers (`pg::raw`).
    unsafe {
        if parent != pg_sys::InvalidOid && !Target::plain_parent(parent) {
            return false;
        }
        let Some(target) = Target::open(relid, types) else {
            return false;
        };
        let desc = (*target.rel).rd_att;
        // PostgreSQL's calls a few at a time under one guard (`pg::raw`).
        let (slot, cid) = pg_guard_ffi_boundary(|| {
            (raw::MakeSingleTupleTableSlot(desc, &pg_sys::TTSOpsHeapTuple), raw::GetCurrentCommandId(true))
        });
        for values in rows {
            target.insert(slot, cid, values);
        }
        pg_guard_ffi_boundary(|| raw::ExecDropSingleTupleTableSlot(slot));
        target.close(pg_sys::NoLock as pg_sys::LOCKMODE);
        // As SPI does after each statement: later statements see the rows.
        pg_sys::CommandCounterIncrement();
        true
    }
}

/// At most this many indexes are written directly (queen's tables have one).
const MAX_INDEXES: usize = 4;

/// A table opened for `insert_rows`, with its indexes and their IndexInfo.
struct Target {
    rel: pg_sys::Relation,
    indexes: [(pg_sys::Relation, *mut pg_sys::IndexInfo); MAX_INDEXES],
    count: usize,
}

impl Target {
    const LOCK: pg_sys::LOCKMODE = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;

    /// Whether the parent table `relid` has nothing an INSERT through it would apply to
    /// the row: triggers (statement triggers stay on the parent), rules or row security.
    /// Locked as such an INSERT would lock it.
    ///
    /// # Safety
    /// Inside a transaction; `relid` names a table.
    unsafe fn plain_parent(relid: pg_sys::Oid) -> bool {
        // SAFETY: the caller's promise; the relation is read while open and locked.
        unsafe {
            let rel = pg_sys::table_open(relid, Self::LOCK);
            let plain = (*rel).trigdesc.is_null() && !(*(*rel).rd_rel).relhasrules && !(*(*rel).rd_rel).relrowsecurity;
            pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            plain
        }
    }

    /// Opens `relid` and its indexes under RowExclusiveLock; None (with all closed again)
    /// when its columns are not `types`; it has triggers, rules, CHECK constraints or row
    /// security; or its indexes are too many, or one has expressions, a predicate, an
    /// exclusion constraint or deferred uniqueness.
    ///
    /// # Safety
    /// Inside a transaction; `relid` names a plain table.
    unsafe fn open<const N: usize>(relid: pg_sys::Oid, types: [pg_sys::Oid; N]) -> Option<Target> {
        // SAFETY: the caller's promise; the index list is a copy, freed here, and each
        // index is opened under the same lock as its table. The guarded closures make
        // only `raw` calls, the second in a loop over a slice (`pg::raw`).
        unsafe {
            let (rel, list) = pg_guard_ffi_boundary(|| {
                let rel = raw::table_open(relid, Self::LOCK);
                // A copy of the relcache's list of the table's indexes.
                (rel, raw::RelationGetIndexList(rel))
            });
            let desc = (*rel).rd_att;
            let count = if list.is_null() { 0 } else { (*list).length as usize };
            let attrs = (*desc).attrs.as_slice((*desc).natts as usize);
            let constr = (*desc).constr;
            let fits = count <= MAX_INDEXES
                && attrs.len() == N
                && attrs.iter().zip(types).all(|(a, t)| !a.attisdropped && a.atttypid == t)
                && (*rel).trigdesc.is_null()
                && !(*(*rel).rd_rel).relhasrules
                && (constr.is_null() || (*constr).num_check == 0)
                && !(*(*rel).rd_rel).relrowsecurity;
            let mut target =
                Target { rel, indexes: [(std::ptr::null_mut(), std::ptr::null_mut()); MAX_INDEXES], count: 0 };
            if fits {
                // `count` fits `indexes` (above): sliced here, outside the guard.
                let opened = &mut target.indexes[..count];
                pg_guard_ffi_boundary(|| {
                    for (i, entry) in opened.iter_mut().enumerate() {
                        let irel = raw::index_open((*(*list).elements.add(i)).oid_value, Self::LOCK);
                        *entry = (irel, raw::BuildIndexInfo(irel));
                    }
                });
                target.count = count;
            }
            if !list.is_null() {
                pg_sys::list_free(list);
            }
            let plain = target.opened().iter().all(|&(irel, info)| {
                (*info).ii_Expressions.is_null()
                    && (*info).ii_Predicate.is_null()
                    && (*info).ii_ExclusionOps.is_null()
                    && (*(*irel).rd_index).indimmediate
            });
            if !fits || !plain {
                target.close(Self::LOCK);
                return None;
            }
            Some(target)
        }
    }

    fn opened(&self) -> &[(pg_sys::Relation, *mut pg_sys::IndexInfo)] {
        &self.indexes[..self.count]
    }

    /// Inserts one row (`values`, non-null datums of the table's column types) and its
    /// entries in every index ready for inserts (one that CREATE INDEX CONCURRENTLY is
    /// building is left to its build, as the executor leaves it), through `slot` (a slot
    /// of the table's descriptor, left empty), under one guard.
    ///
    /// # Safety
    /// The table and its indexes are open and locked for inserts; `slot` is a heap-tuple
    /// slot (`TTSOpsHeapTuple`) of the table's descriptor; `values` are datums of the
    /// table's column types, in order; `cid` is the current command's id.
    unsafe fn insert<const N: usize>(
        &self,
        slot: *mut pg_sys::TupleTableSlot,
        cid: pg_sys::CommandId,
        mut values: [pg_sys::Datum; N],
    ) {
        let mut nulls = [false; N];
        // Index entries: the column values and nulls, filled for each index in turn.
        let mut ivalues = [pg_sys::Datum::from(0usize); pg_sys::INDEX_MAX_KEYS as usize];
        let mut inulls = [false; pg_sys::INDEX_MAX_KEYS as usize];
        let (rel, indexes) = (self.rel, self.opened());
        // SAFETY: the caller's promise; in the guarded closure only PostgreSQL's calls, on
        // plain values and pointers, and a loop over a slice (`pg::raw`).
        unsafe {
            pg_guard_ffi_boundary(|| {
                let desc = (*rel).rd_att;
                let tup = raw::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr());
                raw::heap_insert(rel, tup, cid, 0, std::ptr::null_mut());
                raw::ExecStoreHeapTuple(tup, slot, false);
                for &(irel, info) in indexes {
                    if !(*info).ii_ReadyForInserts {
                        continue;
                    }
                    raw::FormIndexDatum(info, slot, std::ptr::null_mut(), ivalues.as_mut_ptr(), inulls.as_mut_ptr());
                    let unique = if (*info).ii_Unique {
                        pg_sys::IndexUniqueCheck::UNIQUE_CHECK_YES
                    } else {
                        pg_sys::IndexUniqueCheck::UNIQUE_CHECK_NO
                    };
                    raw::index_insert(
                        irel,
                        ivalues.as_mut_ptr(),
                        inulls.as_mut_ptr(),
                        &mut (*tup).t_self,
                        rel,
                        unique,
                        false,
                        info,
                    );
                }
                raw::ExecClearTuple(slot);
                raw::heap_freetuple(tup);
            })
        }
    }

    /// Closes the indexes and the table, releasing `lock` (NoLock: held to the end of the
    /// transaction).
    ///
    /// # Safety
    /// The relations are open, and not used after this.
    unsafe fn close(self, lock: pg_sys::LOCKMODE) {
        let (rel, indexes) = (self.rel, self.opened());
        // SAFETY: the caller's promise; only PostgreSQL's calls and a loop over a slice
        // under the guard (`pg::raw`).
        unsafe {
            pg_guard_ffi_boundary(|| {
                for &(irel, _) in indexes {
                    raw::index_close(irel, lock);
                }
                raw::table_close(rel, lock);
            })
        }
    }
}
