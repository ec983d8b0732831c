//! Helpers for queen's integration tests: a real client against a real cluster.
//!
//! The cluster comes from `make integration`, which passes its DSN in QUEEN_TEST_DSN.
//! Without it the tests fail loudly: a test that cannot reach a server must not pass.

pub mod harness;

use postgres::{Client, NoTls};

pub fn dsn() -> String {
    std::env::var("QUEEN_TEST_DSN").expect("QUEEN_TEST_DSN is not set: run these tests with `make integration`")
}

pub fn connect() -> Client {
    Client::connect(&dsn(), NoTls).expect("connect to the test cluster")
}

/// A queue name no other test uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}
