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

/// Forgets what shared memory holds of the current database's queen install that nothing
/// uses at this moment: its idle lanes (with their leases and backoffs, as after a
/// restart: the messages are delivered again) and its idle partition offsets, which later
/// calls load from the tables again (as after an eviction). For when the tables changed
/// under them without queen's calls: a new install after `DROP EXTENSION` (the old
/// partition ids may come back in a restored dump, with other cursors and offsets), and
/// a restore's copies into the tables (what was loaded while they held part of the dump).
/// Raises nothing. `why` is for the log.
pub fn forget_install_state(why: &str) {
    let database = crate::pg::dbs::my_database();
    let lanes = registry::forget_database(database);
    let partitions = crate::offsets::forget_database(database);
    if lanes + partitions > 0 {
        pgrx::debug1!("queen: {why}: forgot {lanes} lanes and {partitions} partitions held in shared memory");
    }
}
