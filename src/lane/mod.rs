//! Lanes: one consumer group on one partition. `registry` is the lane registry in shared
//! memory (leases, cursors in flight, the journal the worker saves), over the rules of
//! `queen_core::lane` and `queen_core::lanes`; `rows` is the lane rows of `queen.lanes`.
//! docs/lanes.md tells the whole story. Imports `offsets` and `pg` only.

pub mod registry;
pub mod rows;
