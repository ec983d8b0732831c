//! The invariants harness while a REPEATABLE READ transaction holds the xmin horizon back
//! for the whole run (issue 13): single-message pushes over 16 partitions (the fresh tier,
//! compacted by the background worker and by a session), two groups of consumers with
//! every outcome. No loss, no skip, no duplicate beyond the documented causes; and the
//! lane journal keeps being emptied although nothing dead can be vacuumed meanwhile.

use queen_it::harness::{run, Config};

#[test]
fn a_held_snapshot_keeps_every_invariant_and_the_journal_short() {
    let mut cfg = Config::from_env(6_000, 3, 0);
    cfg.batch_max = 1;
    cfg.compactor = true;
    cfg.held_snapshot = true;
    let report = run(&cfg);
    println!("{report:#?}");
    assert!(report.pushed >= cfg.messages, "every pusher finished its share");
    assert!(report.journal_written > 0, "no ack wrote to the lane journal: the registry was not in use");
    assert!(
        report.journal_left * 2 < report.journal_written,
        "the lane journal was not emptied under the held snapshot: {} of {} entries left",
        report.journal_left,
        report.journal_written
    );
}
