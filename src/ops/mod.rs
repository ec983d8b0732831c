//! What the queue's main SQL functions do, over the rooms below: `push`, `pop`, `ack`, the
//! reads without a claim (`peek`: peek and get), the dead-letter writes (`dlq`) that
//! pop and ack share, the moves of a group's cursors (`cursors`), and the maximum depth and
//! overflow policies (`overflow`). The SQL wrappers of the other functions are in `api`.

pub mod ack;
pub mod cursors;
pub mod dlq;
pub mod overflow;
pub mod peek; // peek, get
pub mod pop;
pub mod push;
