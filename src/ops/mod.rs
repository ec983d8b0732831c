//! What the queue's main SQL functions do, over the rooms below: `push`, `pop`, `ack`, the
//! reads without a claim (`peek`: peek and get), and the dead-letter writes (`dlq`) that
//! pop and ack share. The SQL wrappers of the other functions are in `api`.

pub mod ack;
pub mod dlq;
pub mod peek; // peek, get
pub mod pop;
pub mod push;
