//! The invariants harness on Citus (`queen_it::harness`), run by `make citus-test`
//! (scripts/citus_test.sh), which starts a coordinator and two workers and sets:
//! - QUEEN_TEST_DSN: the coordinator, where every session of the harness connects;
//! - QUEEN_CITUS_QUEUE_A, QUEEN_CITUS_QUEUE_B: two fresh queues, one on each worker;
//! - QUEEN_CITUS_HOME_A_DSN, QUEEN_CITUS_HOME_B_DSN: their home workers, where the checks
//!   read each queue's state.
//!
//! Two harness runs at once, one per queue: pushes (some rolled back), pops in two groups
//! with every outcome, extend_lease and acks, all through the coordinator, which routes
//! each call to the queue's home by queue name or by lease id. Ignored by `cargo test`:
//! it needs that cluster.

use std::thread;

use queen_it::harness::{run, Config};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: make citus-test runs this test"))
}

#[test]
#[ignore = "needs the Citus cluster of make citus-test"]
fn queues_on_both_workers_keep_every_invariant_through_the_coordinator() {
    let runs: Vec<_> = ["A", "B"]
        .into_iter()
        .map(|k| {
            let mut cfg = Config::from_env(3_000, 2, 0);
            cfg.queue = Some(env(&format!("QUEEN_CITUS_QUEUE_{k}")));
            cfg.check_dsn = Some(env(&format!("QUEEN_CITUS_HOME_{k}_DSN")));
            cfg.routed = true;
            thread::spawn(move || {
                let report = run(&cfg);
                (cfg, report)
            })
        })
        .collect();
    for h in runs {
        let (cfg, report) = h.join().expect("a harness run failed");
        println!("{}: {report:#?}", cfg.queue.as_deref().unwrap());
        assert!(report.pushed >= cfg.messages, "every pusher finished its share");
        assert!(report.rolled_back > 0, "some pushes rolled back");
        assert!(report.dead_lettered > 0, "some messages were dead-lettered");
        assert!(
            report.duplicates.get("expiry").copied().unwrap_or(0) > 0,
            "no lease expired: the run did not exercise it"
        );
    }
}
