//! queen-core: everything in queen that needs no PostgreSQL — the segment codec, the ack
//! and cursor arithmetic, lease math and name rules. The extension is a thin layer over it.

pub mod ack;
pub mod claim;
pub mod compaction;
pub mod envelope;
pub mod ids;
pub mod lanes;
pub mod lease;
pub mod lock_order;
pub mod names;
pub mod offsets;
pub mod segment;
