//! Every database of the cluster where queen is installed gets the same service: its own
//! maintenance worker (started by `CREATE EXTENSION`, gone with `DROP EXTENSION`, out of
//! the way of `DROP DATABASE` and `CREATE DATABASE ... TEMPLATE`), lanes that are evicted
//! and reloaded whatever happens elsewhere, and registry state (lanes, leases, partition
//! offsets) that never mixes with another database's, even one copied from it.

use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use queen_it::{connect, dsn, OwnCluster};

/// A new database (no extension), its name and DSN.
fn new_database(prefix: &str) -> (String, String) {
    let name = format!("{prefix}_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    connect().batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    let own = format!("{} dbname={name}", dsn());
    (name, own)
}

fn workers(admin: &mut Client, db: &str) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queen maintenance' AND datname = $1",
            &[&db],
        )
        .unwrap()
        .get(0)
}

/// Waits (up to `secs`) until `db` has `n` maintenance workers.
fn wait_workers(admin: &mut Client, db: &str, n: i64, secs: u64) {
    queen_it::eventually(secs, || match workers(admin, db) {
        got if got == n => Ok(()),
        got => Err(format!("database {db}: {got} maintenance workers, expected {n}")),
    })
}

#[test]
fn every_database_gets_a_worker_that_leaves_for_drop_database() {
    let mut admin = connect();
    let (db, own) = new_database("qdb");
    let mut c = Client::connect(&own, NoTls).unwrap();
    assert_eq!(workers(&mut admin, &db), 0, "no queen there: no worker");
    c.batch_execute("CREATE EXTENSION queen").unwrap();
    wait_workers(&mut admin, &db, 1, 15);
    // The worker maintains the database: a consumed segment past its retention goes.
    c.batch_execute(
        "SELECT queen.configure('w', retention => 1);
         SELECT count(*) FROM queen.push('w', '1');
         SELECT count(*) FROM queen.pop('w', auto_ack => true);",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.query_one("SELECT count(*) FROM queen.segments", &[]).unwrap().get::<_, i64>(0)
        + c.query_one("SELECT count(*) FROM queen.fresh_segments", &[]).unwrap().get::<_, i64>(0)
        > 0
    {
        assert!(Instant::now() < deadline, "the worker of {db} did not apply retention");
        std::thread::sleep(Duration::from_millis(300));
    }
    // DROP EXTENSION: the worker goes; CREATE EXTENSION: it comes back.
    c.batch_execute("DROP EXTENSION queen").unwrap();
    wait_workers(&mut admin, &db, 0, 15);
    c.batch_execute("CREATE EXTENSION queen").unwrap();
    wait_workers(&mut admin, &db, 1, 15);
    drop(c);
    // DROP DATABASE without FORCE while the worker runs: it leaves.
    admin.batch_execute(&format!("DROP DATABASE {db}")).unwrap();
    assert_eq!(workers(&mut admin, &db), 0);
}

#[test]
fn a_database_copied_from_another_shares_no_lane_lease_or_offset() {
    let mut admin = connect();
    let (a, own_a) = new_database("qsrc");
    let mut ca = Client::connect(&own_a, NoTls).unwrap();
    ca.batch_execute(
        "CREATE EXTENSION queen;
         SELECT queen.create_group('tq', 'g');
         SELECT count(*) FROM queen.push_batch('tq', (SELECT jsonb_agg(jsonb_build_object('payload', i))
                                                     FROM generate_series(1, 10) i));",
    )
    .unwrap();
    wait_workers(&mut admin, &a, 1, 15);
    drop(ca);
    // The copy needs the source to itself: its worker leaves for it (and comes back).
    let b = format!("qcopy_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    admin.batch_execute(&format!("CREATE DATABASE {b} TEMPLATE {a}")).unwrap();
    let own_b = format!("{} dbname={b}", dsn());
    let mut cb = Client::connect(&own_b, NoTls).unwrap();
    let mut ca = Client::connect(&own_a, NoTls).unwrap();
    // The same partition ids in both databases: consuming in the copy leaves the source's
    // cursor alone.
    let same: bool = cb
        .query_one(
            "SELECT partition_id = $1 FROM queen.partitions",
            &[&ca.query_one("SELECT partition_id FROM queen.partitions", &[]).unwrap().get::<_, uuid::Uuid>(0)],
        )
        .unwrap()
        .get(0);
    assert!(same, "a template copy keeps partition ids");
    let n = cb.query("SELECT 1 FROM queen.pop('tq', 'g', batch => 100, auto_ack => true)", &[]).unwrap().len();
    assert_eq!(n, 10);
    // A lease of the source cannot be acked or extended from the copy.
    let lease: uuid::Uuid =
        ca.query_one("SELECT DISTINCT lease_id FROM queen.pop('tq', 'g', batch => 100)", &[]).unwrap().get(0);
    let from_b: serde_json::Value = cb.query_one("SELECT queen.ack($1)", &[&lease]).unwrap().get(0);
    assert_eq!(from_b["lanes"], serde_json::json!([]), "{from_b}");
    let ext: serde_json::Value = cb.query_one("SELECT queen.extend_lease($1, 30)", &[&lease]).unwrap().get(0);
    assert_eq!(ext["success"], false, "{ext}");
    // In the source every message is still there, under that lease.
    let acked: serde_json::Value = ca.query_one("SELECT queen.ack($1)", &[&lease]).unwrap().get(0);
    assert_eq!(acked["lanes"][0]["committed"], 10, "{acked}");
    // Offsets too: a push in each gets the next offset of its own database.
    let next_b: i64 = cb.query_one("SELECT msg_offset FROM queen.push('tq', '11')", &[]).unwrap().get(0);
    let next_a: i64 = ca.query_one("SELECT msg_offset FROM queen.push('tq', '11')", &[]).unwrap().get(0);
    assert_eq!((next_a, next_b), (11, 11));
    drop((ca, cb));
    admin.batch_execute(&format!("DROP DATABASE {b}")).unwrap();
    admin.batch_execute(&format!("DROP DATABASE {a}")).unwrap();
}

/// A database whose consumers touch more lanes than `queen.tracked_lanes` (4096 in the test
/// cluster), next to the shared test database: lanes are evicted and reloaded in any
/// database (0.3.0 evicted only in the worker's one), and every message is consumed.
#[test]
fn more_lanes_than_the_registry_holds_are_served_in_any_database() {
    let (db, own) = new_database("qlanes");
    let mut c = Client::connect(&own, NoTls).unwrap();
    c.batch_execute("CREATE EXTENSION queen").unwrap();
    let parts = 6_000;
    let tracked: i32 = c.query_one("SELECT current_setting('queen.tracked_lanes')::int", &[]).unwrap().get(0);
    assert!(tracked < parts, "the registry must be smaller than the lanes used: {tracked}");
    for chunk in 0..parts / 1000 {
        c.execute(
            "SELECT count(*) FROM queen.push_batch('many', (SELECT jsonb_agg(jsonb_build_object(
                                                        'partition', 'p' || i, 'payload', i))
                                                      FROM generate_series($1::int, $1::int + 999) i))",
            &[&(chunk * 1000)],
        )
        .unwrap();
    }
    let mut got = 0usize;
    let deadline = Instant::now() + Duration::from_secs(120);
    while got < parts as usize {
        assert!(Instant::now() < deadline, "only {got} of {parts} consumed");
        let n = c
            .query("SELECT 1 FROM queen.pop('many', batch => 1000, max_partitions => 1000, auto_ack => true)", &[])
            .unwrap()
            .len();
        assert!(n > 0, "a pop found nothing while {} messages wait", parts as usize - got);
        got += n;
    }
    let lag: i64 = c.query_one("SELECT coalesce(sum(lag), 0)::int8 FROM queen.status('many')", &[]).unwrap().get(0);
    assert_eq!(lag, 0);
    drop(c);
    connect().batch_execute(&format!("DROP DATABASE {db}")).unwrap();
}

/// Databases without queen do not use up `queen.max_databases`: a worker looks whether
/// queen is installed and its slot goes back. Here 3 slots, 8 databases without queen,
/// then 2 with it: both get their worker, and their acks work.
#[test]
fn databases_without_queen_leave_the_slots_to_those_with_it() {
    let cluster = OwnCluster::start(5497, "queen.max_databases = 3\n");
    let mut admin = Client::connect(&cluster.dsn("postgres"), NoTls).unwrap();
    for k in 0..8 {
        admin.batch_execute(&format!("CREATE DATABASE plain_{k}")).unwrap();
    }
    // The launcher looks at all of them (a round every 5 s, a few at a time).
    std::thread::sleep(Duration::from_secs(12));
    for db in ["with_a", "with_b"] {
        admin.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
        let mut c = Client::connect(&cluster.dsn(db), NoTls).unwrap();
        c.batch_execute("CREATE EXTENSION queen").unwrap();
    }
    for db in ["with_a", "with_b"] {
        wait_workers(&mut admin, db, 1, 60);
        let mut c = Client::connect(&cluster.dsn(db), NoTls).unwrap();
        c.batch_execute("SELECT count(*) FROM queen.push('q', '1')").unwrap();
        let lease: uuid::Uuid = c.query_one("SELECT lease_id FROM queen.pop('q')", &[]).unwrap().get(0);
        let acked: serde_json::Value = c.query_one("SELECT queen.ack($1)", &[&lease]).unwrap().get(0);
        assert_eq!(acked["items"][0]["success"], true, "{db}: {acked}");
        assert_eq!(acked["lanes"][0]["committed"], 1, "{db}: {acked}");
    }
    for k in 0..8 {
        assert_eq!(workers(&mut admin, &format!("plain_{k}")), 0);
    }
}

/// `CREATE EXTENSION queen` in a prepared transaction, as Citus creates it on its workers:
/// the database gets its worker once `COMMIT PREPARED` is done, from another session, and
/// not five minutes later. The launcher has probed the database first (no queen there).
#[test]
fn an_extension_created_in_a_prepared_transaction_gets_its_worker_at_commit_prepared() {
    let mut admin = connect();
    let (name, own) = new_database("qprep");
    // The launcher looks at a new database within a round (5 s), finds no queen, and
    // would look again only after five minutes.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(workers(&mut admin, &name), 0);
    let gid = format!("create-queen-{name}");
    let mut c = Client::connect(&own, NoTls).unwrap();
    c.batch_execute(&format!("BEGIN; CREATE EXTENSION queen; PREPARE TRANSACTION '{gid}'")).unwrap();
    drop(c);
    // Prepared, not committed: queen is not there yet, and no worker comes.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(workers(&mut admin, &name), 0, "a worker before COMMIT PREPARED");
    let mut other = Client::connect(&own, NoTls).unwrap();
    other.batch_execute(&format!("COMMIT PREPARED '{gid}'")).unwrap();
    wait_workers(&mut admin, &name, 1, 20);
}
