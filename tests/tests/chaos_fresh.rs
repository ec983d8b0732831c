//! Crash tests of the single-message path: `kill -9` in the middle of single pushes (the
//! fresh tier), of compaction passes and of retention passes that rotate the segment
//! generations, and immediate stops, while the invariants harness runs. A binary of its
//! own, like `chaos.rs`: its kills would break tests beside it.

use queen_it::harness::{run, Config};

/// Single-message pushes (the fresh tier) with a session compacting it and one running
/// retention passes that rotate the segment generations (`retention => 1`): kill -9 in the
/// middle of single pushes, compaction passes and rotations, and immediate stops.
#[test]
fn kill_9_during_single_pushes_compaction_and_rotation_loses_nothing() {
    let mut cfg = Config::from_env(12_000, 2, 14);
    cfg.pushers = 8;
    cfg.partitions = 2;
    cfg.batch_max = 1;
    cfg.compactor = true;
    cfg.retention = 1;
    cfg.rotator = true;
    // The generations are per database: this run's own data decides when a rotation is due.
    queen_it::use_database(queen_it::own_database());
    let report = run(&cfg);
    println!("{report:#?}");
    assert!(report.rotations >= 2, "the segment generations rotated {} times during the run", report.rotations);
    for what in ["push", "pop", "ack", "compaction", "retention and rotation", "immediate stop"] {
        assert!(report.kills.get(what).copied().unwrap_or(0) > 0, "no crash of kind {what:?} happened");
    }
}
