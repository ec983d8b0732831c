//! Entry points: SQL functions that check their arguments, call the domain modules and
//! shape the answer, one file per function or family. Nothing imports them. The hot
//! paths (push, push_batch and pop, raw C functions, and ack) still live beside their code
//! (docs/architecture.md, "What is not done yet").

mod budgets; // configure_group, may_start
mod compact;
mod configure;
mod create_group;
mod dlq; // dlq_replay, dlq_delete
mod drop_partition;
mod extend; // extend_lease, revoke_lease
mod grant; // grant, revoke, grants
mod groups; // seek, drop_group
mod limits; // configure_limit
mod pause; // pause, resume
mod retain;
