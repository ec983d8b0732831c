//! queen-core: everything in queen that needs no PostgreSQL — the segment codec, the ack
//! and cursor arithmetic, lease math, name rules and the queue policy (options,
//! defaults, limits). The extension is a thin layer over it.
//!
//! No `unsafe` here: everything that touches memory it does not own lives in the extension.
#![forbid(unsafe_code)]

pub mod ack;
pub mod addresses;
pub mod backoff;
pub mod claim;
pub mod compaction;
pub mod dedup;
pub mod envelope;
pub mod fail;
pub mod generations;
pub mod ids;
pub mod lane;
pub mod lanes;
pub mod lease;
pub mod limits;
pub mod lock_order;
pub mod names;
pub mod offsets;
pub mod overflow;
pub mod policy;
pub mod routing;
pub mod segment;
pub mod table;
