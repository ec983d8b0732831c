//! Crash tests: `kill -9` of backends in the middle of a push, a pop, an ack and a
//! dead-lettering ack, and `pg_ctl stop -m immediate` with a restart, while the invariants
//! harness runs. Each kill makes the postmaster restart every session (crash recovery). Afterwards every push that returned is
//! present, no offset is skipped or passed twice by the cursor, and no cursor moved
//! beyond what some ack asked for (see `queen_it::harness`). Its own test binary: the
//! kills would break any test running beside it.

use queen_it::harness::{run, Config};

#[test]
fn kill_9_and_immediate_stop_under_load_lose_nothing() {
    let cfg = Config::from_env(30_000, 2, 10);
    let report = run(&cfg);
    println!("{report:#?}");
    for what in ["push", "pop", "ack", "dead-lettering ack", "immediate stop"] {
        assert!(report.kills.get(what).copied().unwrap_or(0) > 0, "no crash of kind {what:?} happened");
    }
}
