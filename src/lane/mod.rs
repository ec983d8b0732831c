//! Lanes: one consumer group on one partition. `registry` is the lane registry in shared
//! memory (leases, cursors in flight, the journal the worker saves), over the rules of
//! `queen_core::lane` and `queen_core::lanes`; `rows` is the lane rows of `queen.lanes`;
//! `limits` is the rate limits' and concurrency caps' buckets, which a pop's claim of a
//! lane passes through (`queen_core::limits`); `claimable` is a pop's scan of the lanes it
//! may claim. docs/lanes.md tells the whole story.
//! Imports `offsets` and `pg` only.

pub mod claimable;
pub mod limits;
pub mod registry;
pub mod rows;

/// Before a call reads lane cursors to act on them: without the registry, the lane journal
/// a crash of a preloaded server left behind goes into the rows first
/// (`rows::settle_journal`; with the registry there is nothing to do). Called right after
/// the queue lock, before any other lock of the queue (`queen_core::lock_order`). `wait`:
/// wait for another session saving it; else false while one does (the caller reads no
/// cursor: a pop claims nothing, a retention step passes the queue by).
pub fn settle_journal(client: &mut pgrx::spi::SpiClient<'_>, wait: bool) -> bool {
    registry::enabled() || rows::settle_journal(client, wait)
}

/// Forgets what the registries hold of `database` that nothing uses at this moment: its
/// lanes that no transaction holds (with their leases and retry backoffs, as a restart
/// forgets them: those messages are delivered again) and its partition offsets with no
/// push in flight and no load under way (later calls load them from the tables again, as
/// after an eviction). Cursors and retry counts are safe: every ack wrote them to the
/// lane journal in its own transaction. For a database that is gone (the launcher), and
/// for one whose tables changed under the registries without queen's calls: a new
/// install after `DROP EXTENSION` (a restored dump brings the old partition ids back with
/// other cursors and offsets), and copies into queen's tables (what was loaded while they
/// held part of a dump). Returns (lanes, partitions) forgotten. Raises nothing.
pub fn forget_registries(database: u32) -> (usize, usize) {
    (registry::forget_database(database), crate::offsets::forget_database(database))
}

/// What the registries still hold of `database` after `forget_registries`: (lanes a
/// transaction holds, partitions with a push in flight or a load under way).
pub fn held_in_registries(database: u32) -> (usize, usize) {
    (registry::count_database(database), crate::offsets::count_database(database))
}
