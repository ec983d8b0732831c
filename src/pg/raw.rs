//! PostgreSQL's functions without pgrx's guard, for the hot paths that call several in a
//! row (`pg::scan`, `pg::heap`).
//!
//! pgrx wraps every function of `pg_sys` in a guard (`pg_guard_ffi_boundary`): a
//! `sigsetjmp` that catches an ERROR the call raises and turns it into a Rust panic. A
//! guard costs about a hundred instructions, and a pop with its ack, or a `send`, made a
//! few dozen guarded calls to open tables, start scans and insert rows. Here the same
//! functions are declared again, unguarded, for calls made several at a time under one
//! guard:
//!
//! ```ignore
//! pg_guard_ffi_boundary(|| {
//!     raw::CommandCounterIncrement();
//!     raw::PushActiveSnapshot(raw::GetTransactionSnapshot());
//! })
//! ```
//!
//! An ERROR in any of them jumps back to the guard, as it would for one guarded call. That
//! jump skips whatever Rust code the closure was running, so a closure must hold nothing
//! with a destructor and must not panic: only these calls, plain values and pointers, and
//! loops over slice iterators (`iter`, `iter_mut`, and `zip` or `enumerate` of those; an
//! array moved into an iterator has a destructor). Anything that could panic (an index out
//! of bounds, an overflow in a debug build) is computed before the guard.
//!
//! Each declaration has the signature pgrx gives the function (PostgreSQL 15): the build
//! checks its types against `pg_sys` (`same_as_pg_sys`), not its symbol. A function that
//! is `static inline` in PostgreSQL's headers has no symbol of its own: pgrx compiles a C
//! shim for it, and its declaration here names the shim (`link_name`, as pgrx's does).

use pgrx::pg_sys::{
    AttrNumber, BulkInsertState, CommandId, Datum, EState, HeapTuple, IndexInfo, IndexScanDesc, IndexUniqueCheck,
    ItemPointer, List, Oid, RegProcedure, Relation, ScanKey, Snapshot, StrategyNumber, TupleDesc, TupleTableSlot,
    TupleTableSlotOps, LOCKMODE,
};
use std::ffi::c_int;

/// Declares the functions, and a function (never called) that the build type-checks:
/// each declaration's parameter and result types are those of `pg_sys`'s function of the
/// same name.
macro_rules! unguarded {
    ($($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        unsafe extern "C-unwind" {
            $($(#[$meta])* pub fn $name($($arg: $ty),*) $(-> $ret)?;)*
        }

        #[allow(dead_code)]
        fn same_as_pg_sys() {
            $(let _: unsafe fn($($ty),*) $(-> $ret)? = pgrx::pg_sys::$name;)*
        }
    };
}

unguarded! {
    fn CommandCounterIncrement();
    fn GetTransactionSnapshot() -> Snapshot;
    fn PushActiveSnapshot(snapshot: Snapshot);
    fn UpdateActiveSnapshotCommandId();
    fn GetActiveSnapshot() -> Snapshot;
    fn table_open(relation_id: Oid, lockmode: LOCKMODE) -> Relation;
    fn table_close(relation: Relation, lockmode: LOCKMODE);
    fn index_open(relation_id: Oid, lockmode: LOCKMODE) -> Relation;
    fn index_close(relation: Relation, lockmode: LOCKMODE);
    fn RelationGetPrimaryKeyIndex(relation: Relation) -> Oid;
    fn RelationGetIndexList(relation: Relation) -> *mut List;
    fn BuildIndexInfo(index: Relation) -> *mut IndexInfo;
    fn heap_attisnull(tup: HeapTuple, attnum: c_int, tuple_desc: TupleDesc) -> bool;
    fn ScanKeyEntryInitialize(
        entry: ScanKey,
        flags: c_int,
        attribute_number: AttrNumber,
        strategy: StrategyNumber,
        subtype: Oid,
        collation: Oid,
        procedure: RegProcedure,
        argument: Datum,
    );
    fn index_beginscan(
        heap_relation: Relation,
        index_relation: Relation,
        snapshot: Snapshot,
        nkeys: c_int,
        norderbys: c_int,
    ) -> IndexScanDesc;
    fn index_rescan(scan: IndexScanDesc, keys: ScanKey, nkeys: c_int, orderbys: ScanKey, norderbys: c_int);
    fn index_endscan(scan: IndexScanDesc);
    fn table_slot_create(rel: Relation, reglist: *mut *mut List) -> *mut TupleTableSlot;
    fn MakeSingleTupleTableSlot(tupdesc: TupleDesc, tts_ops: *const TupleTableSlotOps) -> *mut TupleTableSlot;
    fn ExecDropSingleTupleTableSlot(slot: *mut TupleTableSlot);
    fn GetCurrentCommandId(used: bool) -> CommandId;
    fn heap_form_tuple(tuple_descriptor: TupleDesc, values: *mut Datum, isnull: *mut bool) -> HeapTuple;
    fn heap_insert(relation: Relation, tup: HeapTuple, cid: CommandId, options: c_int, bistate: BulkInsertState);
    fn heap_freetuple(htup: HeapTuple);
    fn ExecStoreHeapTuple(tuple: HeapTuple, slot: *mut TupleTableSlot, should_free: bool) -> *mut TupleTableSlot;
    // An inline function of PostgreSQL's headers: pgrx compiles it into a C shim.
    #[link_name = "ExecClearTuple__pgrx_cshim"]
    fn ExecClearTuple(slot: *mut TupleTableSlot) -> *mut TupleTableSlot;
    fn FormIndexDatum(
        index_info: *mut IndexInfo,
        slot: *mut TupleTableSlot,
        estate: *mut EState,
        values: *mut Datum,
        isnull: *mut bool,
    );
    fn index_insert(
        index_relation: Relation,
        values: *mut Datum,
        isnull: *mut bool,
        heap_t_ctid: ItemPointer,
        heap_relation: Relation,
        check_unique: IndexUniqueCheck::Type,
        index_unchanged: bool,
        index_info: *mut IndexInfo,
    ) -> bool;
}
