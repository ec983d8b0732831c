//! Segment generations (queen-core::generations): which generation a new segment row goes
//! to, and the rotation that empties the oldest one with `TRUNCATE`.
//!
//! Writers read the current generation from `queen.generations` at most once a second per
//! backend. A stale answer is harmless: a row in a generation that is no longer current is
//! read like any other, and the next rotation of that generation copies it forward if it
//! is still live.
//!
//! The rotation runs after a retention pass (the background worker's, or `queen.retain()`
//! over every queue), so the oldest generation holds only what retention kept. It works in
//! two steps, in one transaction:
//!
//! 1. **The move** (`move_live_rows`): the live rows of the oldest generation move to the
//!    current one, a batch of partitions at a time, each row deleted and inserted in one
//!    statement, under the partitions' row locks (taken without waiting, as compaction and
//!    retention take them). It takes no table lock a reader waits for, however much it
//!    moves: pops go on reading.
//! 2. **The swap** (`queen._rotate_segments`): the oldest generation's tables are locked
//!    exclusively (waiting at most 150 ms, else the rotation backs off and tries on a
//!    later pass), what the move skipped (partitions busy at that moment; few) is copied,
//!    the tables are emptied with TRUNCATE, and the generation becomes current. Readers
//!    wait only for this step: the lock wait plus a short copy and the TRUNCATE.
//!
//! Readers cannot see a half-done rotation: nothing is visible before the transaction
//! commits, and a statement takes its locks before its snapshot, so one that waited for
//! the swap sees the rotation whole.
//! Under REPEATABLE READ or SERIALIZABLE a transaction's snapshot may predate a rotation
//! (see `docs/concepts.md`, "Segment generations").

use std::cell::Cell;

use pgrx::pg_sys;
use pgrx::spi::SpiClient;
use queen_core::generations::{live_bytes, next, rotation_due, Sizes};

use crate::pg::errors::SpiExt;
use crate::pg::settings;
use crate::pg::spi::{first_value, run};

/// How long a backend trusts the current generation it read.
const CACHE_MICROS: i64 = 1_000_000;

thread_local! {
    /// (generation, when it was read)
    static CURRENT: Cell<Option<(i16, i64)>> = const { Cell::new(None) };
    /// The transaction (its top-level id) that rotated the generations in this backend:
    /// what it reads of them is not committed yet, so it is not kept past it (a rotation
    /// that rolls back leaves the committed generation current).
    static ROTATED_IN: Cell<pg_sys::TransactionId> = const { Cell::new(pg_sys::InvalidTransactionId) };
}

/// This backend's top-level transaction id, or the invalid one when it has none.
fn top_xid() -> pg_sys::TransactionId {
    // SAFETY: a plain read of this backend's transaction state.
    unsafe { pg_sys::GetTopTransactionIdIfAny() }
}

/// The generation new segment rows go to.
pub fn current(client: &mut SpiClient<'_>) -> i16 {
    let now = crate::pg::clock::clock_now();
    if let Some((g, at)) = CURRENT.with(Cell::get) {
        if now.saturating_sub(at) < CACHE_MICROS && now >= at {
            return g;
        }
    }
    let g = first_value::<i16>(run(client, "SELECT current_generation FROM queen.generations", &[])).unwrap_or(0);
    let rotated_here = ROTATED_IN.with(Cell::get);
    if rotated_here == pg_sys::InvalidTransactionId || rotated_here != top_xid() {
        CURRENT.with(|c| c.set(Some((g, now))));
    }
    g
}

/// Under REPEATABLE READ or SERIALIZABLE, refuses (40001) a read of segments that must
/// find what it looks for (a message to dead-letter) when a rotation committed after the
/// transaction's snapshot: the rows it moved are then neither where the snapshot saw them
/// nor visible where they went. A pop needs no such check: it stops before an offset a
/// segment holds now that its snapshot cannot see (`segments::gaps_from`).
pub fn check_snapshot(client: &mut SpiClient<'_>) {
    if !crate::pg::errors::fixed_snapshot() {
        return;
    }
    let seen = first_value::<i64>(run(client, "SELECT rotations FROM queen.generations", &[]));
    let latest =
        crate::pg::spi::first_row_now(client, "SELECT rotations FROM queen.generations", &[], |r| r.get::<i64>(1))
            .flatten();
    if seen != latest {
        crate::pg::errors::serialization_failure(
            "the segment generations were rotated after this transaction's snapshot was taken; retry the transaction",
        );
    }
}

/// What a rotation attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotated {
    /// Not attempted: not due, another rotation holds `queen.generations`, the
    /// transaction's snapshot is fixed (REPEATABLE READ or SERIALIZABLE), or a `pg_dump`
    /// reads the database.
    No,
    /// The oldest generation's tables were busy for longer than the wait.
    Busy,
    /// Rotated: the generation emptied (now current), and the rows copied out of it.
    Yes { emptied: i16, copied: i64 },
}

/// Partitions a move statement takes at once.
const MOVE_BATCH: i64 = 1000;

/// Moves the rows of generation `oldest` into `current`, a batch of partitions at a time,
/// in the caller's transaction: each row is deleted from `oldest` and inserted into
/// `current` in one statement, so a reader (a statement snapshot) sees it in one place or
/// the other, never in both or neither. Each partition's row is locked first (FOR NO KEY
/// UPDATE SKIP LOCKED, as compaction and retention lock it, so none of them works on it
/// meanwhile); a partition busy at that moment is left for the copy under the exclusive
/// lock that ends the rotation. Nothing here takes a lock that a pop waits for.
fn move_live_rows(client: &mut SpiClient<'_>, oldest: i16, current: i16) {
    let mut after = pgrx::Uuid::from_bytes([0; 16]);
    loop {
        let pids: Vec<pgrx::Uuid> = run(
            client,
            "SELECT p.partition_id FROM queen.partitions p
              WHERE p.partition_id > $1
                AND (EXISTS (SELECT 1 FROM queen.segments s
                              WHERE s.partition_id = p.partition_id AND s.generation = $2)
                     OR EXISTS (SELECT 1 FROM queen.fresh_segments f
                                 WHERE f.partition_id = p.partition_id AND f.generation = $2))
              ORDER BY p.partition_id
              LIMIT $3
                FOR NO KEY UPDATE OF p SKIP LOCKED",
            &[after.into(), oldest.into(), MOVE_BATCH.into()],
        )
        .map(|r| r.get::<pgrx::Uuid>(1).or_raise().unwrap())
        .collect();
        let Some(&last) = pids.last() else { return };
        after = last;
        run(
            client,
            "WITH m AS (
               DELETE FROM queen.segments s WHERE s.generation = $2 AND s.partition_id = ANY($1)
               RETURNING s.partition_id, s.first_offset, s.last_offset, s.created_at, s.data
             )
             INSERT INTO queen.segments (partition_id, first_offset, last_offset, created_at, data, generation)
             SELECT partition_id, first_offset, last_offset, created_at, data, $3 FROM m",
            &[pids.clone().into(), oldest.into(), current.into()],
        );
        run(
            client,
            "WITH m AS (
               DELETE FROM queen.fresh_segments s WHERE s.generation = $2 AND s.partition_id = ANY($1)
               RETURNING s.partition_id, s.first_offset, s.last_offset, s.created_at, s.data
             )
             INSERT INTO queen.fresh_segments (partition_id, first_offset, last_offset, created_at, data, generation)
             SELECT partition_id, first_offset, last_offset, created_at, data, $3 FROM m",
            &[pids.into(), oldest.into(), current.into()],
        );
    }
}

/// One rotation attempt (see the module comment). Runs in the caller's transaction.
pub fn rotate(client: &mut SpiClient<'_>) -> Rotated {
    let Some(min_bytes) = settings::rotation_min_bytes() else {
        return Rotated::No;
    };
    // A fixed snapshot would copy only the rows it sees, and drop the others with the
    // TRUNCATE. (Its callers run under READ COMMITTED: `retain` refuses the other levels,
    // the worker sets it. This stays as the defence of a rule that loses rows if broken.)
    if crate::pg::errors::fixed_snapshot() {
        return Rotated::No;
    }
    // A dump whose snapshot predates this rotation but which has not locked the tables yet
    // would see the oldest generation emptied and not the rows moved out of it.
    if crate::pg::dbs::dump_running(client) {
        return Rotated::No;
    }
    let Some(current) =
        first_value::<i16>(run(client, "SELECT current_generation FROM queen.generations FOR UPDATE SKIP LOCKED", &[]))
    else {
        return Rotated::No;
    };
    let oldest = next(current);
    // The sizes first: the live rows of the oldest generation are counted (a scan of its
    // heap, dead rows included) only when the current one is large enough.
    let row = run(
        client,
        "SELECT pg_catalog.pg_total_relation_size(('queen.segments_' || $1)::regclass)
                + pg_catalog.pg_total_relation_size(('queen.fresh_segments_' || $1)::regclass),
                pg_catalog.pg_total_relation_size(('queen.segments_' || $2)::regclass)
                + pg_catalog.pg_total_relation_size(('queen.fresh_segments_' || $2)::regclass)",
        &[current.into(), oldest.into()],
    );
    let row = row.first();
    let mut sizes = Sizes {
        current: row.get::<i64>(1).or_raise().unwrap_or(0),
        oldest: row.get::<i64>(2).or_raise().unwrap_or(0),
        oldest_live: 0,
    };
    if !rotation_due(sizes, min_bytes) {
        return Rotated::No;
    }
    let row = run(
        client,
        "SELECT count(*)::int8, coalesce(sum(octet_length(x.data)), 0)::int8
           FROM (SELECT data FROM queen.segments WHERE generation = $1
                 UNION ALL SELECT data FROM queen.fresh_segments WHERE generation = $1) x",
        &[oldest.into()],
    );
    let row = row.first();
    sizes.oldest_live =
        live_bytes(row.get::<i64>(1).or_raise().unwrap_or(0), row.get::<i64>(2).or_raise().unwrap_or(0));
    if !rotation_due(sizes, min_bytes) {
        return Rotated::No;
    }
    // The move, partition by partition, with no exclusive lock: pops read on meanwhile.
    move_live_rows(client, oldest, current);
    // The short part, under the oldest generation's tables held exclusively: what the
    // move skipped (partitions busy at that moment) is copied, and the tables emptied.
    let copied = first_value::<i64>(run(
        client,
        "SELECT queen._rotate_segments($1, $2)",
        &[i32::from(oldest).into(), i32::from(current).into()],
    ))
    .unwrap_or(-1);
    if copied < 0 {
        return Rotated::Busy;
    }
    // Not cached: this transaction may still roll back (a `queen.retain()` in a caller's
    // transaction), and then the generation it emptied is not the current one. Its own
    // later reads see its rotation through its snapshot.
    CURRENT.with(|c| c.set(None));
    ROTATED_IN.with(|r| r.set(top_xid()));
    Rotated::Yes { emptied: oldest, copied }
}
