//! Crash tests of the single-message path: `kill -9` in the middle of single pushes (the
//! fresh tier) and of compaction passes, and immediate stops, while the invariants harness
//! runs. A binary of its own, like `chaos.rs`: its kills would break tests beside it.

use queen_it::harness::{run, Config};

/// Single-message pushes (the fresh tier) with a session compacting it: kill -9 in the
/// middle of single pushes and of compaction passes, and immediate stops.
#[test]
fn kill_9_during_single_pushes_and_compaction_loses_nothing() {
    let mut cfg = Config::from_env(12_000, 2, 12);
    cfg.pushers = 8;
    cfg.partitions = 2;
    cfg.batch_max = 1;
    cfg.compactor = true;
    let report = run(&cfg);
    println!("{report:#?}");
    for what in ["push", "pop", "ack", "compaction", "immediate stop"] {
        assert!(report.kills.get(what).copied().unwrap_or(0) > 0, "no crash of kind {what:?} happened");
    }
}
