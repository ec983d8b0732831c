//! Queues: lookup and implicit creation of queues, partitions and groups (`lookup`), name
//! checks, per-queue privileges, encryption envelopes and the Citus routing guard.
//! Imports the rooms below it (today `lane` and `pg`).

pub mod citus;
pub mod encryption;
pub mod lookup;
pub mod names;
pub mod privileges;
