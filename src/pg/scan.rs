//! Direct index scans for the hottest reads queen has: a pop's read of a lane's segments
//! and its scan of a group's lanes.
//!
//! A statement through SPI starts and ends a whole executor (plan cache check, executor
//! start with a node per table and per partition, portal, tuple table) for a few index
//! probes. Profiles of a live queue, where a pop takes one to three messages, showed those
//! statements to be a quarter of a consumer's CPU. This reads the same rows the way
//! PostgreSQL's own catalog code does (`systable_beginscan`): the table and one of its
//! btree indexes opened under AccessShareLock (held to the end of the transaction, as a
//! statement would), an index scan with scan keys, and a slot for each row.
//!
//! `Statement` gives the scans of one read the snapshot a statement would have had: the
//! command counter advanced (earlier writes of the transaction are seen) and, under READ
//! COMMITTED, a new snapshot; under REPEATABLE READ the transaction's. All the scans of one
//! `Statement` see the same committed state, as the tables of one statement do.

use pgrx::pg_sys;

/// The snapshot of one read made of several scans, active while it lives.
pub struct Statement(());

impl Statement {
    /// Advances the command counter and pushes the snapshot a new statement would get.
    pub fn start() -> Statement {
        // SAFETY: inside a transaction, as any SPI statement is; the pushed snapshot is
        // popped by `drop`, or by the transaction's abort after an ERROR.
        unsafe {
            pg_sys::CommandCounterIncrement();
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
            pg_sys::UpdateActiveSnapshotCommandId();
        }
        Statement(())
    }

    fn snapshot(&self) -> pg_sys::Snapshot {
        // SAFETY: `start` pushed it, and it is popped only when `self` goes.
        unsafe { pg_sys::GetActiveSnapshot() }
    }
}

impl Drop for Statement {
    fn drop(&mut self) {
        // After an ERROR (unwinding) the abort pops it; popping here too would pop twice.
        if !std::thread::panicking() {
            // SAFETY: the snapshot `start` pushed is still the active one: every scan that
            // used it has ended (they borrow `self`).
            unsafe { pg_sys::PopActiveSnapshot() };
        }
    }
}

/// A table open for scans of one of its btree indexes. Callers find their columns by name
/// (`column`): a partition's columns may sit elsewhere than its parent's.
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

impl Table {
    /// Opens the table `relid` and its index `index` (None: its primary key) under
    /// AccessShareLock. None (with nothing left open) when the table or index is missing,
    /// the index is not a valid btree index of the table, or its leading columns are not
    /// the table's columns `leading`, by name.
    pub fn open(relid: pg_sys::Oid, index: Option<pg_sys::Oid>, leading: &[&std::ffi::CStr]) -> Option<Table> {
        if relid == pg_sys::InvalidOid {
            return None;
        }
        // SAFETY: opening relations by OID under a lock inside a transaction; an OID
        // that no longer names a relation raises an ERROR (through pgrx), as a statement
        // would. The index is checked to belong to the table before it is used.
        unsafe {
            let rel = pg_sys::table_open(relid, Self::LOCK);
            let index = index.unwrap_or_else(|| pg_sys::RelationGetPrimaryKeyIndex(rel));
            if index == pg_sys::InvalidOid {
                pg_sys::table_close(rel, Self::LOCK);
                return None;
            }
            let index = pg_sys::index_open(index, Self::LOCK);
            let t = Table { rel, index };
            let form = (*index).rd_index;
            let keys = (*form).indkey.values.as_slice((*form).indnkeyatts as usize);
            let fits = (*form).indrelid == relid
                && (*form).indisvalid
                && (*(*index).rd_rel).relam == pg_sys::BTREE_AM_OID
                && keys.len() >= leading.len()
                && leading.iter().zip(keys).all(|(name, &attno)| t.column(name) == Some(attno));
            if !fits {
                pg_sys::index_close(index, Self::LOCK);
                pg_sys::table_close(rel, Self::LOCK);
                return None;
            }
            Some(t)
        }
    }

    const LOCK: pg_sys::LOCKMODE = pg_sys::AccessShareLock as pg_sys::LOCKMODE;

    /// The attribute number of column `name`, None when the table has none.
    pub fn column(&self, name: &std::ffi::CStr) -> Option<i16> {
        // SAFETY: the relation is open; its tuple descriptor lives while it is.
        unsafe {
            let desc = (*self.rel).rd_att;
            let attrs = (*desc).attrs.as_slice((*desc).natts as usize);
            attrs
                .iter()
                .position(|a| !a.attisdropped && std::ffi::CStr::from_ptr(a.attname.data.as_ptr()) == name)
                .map(|i| i as i16 + 1)
        }
    }

    /// Starts a scan of the index with `keys`, under `statement`'s snapshot, backward
    /// (from the highest key) when `backward`.
    pub fn scan<'s>(&'s self, statement: &'s Statement, keys: &[Key], backward: bool) -> Scan<'s> {
        // SAFETY: the table and index are open and locked; the scan keys are filled in
        // place (ScanKeyEntryInitialize) with the index column's collation, as the planner
        // gives a statement's index quals; the slot fits the table's rows. Everything is
        // ended by `Scan::drop`, or by the transaction's resource owner after an ERROR.
        unsafe {
            let desc = pg_sys::index_beginscan(self.rel, self.index, statement.snapshot(), keys.len() as i32, 0);
            let slot = pg_sys::table_slot_create(self.rel, std::ptr::null_mut());
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
        if !std::thread::panicking() {
            // SAFETY: both are open; their locks are kept to the end of the transaction
            // (NoLock), as a statement keeps them. After an ERROR the resource owner closes
            // them.
            unsafe {
                pg_sys::index_close(self.index, pg_sys::NoLock as pg_sys::LOCKMODE);
                pg_sys::table_close(self.rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            }
        }
    }
}

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
        // SAFETY: the scan keys are filled in place with the index column's collation, as
        // the planner gives a statement's index quals, and copied by index_rescan; the
        // scan was begun with `keys.len()` keys (`Table::scan`).
        unsafe {
            assert_eq!((*self.desc).numberOfKeys as usize, keys.len(), "a rescan with as many keys");
            let mut data: Vec<pg_sys::ScanKeyData> = keys.iter().map(|_| std::mem::zeroed()).collect();
            for (k, d) in keys.iter().zip(data.iter_mut()) {
                let collation = *(*self.index).rd_indcollation.add(k.column as usize - 1);
                pg_sys::ScanKeyEntryInitialize(
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
            pg_sys::index_rescan(self.desc, data.as_mut_ptr(), keys.len() as i32, std::ptr::null_mut(), 0);
        }
    }

    /// Moves to the next row visible to the snapshot; false at the end.
    pub fn next(&mut self) -> bool {
        // SAFETY: a scan begun by `Table::scan`, with its slot.
        unsafe { pg_sys::index_getnext_slot(self.desc, self.direction, self.slot) }
    }

    /// Column `attno` of the current row (None: null), valid until the next `next`.
    pub fn get(&mut self, attno: i16) -> Option<pg_sys::Datum> {
        let mut null = false;
        // SAFETY: the slot holds the current row (`next` returned true).
        let d = unsafe { pg_sys::slot_getattr(self.slot, attno as i32, &mut null) };
        (!null).then_some(d)
    }

    /// A copy of the current row, in the current memory context (it outlives the scan),
    /// and column `attno` of it (None: null): for a column read after the scan ends.
    pub fn copy(&mut self, attno: i16) -> Option<pg_sys::Datum> {
        // SAFETY: the slot holds the current row; the copy is palloc'd in the current
        // memory context, and the datum points into it (a varlena column), so it lives as
        // long as that context does. The copy's descriptor is the table's.
        unsafe {
            let tuple = pg_sys::ExecCopySlotHeapTuple(self.slot);
            let desc = (*self.slot).tts_tupleDescriptor;
            let natts = (*desc).natts as usize;
            let (mut values, mut nulls) = (vec![pg_sys::Datum::from(0usize); natts], vec![false; natts]);
            pg_sys::heap_deform_tuple(tuple, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
            let i = attno as usize - 1;
            (!nulls[i]).then_some(values[i])
        }
    }
}

impl Drop for Scan<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            // SAFETY: begun by `Table::scan` and ended once here; after an ERROR the
            // transaction's abort ends it.
            unsafe {
                pg_sys::ExecDropSingleTupleTableSlot(self.slot);
                pg_sys::index_endscan(self.desc);
            }
        }
    }
}
