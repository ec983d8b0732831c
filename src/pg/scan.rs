//! Direct index scans for the hottest reads queen has: a pop's read of a lane's segments
//! and its scan of a group's lanes.
//!
//! A statement through SPI starts and ends a whole executor (plan cache check, executor
//! start with a node per table and per partition, portal, tuple table) for a few index
//! probes. Profiles of a live queue, where a pop takes one to three messages, showed those
//! statements to be a quarter of a consumer's CPU. This reads the same rows the way
//! PostgreSQL's own catalog code does (`systable_beginscan`): the table and one of its
//! btree indexes opened under AccessShareLock (held to the end of the transaction, as a
//! statement would), an index scan with scan keys, and one slot per scan, refilled for
//! each row.
//!
//! `StatementSnapshot` gives the scans of one read the snapshot a statement would have
//! had: the command counter advanced (earlier writes of the transaction are seen) and,
//! under READ COMMITTED, a new snapshot; under REPEATABLE READ the transaction's. All the
//! scans under one `StatementSnapshot` see the same committed state, as the tables of one
//! statement do. Callers open their tables (`Table::open`, which locks them) before they
//! take the snapshot, as a statement takes its locks before its snapshot
//! (docs/concepts.md, "Segment generations", relies on that order).

use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;

use crate::pg::raw;

/// The snapshot of one read made of several scans, active while it lives.
pub struct StatementSnapshot(pg_sys::Snapshot);

impl StatementSnapshot {
    /// Advances the command counter and pushes the snapshot a new statement would get.
    pub fn take() -> StatementSnapshot {
        // SAFETY: inside a transaction, as any SPI statement is; the pushed snapshot is
        // popped by `drop`, or by the transaction's abort after an ERROR. The guarded
        // closure makes only `raw` calls (`pg::raw` says what it must not do).
        unsafe {
            StatementSnapshot(pg_guard_ffi_boundary(|| {
                raw::CommandCounterIncrement();
                raw::PushActiveSnapshot(raw::GetTransactionSnapshot());
                raw::UpdateActiveSnapshotCommandId();
                raw::GetActiveSnapshot()
            }))
        }
    }
}

impl Drop for StatementSnapshot {
    fn drop(&mut self) {
        // While unwinding from an ERROR, PostgreSQL is not called: the transaction's (or
        // subtransaction's) abort pops every snapshot pushed since it began, this one too.
        if !std::thread::panicking() {
            // SAFETY: the snapshot `take` pushed is still the active one: every scan that
            // used it has ended (they borrow `self`), and nothing here pushes another.
            unsafe {
                debug_assert!(pg_sys::GetActiveSnapshot() == self.0, "the read's snapshot is on top");
                pg_sys::PopActiveSnapshot();
            }
        }
    }
}

/// A table open for scans of one of its btree indexes. Callers find their columns by name
/// and type (`column`): a partition's columns may sit elsewhere than its parent's.
pub struct Table {
    rel: pg_sys::Relation,
    index: pg_sys::Relation,
}

/// One key of a scan: index column `column` (1-based) compared by the btree strategy
/// `strategy` with `proc` (a comparison function of the column's type) to `arg`.
#[derive(Clone, Copy)]
pub struct Key {
    pub column: i16,
    pub strategy: u16,
    pub proc: pg_sys::Oid,
    pub arg: pg_sys::Datum,
}

impl Key {
    /// Index column `column` compared to `arg` with the btree strategy `strategy`
    /// (`pg_sys::BTEqualStrategyNumber`, ...) by the function `proc` (`pg_sys::F_INT8EQ`, ...).
    pub fn new(column: i16, strategy: u32, proc: u32, arg: pg_sys::Datum) -> Key {
        Key { column, strategy: strategy as u16, proc: pg_sys::Oid::from(proc), arg }
    }
}

/// The attribute number of column `name` of the open relation `rel`, None when it has none.
///
/// # Safety
/// `rel` is open.
unsafe fn column_of(rel: pg_sys::Relation, name: &CStr) -> Option<i16> {
    // SAFETY: the caller's promise; the tuple descriptor lives while the relation is open.
    unsafe {
        let desc = (*rel).rd_att;
        let attrs = (*desc).attrs.as_slice((*desc).natts as usize);
        attrs
            .iter()
            .position(|a| !a.attisdropped && CStr::from_ptr(a.attname.data.as_ptr()) == name)
            .map(|i| i as i16 + 1)
    }
}

impl Table {
    const LOCK: pg_sys::LOCKMODE = pg_sys::AccessShareLock as pg_sys::LOCKMODE;

    /// Opens the table `relid` and its index `index` (None: its primary key) under
    /// AccessShareLock. None (with nothing left open, but the locks kept) when `relid` is
    /// InvalidOid or not a plain table, the table has no such index, or the index is not a
    /// valid, ready, plain (no expression, no predicate) btree index of the table whose
    /// leading key columns are the table's columns `leading`, by name and type. An OID that
    /// names no relation any more is an ERROR, as for a statement.
    ///
    /// A read that trusted an index it should not (a partial one, say) would miss rows, and
    /// a message missed is a gap a pop passes over: hence the checks, and the callers'
    /// statements when they fail.
    pub fn open(relid: pg_sys::Oid, index: Option<pg_sys::Oid>, leading: &[(&CStr, pg_sys::Oid)]) -> Option<Table> {
        if relid == pg_sys::InvalidOid {
            return None;
        }
        // SAFETY: opening relations by OID under a lock inside a transaction (an OID that
        // names no relation raises an ERROR, through pgrx). The index is checked to belong
        // to the table, and to be what the scans expect, before a `Table` is made of them;
        // when it is not, both are closed here once (their locks kept, as a statement's
        // would be), and no `Table` exists to close them again. The guarded closures make
        // only `raw` calls on plain values and pointers (`pg::raw`).
        unsafe {
            let (rel, index) = pg_guard_ffi_boundary(|| {
                let rel = raw::table_open(relid, Self::LOCK);
                let index = match index {
                    Some(index) => index,
                    None => raw::RelationGetPrimaryKeyIndex(rel),
                };
                if index == pg_sys::InvalidOid {
                    raw::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
                    return None;
                }
                Some((rel, raw::index_open(index, Self::LOCK)))
            })?;
            // The index's expressions and predicate (both must be null): read under one guard.
            let (no_expressions, no_predicate) = pg_guard_ffi_boundary(|| {
                let tuple = (*index).rd_indextuple;
                (
                    raw::heap_attisnull(tuple, pg_sys::Anum_pg_index_indexprs as i32, std::ptr::null_mut()),
                    raw::heap_attisnull(tuple, pg_sys::Anum_pg_index_indpred as i32, std::ptr::null_mut()),
                )
            });
            let form = (*index).rd_index;
            let keys = (*form).indkey.values.as_slice((*form).indnkeyatts as usize);
            let kind = |r: pg_sys::Relation, k: u8| (*(*r).rd_rel).relkind == k as std::ffi::c_char;
            let typed = |attno: i16| {
                let desc = (*rel).rd_att;
                (1..=(*desc).natts as i16)
                    .contains(&attno)
                    .then(|| (*desc).attrs.as_slice((*desc).natts as usize)[attno as usize - 1].atttypid)
            };
            let fits = kind(rel, pg_sys::RELKIND_RELATION)
                && kind(index, pg_sys::RELKIND_INDEX)
                && (*form).indrelid == relid
                && (*form).indisvalid
                && (*form).indisready
                && (*form).indislive
                && (*(*index).rd_rel).relam == pg_sys::BTREE_AM_OID
                && no_expressions
                && no_predicate
                && keys.len() >= leading.len()
                && leading
                    .iter()
                    .zip(keys)
                    .all(|(&(name, ty), &attno)| column_of(rel, name) == Some(attno) && typed(attno) == Some(ty));
            if !fits {
                pg_guard_ffi_boundary(|| {
                    raw::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
                    raw::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
                });
                return None;
            }
            Some(Table { rel, index })
        }
    }

    /// The attribute number of column `name` of type `ty`, None when the table has none.
    pub fn column(&self, name: &CStr, ty: pg_sys::Oid) -> Option<i16> {
        // SAFETY: the relation is open while `self` lives; `column_of` gives a valid
        // attribute number of its descriptor.
        unsafe {
            let attno = column_of(self.rel, name)?;
            let desc = (*self.rel).rd_att;
            ((*desc).attrs.as_slice((*desc).natts as usize)[attno as usize - 1].atttypid == ty).then_some(attno)
        }
    }

    /// Starts a scan of the index with `keys` (at most `MAX_KEYS`), under `snapshot`,
    /// backward (from the highest key) when `backward`.
    pub fn scan<'s>(&'s self, snapshot: &'s StatementSnapshot, keys: &[Key], backward: bool) -> Scan<'s> {
        assert!(keys.len() <= MAX_KEYS, "at most {MAX_KEYS} scan keys");
        // SAFETY: the table and index are open and locked; the slot fits the table's rows.
        // The guarded closure makes only `raw` calls (`pg::raw`).
        // Everything is ended by `Scan::drop`, or by the transaction's resource owner
        // after an ERROR.
        unsafe {
            let (rel, index) = (self.rel, self.index);
            let (desc, slot) = pg_guard_ffi_boundary(|| {
                (
                    raw::index_beginscan(rel, index, snapshot.0, keys.len() as i32, 0),
                    raw::table_slot_create(rel, std::ptr::null_mut()),
                )
            });
            let direction = if backward {
                pg_sys::ScanDirection::BackwardScanDirection
            } else {
                pg_sys::ScanDirection::ForwardScanDirection
            };
            let mut scan = Scan { desc, slot, direction, index: self.index, _table: std::marker::PhantomData };
            scan.rescan(keys);
            scan
        }
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // While unwinding from an ERROR, PostgreSQL is not called: the abort's resource
        // owner closes them.
        if !std::thread::panicking() {
            // SAFETY: both are open; their locks are kept to the end of the transaction
            // (NoLock), as a statement keeps them. Only `raw` calls under the guard.
            unsafe {
                let (index, rel) = (self.index, self.rel);
                pg_guard_ffi_boundary(|| {
                    raw::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
                    raw::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
                })
            }
        }
    }
}

/// The most keys a scan takes (queen's take up to four: `lane::claimable`'s scan of the
/// lanes); `Table::scan` refuses more.
const MAX_KEYS: usize = 8;

/// A running index scan of a `Table`.
pub struct Scan<'s> {
    desc: pg_sys::IndexScanDesc,
    slot: *mut pg_sys::TupleTableSlot,
    direction: pg_sys::ScanDirection::Type,
    index: pg_sys::Relation,
    _table: std::marker::PhantomData<&'s Table>,
}

impl Scan<'_> {
    /// Starts the scan again with `keys` (as many as it was begun with): cheaper than a
    /// new scan, for a probe per row of another scan.
    pub fn rescan(&mut self, keys: &[Key]) {
        // SAFETY: the scan was begun with `keys.len()` keys (`Table::scan`, checked); the
        // scan keys are filled in place with the index column's collation, as the planner
        // gives a statement's index quals, and index_rescan copies them. The unused keys
        // stay zeroed, a valid value of the plain C struct, and are not passed on. The
        // guarded closure makes only `raw` calls, in a loop over iterators (`pg::raw`).
        unsafe {
            assert_eq!((*self.desc).numberOfKeys as usize, keys.len(), "a rescan with as many keys");
            // On the stack: a scan has a few keys (`MAX_KEYS`, checked by `Table::scan`).
            let mut data: [pg_sys::ScanKeyData; MAX_KEYS] = std::mem::zeroed();
            // The index columns' collations, outside the guard: `k.column - 1` could
            // overflow (a panic in a debug build), and nothing under the guard may panic.
            let collations: [pg_sys::Oid; MAX_KEYS] = std::array::from_fn(|i| {
                keys.get(i).map_or(pg_sys::InvalidOid, |k| *(*self.index).rd_indcollation.add(k.column as usize - 1))
            });
            let (desc, data) = (self.desc, &mut data);
            pg_guard_ffi_boundary(|| {
                for ((k, d), &collation) in keys.iter().zip(data.iter_mut()).zip(collations.iter()) {
                    raw::ScanKeyEntryInitialize(
                        d,
                        0,
                        k.column,
                        k.strategy,
                        pg_sys::InvalidOid,
                        collation,
                        k.proc,
                        k.arg,
                    );
                }
                raw::index_rescan(desc, data.as_mut_ptr(), keys.len() as i32, std::ptr::null_mut(), 0);
            })
        }
    }

    /// The next row visible to the snapshot, None at the end.
    pub fn next(&mut self) -> Option<Row<'_>> {
        // SAFETY: a scan begun by `Table::scan`, with its slot.
        let found = unsafe { pg_sys::index_getnext_slot(self.desc, self.direction, self.slot) };
        found.then_some(Row { slot: self.slot, _scan: std::marker::PhantomData })
    }
}

impl Drop for Scan<'_> {
    fn drop(&mut self) {
        // While unwinding from an ERROR, PostgreSQL is not called: the abort ends the scan
        // and releases its buffer pin.
        if !std::thread::panicking() {
            // SAFETY: begun by `Table::scan` and ended once here. Only `raw` calls under
            // the guard.
            unsafe {
                let (slot, desc) = (self.slot, self.desc);
                pg_guard_ffi_boundary(|| {
                    raw::ExecDropSingleTupleTableSlot(slot);
                    raw::index_endscan(desc);
                })
            }
        }
    }
}

/// The row a scan is on, until its next `next`.
pub struct Row<'r> {
    slot: *mut pg_sys::TupleTableSlot,
    _scan: std::marker::PhantomData<&'r mut ()>,
}

impl Row<'_> {
    /// Column `attno` (None: null), valid while the scan stays on this row.
    pub fn get(&self, attno: i16) -> Option<pg_sys::Datum> {
        let mut null = false;
        // SAFETY: the slot holds this row (the scan has not moved: `self` borrows it).
        let d = unsafe { pg_sys::slot_getattr(self.slot, attno as i32, &mut null) };
        (!null).then_some(d)
    }

    /// Varlena column `attno` (None: null), copied into the current memory context: valid
    /// for as long as that context lives, after the scan moves on or ends. A TOAST pointer
    /// is copied as the pointer (the value stays in TOAST until it is sliced).
    pub fn copy_varlena(&self, attno: i16) -> Option<pg_sys::Datum> {
        let d = self.get(attno)?;
        // SAFETY: the slot holds this row; the column is a varlena (checked below), so `d`
        // points at a varlena of `varsize_any` bytes (inline, short or an external
        // pointer), copied whole into a palloc'd block of that size.
        unsafe {
            let desc = (*self.slot).tts_tupleDescriptor;
            assert_eq!((*desc).attrs.as_slice((*desc).natts as usize)[attno as usize - 1].attlen, -1, "a varlena");
            let from = d.cast_mut_ptr::<pg_sys::varlena>();
            let len = pgrx::varlena::varsize_any(from);
            let to = pg_sys::palloc(len);
            std::ptr::copy_nonoverlapping(from.cast::<u8>(), to.cast::<u8>(), len);
            Some(pg_sys::Datum::from(to))
        }
    }
}
