//! Entry points: SQL functions that check their arguments, call the domain modules and
//! shape the answer, one file per function or family. Nothing imports them. Entry points
//! whose module other code also uses (push, pop, ack, dlq, retention, compaction, churn,
//! privileges) still live beside that code (docs/architecture.md, "What is not done
//! yet").

mod budgets; // configure_group, may_start
mod configure;
mod create_group;
mod extend; // extend_lease, revoke_lease
mod groups; // seek, drop_group
