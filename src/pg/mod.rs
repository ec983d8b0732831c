//! PostgreSQL plumbing and leaf services, at the bottom of the house: errors, SPI,
//! set-returning functions, heap access and index scans, jsonb and the reports built in
//! it, shared memory, catalog lookups, caches, clocks, ids, fail points, deferred
//! transaction ends, long-poll wake-ups, lock helpers, every setting, per-database slots,
//! worker counters and commit durability.
//!
//! Nothing here imports a module above `pg` (scripts/layers.py checks it).

pub mod cache;
pub mod catalog;
pub mod clock;
pub mod dbs;
pub mod deferred;
pub mod durability;
pub mod errors;
pub mod failpoints;
pub mod heap;
pub mod ids;
pub mod jsonb;
pub mod locks;
pub mod raw;
pub mod report;
pub mod scan;
pub mod settings;
pub mod shmem;
pub mod spi;
pub mod srf;
pub mod stats;
pub mod wake;
