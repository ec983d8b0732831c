//! Maintenance never stops: a step that fails (a partition whose compaction fails, here
//! by a fail point of the test build) is logged, counted in `queen.metrics()`, skipped and
//! tried again later, and every other pass goes on meanwhile (a fresh segment that cannot
//! be decoded does not stop compaction either: pg_test/sql/compaction.sql). And the lane
//! journal is emptied while a transaction that read lanes (a `status`) stays open.

use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use queen_it::{connect, dsn};

/// A new database with queen installed, whose maintenance worker starts with `settings`
/// (`ALTER DATABASE ... SET` before the extension exists, so the worker reads them when it
/// connects).
fn database_with(settings: &[&str]) -> (String, Client) {
    let name = format!("qmaint_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut admin = connect();
    admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    for s in settings {
        admin.batch_execute(&format!("ALTER DATABASE {name} SET {s}")).unwrap();
    }
    let mut c = Client::connect(&format!("{} dbname={name}", dsn()), NoTls).unwrap();
    c.batch_execute("CREATE EXTENSION queen").unwrap();
    (name, c)
}

fn metric(c: &mut Client, name: &str) -> f64 {
    c.query_opt("SELECT value FROM queen.metrics('maintenance') WHERE metric = $1", &[&name])
        .unwrap()
        .map_or(0.0, |r| r.get(0))
}

/// The failed steps of every maintenance pass so far.
fn step_errors(c: &mut Client) -> f64 {
    c.query_one(
        "SELECT coalesce(sum(value), 0) FROM queen.metrics('maintenance') WHERE metric LIKE 'maintenance\\_%\\_errors'",
        &[],
    )
    .unwrap()
    .get(0)
}

fn drop_database(name: &str) {
    connect().batch_execute(&format!("DROP DATABASE {name}")).unwrap();
}

#[test]
fn a_failing_compaction_step_stops_no_other_pass() {
    // The worker's first two compaction steps fail.
    let (db, mut c) = database_with(&["queen.failpoint = 'compaction.partition:2'"]);
    c.batch_execute(
        "SELECT count(*) FROM queen.push('m', '1', 'p1');
         SELECT count(*) FROM queen.push('m', '2', 'p2');
         SELECT queen.configure('r', retention => 1);
         SELECT count(*) FROM queen.push_batch('r', '[{\"payload\": 1}, {\"payload\": 2}]');
         SELECT count(*) FROM queen.pop('r', batch => 10, auto_ack => true);",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    // The failures are counted, and retention and the journal go on meanwhile.
    loop {
        let errors = metric(&mut c, "maintenance_compaction_errors");
        let retained: i64 = c
            .query_one(
                "SELECT count(*) FROM queen.segments s JOIN queen.partitions p USING (partition_id)
                   JOIN queen.queues q USING (queue_id) WHERE q.name = 'r'",
                &[],
            )
            .unwrap()
            .get(0);
        if errors >= 1.0 && retained == 0 && metric(&mut c, "maintenance_journal_runs") >= 2.0 {
            break;
        }
        assert!(Instant::now() < deadline, "errors {errors}, segments of r left {retained}");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(metric(&mut c, "maintenance_worker_running"), 1.0);
    // The failed partitions are tried again (after their backoff) and merged: the fresh
    // tier empties (a run of one message waits 10 s before it is merged).
    loop {
        let fresh: i64 = c.query_one("SELECT count(*) FROM queen.fresh_segments", &[]).unwrap().get(0);
        if fresh == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{fresh} fresh segments never merged");
        std::thread::sleep(Duration::from_millis(300));
    }
    let n = c.query("SELECT 1 FROM queen.pop('m', batch => 10, max_partitions => 2, auto_ack => true)", &[]).unwrap();
    assert_eq!(n.len(), 2);
    assert!(metric(&mut c, "maintenance_compaction_age_seconds") < 30.0, "compaction succeeded since");
    drop(c);
    drop_database(&db);
}

#[test]
fn a_step_that_keeps_failing_makes_its_pass_age() {
    // One partition's compaction fails on every try. Between its tries (a backoff of 5 s,
    // then 10, ...) the passes skip it: they must not count as successes, or the pass's
    // age_seconds would stay small, and an alert on it would never fire, for a partition
    // that is never compacted.
    let (db, mut c) = database_with(&["queen.failpoint = 'compaction.partition:1000000'"]);
    c.batch_execute("SELECT count(*) FROM queen.push('never', '1', 'p1')").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&mut c, "maintenance_compaction_errors") < 1.0 {
        assert!(Instant::now() < deadline, "compaction never failed");
        std::thread::sleep(Duration::from_millis(100));
    }
    let failed = Instant::now();
    // Passes run every second meanwhile (skipping the partition); it is tried again after
    // 5 s.
    std::thread::sleep(Duration::from_secs(8));
    let since = failed.elapsed().as_secs_f64();
    let age: Option<f64> = c
        .query_opt(
            "SELECT value FROM queen.metrics('maintenance') WHERE metric = 'maintenance_compaction_age_seconds'",
            &[],
        )
        .unwrap()
        .map(|r| r.get(0));
    let age = age.expect("compaction has run, so it has an age");
    assert!(age >= since, "age {age} s, yet partition p1 has not been compacted for {since} s");
    assert!(metric(&mut c, "maintenance_compaction_errors") >= 2.0, "tried again after its backoff");
    let fresh: i64 = c.query_one("SELECT count(*) FROM queen.fresh_segments", &[]).unwrap().get(0);
    assert_eq!(fresh, 1, "the failing partition stays uncompacted");
    drop(c);
    drop_database(&db);
}

#[test]
fn the_journal_empties_while_a_transaction_that_loaded_lanes_stays_open() {
    let (db, mut c) = database_with(&[]);
    c.batch_execute(
        "SELECT count(*) FROM queen.push_batch('j', (SELECT jsonb_agg(jsonb_build_object('partition', 'p' || (i % 5),
                                                                                  'payload', i))
                                                   FROM generate_series(1, 50) i));",
    )
    .unwrap();
    let mut holder = Client::connect(&format!("{} dbname={db}", dsn()), NoTls).unwrap();
    // Loads the lanes (none exist yet: the first pop creates the group), and stays open.
    c.query("SELECT 1 FROM queen.pop('j', batch => 1, auto_ack => true)", &[]).unwrap();
    holder.batch_execute("BEGIN; SELECT count(*) FROM queen.status('j');").unwrap();
    // Acks (auto-ack pops) write journal entries.
    for _ in 0..10 {
        c.query("SELECT 1 FROM queen.pop('j', batch => 5, max_partitions => 5, auto_ack => true)", &[]).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = queen_it::journal_entries(&mut c);
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} journal entries stay while a transaction that read lanes is open");
        std::thread::sleep(Duration::from_millis(300));
    }
    holder.batch_execute("COMMIT").unwrap();
    drop((c, holder));
    drop_database(&db);
}

/// The pid of `db`'s maintenance worker, waiting up to 30 s for one.
fn worker_pid(admin: &mut Client, db: &str) -> i32 {
    worker_pid_other_than(admin, db, 0, Duration::from_millis(200))
}

/// The pid of `db`'s maintenance worker, other than `old`, looked for every `every`.
fn worker_pid_other_than(admin: &mut Client, db: &str, old: i32, every: Duration) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(r) = admin
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'queen maintenance' AND datname = $1
                    AND pid <> $2",
                &[&db, &old],
            )
            .unwrap()
        {
            return r.get(0);
        }
        assert!(Instant::now() < deadline, "no maintenance worker in {db}");
        std::thread::sleep(every);
    }
}

#[test]
fn a_role_that_may_not_run_a_statement_cannot_stop_the_worker_with_it() {
    // The hooks that make a database's worker leave (a DROP or RENAME of the database, a
    // change of the extension) run before PostgreSQL checks the role's rights: a role
    // that may only log in must not stop the worker by trying them and failing.
    let (db, c) = database_with(&[]);
    let mut admin = connect();
    let role = format!("nobody_{}", &db[7..]);
    admin.batch_execute(&format!("CREATE ROLE {role} LOGIN")).unwrap();
    let before = worker_pid(&mut admin, &db);
    let as_role = |dbname: &str| {
        let d = dsn().replace("user=postgres", &format!("user={role}"));
        Client::connect(&format!("{d} dbname={dbname}"), NoTls).unwrap()
    };
    let mut elsewhere = as_role("postgres");
    let mut inside = as_role(&db);
    for (inside_db, sql) in [
        (false, format!("DROP DATABASE {db}")),
        (false, format!("ALTER DATABASE {db} RENAME TO {db}_x")),
        (false, format!("CREATE DATABASE {db}_copy TEMPLATE {db}")),
        (true, "DROP EXTENSION queen".to_string()),
        (true, "ALTER EXTENSION queen UPDATE".to_string()),
    ] {
        let client = if inside_db { &mut inside } else { &mut elsewhere };
        assert!(client.batch_execute(&sql).is_err(), "{sql} is refused to {role}");
    }
    // Skipped (queen exists), in a transaction left open meanwhile.
    inside.batch_execute("BEGIN; CREATE EXTENSION IF NOT EXISTS queen").unwrap();
    assert_eq!(worker_pid(&mut admin, &db), before, "the worker kept running");
    inside.batch_execute("ROLLBACK").unwrap();
    drop((elsewhere, inside, c));
    admin.batch_execute(&format!("DROP ROLE {role}")).unwrap();
    drop_database(&db);
}

/// Sends `pg_cancel_backend(pid)` as fast as one connection can (about one each 0.1 to
/// 1 ms) for `how_long`, pushing a message to `c`'s database after every tenth (work for
/// the worker's steps); returns how many were sent.
fn cancel_for(admin: &mut Client, c: &mut Client, pid: i32, how_long: Duration) -> usize {
    let until = Instant::now() + how_long;
    let mut sent = 0;
    while Instant::now() < until {
        let signalled: bool = admin.query_one("SELECT pg_cancel_backend($1)", &[&pid]).unwrap().get(0);
        assert!(signalled, "no process {pid} to cancel");
        sent += 1;
        if sent % 10 == 0 {
            c.execute(
                "SELECT count(*) FROM queen.push('w', '1', partition => 'p' || ($1::int % 7))",
                &[&(sent as i32)],
            )
            .unwrap();
        }
    }
    sent
}

fn running(admin: &mut Client, pid: i32) -> bool {
    admin.query_one("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", &[&pid]).unwrap().get(0)
}

#[test]
fn a_cancel_at_any_moment_does_not_end_the_worker() {
    // An operator cancelling "a slow compaction" with pg_cancel_backend may hit the worker
    // anywhere: inside a step (that step fails, and is tried again later), while it waits,
    // between two steps, or in its start-up. None of those may end it: its database's
    // maintenance would stop until the launcher starts another.
    let (db, mut c) = database_with(&[]);
    c.batch_execute(
        "SELECT count(*) FROM generate_series(1, 20) i, LATERAL queen.push('w', '1', partition => 'p' || i);
         SELECT count(*) FROM queen.pop('w', batch => 5, max_partitions => 5, auto_ack => true);",
    )
    .unwrap();
    let mut admin = connect();
    let pid = worker_pid(&mut admin, &db);
    let before = step_errors(&mut c);
    let sent = cancel_for(&mut admin, &mut c, pid, Duration::from_secs(3));
    std::thread::sleep(Duration::from_millis(500));
    assert!(running(&mut admin, pid), "the running worker ended on one of {sent} cancels");
    // Some of them landed in a step, and failed it (what a cancel is for).
    assert!(step_errors(&mut c) > before, "no step failed on {sent} cancels");
    // A new worker, cancelled from the moment it shows up (its start-up).
    admin.execute("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    let new = worker_pid_other_than(&mut admin, &db, pid, Duration::from_millis(1));
    let sent = cancel_for(&mut admin, &mut c, new, Duration::from_secs(2));
    std::thread::sleep(Duration::from_millis(500));
    assert!(running(&mut admin, new), "a starting worker ended on one of {sent} cancels");
    assert_eq!(metric(&mut c, "maintenance_worker_running"), 1.0);
    // And it still works: a journal round runs after the cancels.
    let runs = metric(&mut c, "maintenance_journal_runs");
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&mut c, "maintenance_journal_runs") <= runs {
        assert!(Instant::now() < deadline, "no journal round after the cancels");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(running(&mut admin, new));
    drop(c);
    drop_database(&db);
}

#[test]
fn database_defaults_an_owner_may_set_do_not_stop_the_worker() {
    // Defaults an owner who is not a superuser may set for the database (set here by the
    // test's superuser): the worker's transactions must still write, and not be cancelled.
    let (db, mut c) = database_with(&[]);
    let mut admin = connect();
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {db} SET default_transaction_read_only = on;
             ALTER DATABASE {db} SET statement_timeout = '1ms';
             ALTER DATABASE {db} SET lock_timeout = '1ms';"
        ))
        .unwrap();
    // A new worker reads the database's settings when it connects.
    let old = worker_pid(&mut admin, &db);
    admin.execute("SELECT pg_terminate_backend($1)", &[&old]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while worker_pid(&mut admin, &db) == old {
        assert!(Instant::now() < deadline, "the worker did not come back");
        std::thread::sleep(Duration::from_millis(200));
    }
    let journal_before = metric(&mut c, "maintenance_journal_runs");
    // Work for compaction (this session connected before the settings), and acks for the
    // journal.
    c.batch_execute(
        "SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'ro', 'payload', i))
                                                  FROM generate_series(1, 300) i));
         SELECT count(*) FROM queen.push('ro', '1');
         SELECT count(*) FROM queen.pop('ro', batch => 1000, auto_ack => true);",
    )
    .unwrap();
    loop {
        let fresh: i64 = c.query_one("SELECT count(*) FROM queen.fresh_segments", &[]).unwrap().get(0);
        let journal = metric(&mut c, "maintenance_journal_runs");
        if fresh == 0 && journal >= journal_before + 2.0 {
            break;
        }
        assert!(Instant::now() < deadline, "{fresh} fresh segments left, {journal} journal rounds");
        std::thread::sleep(Duration::from_millis(300));
    }
    // A journal round or two after the acks.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(step_errors(&mut c), 0.0, "no pass failed");
    drop(c);
    drop_database(&db);
}
