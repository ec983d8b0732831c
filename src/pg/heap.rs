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
//! would add applies to these internal tables: they have no triggers, constraints beyond
//! NOT NULL (never violated here), expression or partial indexes, partitions of their own
//! or row security. If an index ever has expressions or a predicate, or the table has not
//! the columns given, `insert_rows` reports that it did nothing and the caller uses SQL.

use pgrx::pg_sys;
use pgrx::IntoDatum;

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
    insert_rows(crate::pg::catalog::queen_table(table), types, std::iter::once(row))
}

/// Inserts rows of `N` non-null columns of types `types` (datums of those types, in
/// order) into the plain table `relid`, with their index entries, in one pass: the table
/// and its indexes are opened once. Returns false, having done nothing, when `relid` is
/// invalid, its columns are not `types`, or it has more than `MAX_INDEXES` indexes or one
/// with expressions or a predicate. An index not ready for inserts (one that CREATE INDEX
/// CONCURRENTLY is building) is left to its build, as the executor leaves it. Later
/// statements of the transaction see the rows.
pub fn insert_rows<const N: usize>(
    relid: pg_sys::Oid,
    types: [pg_sys::Oid; N],
    rows: impl IntoIterator<Item = [pg_sys::Datum; N]>,
) -> bool {
    if relid == pg_sys::InvalidOid {
        return false;
    }
    /// At most this many indexes are written directly (queen's tables have one).
    const MAX_INDEXES: usize = 4;
    // SAFETY: called inside a transaction from a queen function. Every pointer comes from
    // PostgreSQL and is used while the relation is open and locked (RowExclusiveLock, held
    // to the end of the transaction as an INSERT would); the tuples and the slot are freed
    // here; an ERROR (a unique violation, say) unwinds through pgrx and the transaction's
    // resource owner closes what is open. The caller promises each datum's type.
    unsafe {
        let lock = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
        let rel = pg_sys::table_open(relid, lock);
        let desc = (*rel).rd_att;
        // A copy of the relcache's list of the table's indexes.
        let indexes = pg_sys::RelationGetIndexList(rel);
        let count = if indexes.is_null() { 0 } else { (*indexes).length as usize };
        let mut opened: [(pg_sys::Relation, *mut pg_sys::IndexInfo); MAX_INDEXES] =
            [(std::ptr::null_mut(), std::ptr::null_mut()); MAX_INDEXES];
        let attrs = (*desc).attrs.as_slice((*desc).natts as usize);
        let fits = count <= MAX_INDEXES
            && attrs.len() == N
            && attrs.iter().zip(types).all(|(a, t)| !a.attisdropped && a.atttypid == t);
        if fits {
            for (i, slot) in opened.iter_mut().enumerate().take(count) {
                let irel = pg_sys::index_open((*(*indexes).elements.add(i)).oid_value, lock);
                *slot = (irel, pg_sys::BuildIndexInfo(irel));
            }
        }
        if !indexes.is_null() {
            pg_sys::list_free(indexes);
        }
        let opened = &opened[..if fits { count } else { 0 }];
        if !fits || opened.iter().any(|&(_, info)| !(*info).ii_Expressions.is_null() || !(*info).ii_Predicate.is_null())
        {
            for &(irel, _) in opened {
                pg_sys::index_close(irel, lock);
            }
            pg_sys::table_close(rel, lock);
            return false;
        }
        let slot = pg_sys::MakeSingleTupleTableSlot(desc, &pg_sys::TTSOpsHeapTuple);
        let cid = pg_sys::GetCurrentCommandId(true);
        for mut values in rows {
            let mut nulls = [false; N];
            let tup = pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr());
            pg_sys::heap_insert(rel, tup, cid, 0, std::ptr::null_mut());
            pg_sys::ExecStoreHeapTuple(tup, slot, false);
            for &(irel, info) in opened.iter().filter(|&&(_, info)| (*info).ii_ReadyForInserts) {
                let mut ivalues = [pg_sys::Datum::from(0usize); pg_sys::INDEX_MAX_KEYS as usize];
                let mut inulls = [false; pg_sys::INDEX_MAX_KEYS as usize];
                pg_sys::FormIndexDatum(info, slot, std::ptr::null_mut(), ivalues.as_mut_ptr(), inulls.as_mut_ptr());
                let unique = if (*info).ii_Unique {
                    pg_sys::IndexUniqueCheck::UNIQUE_CHECK_YES
                } else {
                    pg_sys::IndexUniqueCheck::UNIQUE_CHECK_NO
                };
                pg_sys::index_insert(
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
            pg_sys::ExecClearTuple(slot);
            pg_sys::heap_freetuple(tup);
        }
        for &(irel, _) in opened {
            pg_sys::index_close(irel, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        // As SPI does after each statement: later statements see the rows.
        pg_sys::CommandCounterIncrement();
        true
    }
}
