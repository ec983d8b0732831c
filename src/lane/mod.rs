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
