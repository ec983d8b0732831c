//! The soak (issue: `make soak`): two runs of the invariants harness at once, on two
//! databases, for QUEEN_SOAK_SECONDS (default 60; `make integration` runs 30 to keep `make test`
//! within its 20 minutes, `make soak` runs 600). Each run pushes (batches and single messages, some rolled back) and consumes
//! in two groups with every ack outcome, pauses and resumes of the queue and its groups,
//! acks that roll back while retention (`retention => 1`), compaction and rotation run,
//! fail points armed now and then in the sessions' own calls, and half of its sessions
//! through PgBouncer (QUEEN_TEST_POOLER_DSN, when set). The first run's chaos thread
//! `kill -9`s backends and stops the server immediately all along; a crash restarts the
//! whole cluster, so the second run, which kills nothing itself, goes through them too.
//! Then the queues drain and the checks run.
//!
//! It prints the figures of both runs and asserts that nothing was lost, skipped, or
//! delivered again to a group whose ack committed, and that the server log gained no
//! PANIC. A binary of its own, like `chaos.rs`: its crashes would break tests beside it.

use std::thread;
use std::time::{Duration, Instant};

use queen_it::harness::{run_report, Config, Report};

fn soak_config(seconds: u64, seed: u64) -> Config {
    let mut cfg = Config::from_env(0, 3, 0);
    cfg.pushers = 4;
    cfg.partitions = 8;
    cfg.batch_max = 20;
    cfg.single_share = 0.5;
    cfg.seed = seed;
    cfg.compactor = true;
    cfg.rotator = true;
    cfg.pauser = true;
    cfg.retention = 1;
    cfg.rollback_acks = true;
    cfg.failpoints = true;
    cfg.crashes = true;
    cfg.duration = Some(Duration::from_secs(seconds));
    // The consumers keep up (the drain after the pushes stays short).
    cfg.max_backlog = 2_000;
    cfg.deadline = Duration::from_secs(seconds + 600);
    cfg
}

/// PANIC lines in the test cluster's server log so far.
fn server_panics() -> Vec<String> {
    let dir = std::env::var("QUEEN_TEST_DIR").expect("QUEEN_TEST_DIR (set by make integration / make soak)");
    let log = std::fs::read(format!("{dir}/server.log")).unwrap_or_default();
    String::from_utf8_lossy(&log).lines().filter(|l| l.contains("PANIC:")).map(str::to_string).collect()
}

fn table(runs: &[(&str, &Report)]) {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |name: &str, f: &dyn Fn(&Report) -> String| {
        rows.push((name.to_string(), runs.iter().map(|(_, r)| f(r)).collect()));
    };
    row("seconds", &|r| format!("{:.0}", r.seconds));
    row("sessions (through PgBouncer)", &|r| format!("{} ({})", r.sessions, r.pooled_sessions));
    row("messages committed", &|r| r.committed.to_string());
    row("  pushes returned", &|r| r.pushed.to_string());
    row("  pushes rolled back (faults included)", &|r| r.rolled_back.to_string());
    row("  pushes of unknown fate (crash)", &|r| r.push_unknown.to_string());
    row("delivered (per group, summed)", &|r| r.delivered.to_string());
    row("  deliveries (rows popped)", &|r| r.deliveries.to_string());
    row("pauses (queue and groups)", &|r| r.pauses.to_string());
    row("LOST", &|r| r.lost.to_string());
    row("SKIPPED", &|r| r.skipped.to_string());
    row("DELIVERED AGAIN AFTER A COMMITTED ACK", &|r| r.duplicated_after_commit.to_string());
    row("passed twice by the cursor", &|r| r.passed_twice.to_string());
    row("invariants broken (all kinds, first 50)", &|r| r.violations.len().to_string());
    let errors: std::collections::BTreeSet<String> = runs.iter().flat_map(|(_, r)| r.errors.keys().cloned()).collect();
    row("ERRORS (no fault or crash explains them)", &|r| r.errors.values().sum::<usize>().to_string());
    for e in errors {
        row(&format!("  {e}"), &|r| r.errors.get(&e).copied().unwrap_or(0).to_string());
    }
    let causes: std::collections::BTreeSet<&str> =
        runs.iter().flat_map(|(_, r)| r.duplicates.keys().copied()).collect();
    for cause in causes {
        row(&format!("duplicates: {cause}"), &|r| r.duplicates.get(cause).copied().unwrap_or(0).to_string());
    }
    row("dead-lettered", &|r| r.dead_lettered.to_string());
    row("acks rolled back", &|r| r.rolled_back_acks.to_string());
    row("fail points armed", &|r| r.armed.to_string());
    row("faults injected", &|r| r.faults.to_string());
    let points: std::collections::BTreeSet<String> =
        runs.iter().flat_map(|(_, r)| r.faults_by_point.keys().cloned()).collect();
    for p in points {
        row(&format!("  faults: {p}"), &|r| r.faults_by_point.get(&p).copied().unwrap_or(0).to_string());
    }
    row("transaction ends deferred", &|r| r.deferred_ends.to_string());
    let kinds: std::collections::BTreeSet<&str> = runs.iter().flat_map(|(_, r)| r.kills.keys().copied()).collect();
    for k in kinds {
        row(&format!("crashes: {k}"), &|r| r.kills.get(k).copied().unwrap_or(0).to_string());
    }
    row("generation rotations", &|r| r.rotations.to_string());

    let w = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let cw = 12;
    print!("{:w$}", "");
    for (name, _) in runs {
        print!(" {name:>cw$}");
    }
    println!();
    for (name, vals) in &rows {
        print!("{name:w$}");
        for v in vals {
            print!(" {v:>cw$}");
        }
        println!();
    }
}

#[test]
fn soak_two_databases_with_crashes_faults_and_rolled_back_acks() {
    let seconds: u64 = std::env::var("QUEEN_SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let seed: u64 = std::env::var("QUEEN_HARNESS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x50a4);
    let pooler = std::env::var("QUEEN_TEST_POOLER_DSN").ok();
    let panics_before = server_panics().len();
    let started = Instant::now();

    // Run A: the integration tests' database (where the background worker runs retention
    // every second, scripts/test.conf); its chaos thread crashes the cluster all along.
    let mut a = soak_config(seconds, seed);
    a.kills = usize::MAX;
    a.chaos_pause_ms = (1_500, 4_000);
    a.pooler_dsn = pooler.clone();
    // Run B: a database of its own (its generations rotate on its own data).
    let own = queen_it::own_database();
    let own_name = own.rsplit("dbname=").next().unwrap().trim().to_string();
    let mut b = soak_config(seconds, seed ^ 0xb0b);
    b.dsn = Some(own);
    // In a conninfo string a later keyword wins.
    b.pooler_dsn = pooler.map(|p| format!("{p} dbname={own_name}"));
    println!(
        "soak: {seconds} s, seed {seed}, database A: the test database, B: {own_name}, PgBouncer: {}",
        if a.pooler_dsn.is_some() { "half the sessions" } else { "none (QUEEN_TEST_POOLER_DSN unset)" }
    );

    let handles: Vec<_> = [a, b].into_iter().map(|cfg| thread::spawn(move || run_report(&cfg))).collect();
    let reports: Vec<Report> = handles.into_iter().map(|h| h.join().expect("a soak run failed")).collect();
    let panics = server_panics();
    println!("\nsoak figures ({:.0} s wall):", started.elapsed().as_secs_f64());
    table(&[("A", &reports[0]), ("B", &reports[1])]);
    for (name, r) in ["A", "B"].iter().zip(&reports) {
        for v in &r.violations {
            println!("run {name}: {v}");
        }
    }
    let new_panics = &panics[panics_before.min(panics.len())..];
    for p in new_panics {
        println!("server log: {p}");
    }

    for (name, r) in ["A", "B"].iter().zip(&reports) {
        assert_eq!(r.lost, 0, "run {name}: messages lost");
        assert_eq!(r.skipped, 0, "run {name}: messages skipped");
        assert_eq!(r.duplicated_after_commit, 0, "run {name}: delivered again after a committed ack");
        assert!(r.violations.is_empty(), "run {name}: {} invariant(s) broken: {:?}", r.violations.len(), r.violations);
        assert!(
            r.committed > 0 && r.rolled_back_acks > 0 && r.faults > 0,
            "run {name} did not exercise the soak: {r:#?}"
        );
    }
    assert!(new_panics.is_empty(), "the server log gained {} PANIC line(s)", new_panics.len());
    let crashes: usize = reports[0].kills.values().sum();
    assert!(
        crashes > 0 && reports[0].kills.contains_key("immediate stop"),
        "no crash happened: {:?}",
        reports[0].kills
    );
}
