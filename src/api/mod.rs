//! Entry points: SQL functions that check their arguments, call the domain modules and
//! shape the answer. Only `configure` and `create_group` have moved here so far; the
//! other entry points still live beside the domain code they call (docs/architecture.md,
//! "What is not done yet").

mod configure;
mod create_group;
