//! queen: a message queue inside PostgreSQL.
//!
//! This crate is the thin pgrx layer: SQL entry points, SPI and errors. Everything that
//! needs no PostgreSQL (segment codec, ack arithmetic, lease math, names) lives in
//! `queen-core`. One module per concern; docs/ describes each.

use pgrx::prelude::*;

// The rooms, bottom first (docs/architecture.md; scripts/layers.py checks that imports go
// down only): PostgreSQL plumbing, partition offsets, lanes, storage, queues, operations,
// then the entry points (api, hooks, the workers).
mod api;
mod hooks;
mod lane;
mod offsets;
mod ops;
mod pg;
mod queue;
mod storage;
mod worker;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);

/// Library load: the settings, then (in test builds) the fail points, the hooks and, with
/// `shared_preload_libraries = 'queen'`, the maintenance launcher.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    pg::settings::init();
    pg::failpoints::init();
    hooks::init();
    worker::init();
}
extension_sql_file!("../sql/api.sql", name = "api", finalize);

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    include!("pg_tests.rs");
}

/// Hooks for `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'queen'"]
    }
}
