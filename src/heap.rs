//! A direct row insert for the hottest write queen has: the segment of a single-message
//! push into `queen.fresh_segments`, in the table of its generation (`fresh_segments_0` or
//! `_1`, a partition: the row goes straight to it, as tuple routing would send it).
//!
//! An INSERT through SPI starts and ends a whole executor for one row, which profiles
//! showed to be a large share of a one-message push. This inserts the heap tuple and its
//! index entries the way PostgreSQL's own catalog code does (`CatalogTupleInsert`):
//! `heap_insert` (which WAL-logs, TOASTs and counts the row), then `index_insert` into
//! every index with the uniqueness check. Nothing the executor would add applies to this
//! internal table: it has no triggers, constraints beyond NOT NULL (never violated here),
//! expression or partial indexes, partitions of its own or row security. If an index ever has
//! expressions or a predicate, `insert_fresh_segment` reports that it did nothing and the
//! caller uses SQL.

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
    // SAFETY: called inside a transaction from a queen function. Every pointer comes from
    // PostgreSQL and is used while the relation is open and locked (RowExclusiveLock, held
    // to the end of the transaction as an INSERT would); the tuple and slot are freed here;
    // an ERROR (a unique violation, say) unwinds through pgrx and the transaction's
    // resource owner closes what is open.
    unsafe {
        let table = match generation {
            0 => c"fresh_segments_0",
            1 => c"fresh_segments_1",
            _ => return false,
        };
        let relid = crate::catalog::queen_table(table);
        if relid == pg_sys::InvalidOid {
            return false;
        }
        let lock = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
        let rel = pg_sys::table_open(relid, lock);
        let desc = (*rel).rd_att;
        let indexes = pg_sys::RelationGetIndexList(rel);
        let index_oids: Vec<pg_sys::Oid> = if indexes.is_null() {
            Vec::new()
        } else {
            (0..(*indexes).length as usize).map(|i| (*(*indexes).elements.add(i)).oid_value).collect()
        };
        let opened: Vec<(pg_sys::Relation, *mut pg_sys::IndexInfo)> = index_oids
            .iter()
            .map(|&oid| {
                let irel = pg_sys::index_open(oid, lock);
                (irel, pg_sys::BuildIndexInfo(irel))
            })
            .collect();
        if opened.iter().any(|&(_, info)| !(*info).ii_Expressions.is_null() || !(*info).ii_Predicate.is_null()) {
            for &(irel, _) in &opened {
                pg_sys::index_close(irel, lock);
            }
            pg_sys::table_close(rel, lock);
            return false;
        }
        // Columns: partition_id, first_offset, last_offset, created_at, data, generation.
        let mut values = [
            pid.into_datum().unwrap(),
            pg_sys::Datum::from(first),
            pg_sys::Datum::from(last),
            pg_sys::Datum::from(created_at),
            data.into_datum().unwrap(),
            generation.into_datum().unwrap(),
        ];
        let mut nulls = [false; 6];
        if (*desc).natts as usize != values.len() {
            for &(irel, _) in &opened {
                pg_sys::index_close(irel, lock);
            }
            pg_sys::table_close(rel, lock);
            return false;
        }
        let tup = pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        pg_sys::heap_insert(rel, tup, pg_sys::GetCurrentCommandId(true), 0, std::ptr::null_mut());
        let slot = pg_sys::MakeSingleTupleTableSlot(desc, &pg_sys::TTSOpsHeapTuple);
        pg_sys::ExecStoreHeapTuple(tup, slot, false);
        for &(irel, info) in &opened {
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
            pg_sys::index_close(irel, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::heap_freetuple(tup);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        // As SPI does after each statement: later statements see the row.
        pg_sys::CommandCounterIncrement();
        true
    }
}
