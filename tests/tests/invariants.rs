//! The invariants harness at CI size (see `queen_it::harness` for what it checks).
//! The large run of the issue: QUEEN_HARNESS_MESSAGES=100000 QUEEN_HARNESS_CONSUMERS=8.

use queen_it::harness::{run, Config};

#[test]
fn concurrent_outcomes_keep_every_invariant() {
    let mut cfg = Config::from_env(12_000, 3, 0);
    // The queue and its groups are paused and resumed all along (queen.pause).
    cfg.pauser = true;
    let report = run(&cfg);
    println!("{report:#?}");
    assert!(report.pushed >= cfg.messages, "every pusher finished its share");
    assert!(report.rolled_back > 0, "some pushes rolled back");
    assert!(report.dead_lettered > 0, "some messages were dead-lettered");
    for cause in ["expiry", "nack"] {
        assert!(
            report.duplicates.get(cause).copied().unwrap_or(0) > 0,
            "no duplicate from {cause}: the run did not exercise it"
        );
    }
    assert!(report.pauses > 0, "the pauser never paused: the run did not exercise it");
}

/// The shape a newcomer starts with: eight producers pushing single messages to one
/// partition, a fifth of them rolled back (gaps), while a session compacts the fresh tier.
#[test]
fn single_message_producers_on_one_partition_keep_every_invariant() {
    let mut cfg = Config::from_env(8_000, 3, 0);
    cfg.pushers = 8;
    cfg.partitions = 1;
    cfg.batch_max = 1;
    cfg.compactor = true;
    let report = run(&cfg);
    println!("{report:#?}");
    assert!(report.pushed >= cfg.messages, "every pusher finished its share");
    assert!(report.rolled_back > 0, "some pushes rolled back");
}

/// A queue with a short message ttl, paused and resumed all along (which makes messages
/// wait): what a group did not consume in time becomes an `expired` dead letter of that
/// group, passed in order; everything else is delivered. Nothing is lost or skipped.
#[test]
fn expiring_messages_keep_every_invariant() {
    let mut cfg = Config::from_env(4_000, 2, 0);
    cfg.ttl_ms = 300;
    cfg.pauser = true;
    let report = run(&cfg);
    println!("{report:#?}");
    assert!(report.pushed >= cfg.messages, "every pusher finished its share");
    assert!(report.expired > 0, "no message expired: the run did not exercise the ttl");
    assert!(report.delivered > 0, "nothing was delivered in time");
}

/// A skip group with a small max_lag beside a holding one that has rate limits and a
/// concurrency cap, while one session runs retention and another redrives dead letters to
/// the group that failed them, all along: the skip group is moved past its oldest messages many times, each span filed
/// as one `skipped` dead letter. Every committed message is delivered to each group, or,
/// for the skip group, inside a span it skipped; no offset is passed twice.
#[test]
fn skip_overflow_keeps_every_invariant() {
    let mut cfg = Config::from_env(4_000, 2, 0);
    cfg.skip_max_lag = 30;
    cfg.pauser = true;
    cfg.limits = true;
    cfg.redriver = true;
    let report = run(&cfg);
    println!("{report:#?}");
    assert!(report.pushed >= cfg.messages, "every pusher finished its share");
    assert!(report.skip_spans > 0, "the skip group never skipped: the run did not exercise it");
    assert!(report.delivered > report.pushed, "the skip group got none of its messages");
    assert!(report.redriven > 0, "nothing was redriven: the run did not exercise it");
}
