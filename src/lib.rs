//! queen: a message queue inside PostgreSQL.
//!
//! This crate is the thin pgrx layer: SQL entry points, SPI and errors. Everything that
//! needs no PostgreSQL (segment codec, ack arithmetic, lease math, names) lives in
//! `queen-core`. One module per concern; docs/ describes each.

use pgrx::prelude::*;

mod ack;
mod api;
mod cache;
mod catalog;
mod churn;
mod citus;
mod clock;
mod compaction;
mod dbs;
mod deferred;
mod dlq;
mod durability;
mod encryption;
mod errors;
mod failpoints;
mod generations;
mod heap;
mod hooks;
mod ids;
mod jsonb;
mod lane_rows;
mod lanes;
mod locks;
mod names;
mod offsets;
mod pop;
mod privileges;
mod push;
mod queues;
mod retention;
mod segments;
mod settings;
mod shmem;
mod spi;
mod srf;
mod stats;
mod wake;
mod worker;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);

/// Library load: the settings, then (in test builds) the fail points, the hooks and, with
/// `shared_preload_libraries = 'queen'`, the maintenance launcher.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::init();
    failpoints::init();
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
