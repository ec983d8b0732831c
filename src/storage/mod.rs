//! Where messages live: the segments (fresh and compacted), the segment generations and
//! their rotation, compaction, retention, and the churn pass that evicts idle lanes and
//! releases old offsets. docs/storage.md. Imports `lane`, `offsets` and `pg` only.

pub mod churn;
pub mod compaction;
pub mod generations;
pub mod retention;
pub mod segments;
