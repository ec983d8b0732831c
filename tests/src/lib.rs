//! Helpers for queen's integration tests: a real client against a real cluster.
//!
//! The cluster comes from `make integration`, which passes its DSN in QUEEN_TEST_DSN.
//! Without it the tests fail loudly: a test that cannot reach a server must not pass.

pub mod harness;

use postgres::{Client, NoTls};

/// Set by `use_database`: every later `dsn()` of this process names that database.
static OWN_DSN: std::sync::RwLock<Option<String>> = std::sync::RwLock::new(None);

pub fn dsn() -> String {
    if let Some(own) = OWN_DSN.read().unwrap().clone() {
        return own;
    }
    std::env::var("QUEEN_TEST_DSN").expect("QUEEN_TEST_DSN is not set: run these tests with `make integration`")
}

/// Creates a database of its own for a test, with queen installed, and returns its DSN.
/// For tests that need what is per database to themselves: the segment generations, which
/// other tests' data would otherwise decide (each database has its own maintenance
/// worker, started by `CREATE EXTENSION`).
pub fn own_database() -> String {
    own_database_with(&[])
}

/// `own_database`, with `settings` (`name = value`) set for the database before queen is
/// installed there, so that its maintenance worker, which reads them when it connects,
/// runs with them too (`queen.rotation_min_size = -1`: only the test rotates).
pub fn own_database_with(settings: &[&str]) -> String {
    let name = format!("queen_own_{}", uuid::Uuid::new_v4().simple());
    let mut admin = connect();
    // Closed to connections until its settings are in: the launcher serves only databases
    // that allow them, so no worker of it can start without them.
    admin
        .batch_execute(&format!("CREATE DATABASE {name} ALLOW_CONNECTIONS false"))
        .expect("create a database of the test's own");
    for s in settings {
        admin.batch_execute(&format!("ALTER DATABASE {name} SET {s}")).expect("a database setting");
    }
    admin.batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true")).expect("open the database");
    // In a conninfo string a later keyword wins.
    let own = format!("{} dbname={name}", dsn());
    Client::connect(&own, NoTls)
        .expect("connect to the test's own database")
        .batch_execute("CREATE EXTENSION queen")
        .expect("install queen in the test's own database");
    own
}

/// Makes every later `dsn()` of this process (and so `connect()` and the harness) name
/// `own`. For a binary whose tests all use that database.
pub fn use_database(own: String) {
    *OWN_DSN.write().unwrap() = Some(own);
}

/// Connects to `dsn`, retrying every 50 ms until `deadline` (a server restarting after a
/// crash or an immediate stop refuses connections meanwhile).
pub fn connect_to_retrying(dsn: &str, deadline: std::time::Instant) -> Client {
    loop {
        match Client::connect(dsn, NoTls) {
            Ok(c) => return c,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "cannot connect (the server did not come back?): {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}

/// `connect_to_retrying` the test cluster, for up to a minute.
pub fn connect_retrying() -> Client {
    connect_to_retrying(&dsn(), std::time::Instant::now() + std::time::Duration::from_secs(60))
}

pub fn connect() -> Client {
    Client::connect(&dsn(), NoTls).expect("connect to the test cluster")
}

/// A queue name no other test uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Polls `probe` every 100 ms until it gives a value, for at most `secs` seconds; panics
/// with the probe's last complaint when the time is up.
pub fn eventually<T>(secs: u64, mut probe: impl FnMut() -> Result<T, String>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        match probe() {
            Ok(v) => return v,
            Err(why) if std::time::Instant::now() >= deadline => panic!("after {secs} s: {why}"),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

/// How many entries the lane journal holds (both tables).
pub fn journal_entries(c: &mut Client) -> i64 {
    c.query_one("SELECT (SELECT count(*) FROM queen.lane_journal_0) + (SELECT count(*) FROM queen.lane_journal_1)", &[])
        .unwrap()
        .get(0)
}

/// A cluster of this test's own (a private data directory and port), started with
/// `settings`, stopped and removed when dropped.
pub struct OwnCluster {
    dir: String,
    port: String,
}

impl OwnCluster {
    /// Stopped and removed first, if a run before this one left it behind.
    fn fresh(port: u16) -> OwnCluster {
        let c = OwnCluster { dir: format!("/tmp/queen-own-{port}"), port: port.to_string() };
        c.run("stop");
        let _ = std::fs::remove_dir_all(&c.dir);
        c
    }

    pub fn start(port: u16, settings: &str) -> OwnCluster {
        let c = OwnCluster::fresh(port);
        let conf = format!("{}.conf", c.dir);
        std::fs::write(&conf, settings).unwrap();
        let ok = std::process::Command::new("bash")
            .args(["scripts/cluster.sh", "start", &c.dir, &c.port, &conf])
            .current_dir("..")
            .status()
            .unwrap();
        assert!(ok.success(), "start a cluster of the test's own");
        c
    }

    fn run(&self, cmd: &str) {
        let _ = std::process::Command::new("bash")
            .args(["scripts/cluster.sh", cmd, &self.dir, &self.port])
            .current_dir("..")
            .status();
    }

    /// The data directory (its `pg_hba.conf`, `server.log`).
    pub fn dir(&self) -> &str {
        &self.dir
    }

    pub fn dsn(&self, db: &str) -> String {
        format!("host={}/sock port={} user=postgres dbname={db}", self.dir, self.port)
    }

    /// A streaming standby of this cluster on `port` (`scripts/cluster.sh standby`:
    /// pg_basebackup -R), started; stopped and removed when dropped.
    pub fn standby(&self, port: u16) -> OwnCluster {
        let c = OwnCluster::fresh(port);
        let ok = std::process::Command::new("bash")
            .args(["scripts/cluster.sh", "standby", &c.dir, &c.port, &format!("{}/sock", self.dir), &self.port])
            .current_dir("..")
            .status()
            .unwrap();
        assert!(ok.success(), "start a standby");
        c
    }

    /// Promotes this standby (`scripts/cluster.sh promote`), waiting until it is done.
    pub fn promote(&self) {
        self.run("promote");
    }

    /// Stops the server at once (`scripts/cluster.sh crash`: an immediate stop).
    pub fn crash(&self) {
        self.run("crash");
    }

    /// Starts the stopped server again with `settings` added to its configuration (a later
    /// line wins over an earlier one).
    pub fn start_again(&self, settings: &str) {
        use std::io::Write;
        let mut conf = std::fs::OpenOptions::new().append(true).open(format!("{}/postgresql.conf", self.dir)).unwrap();
        writeln!(conf, "{settings}").unwrap();
        let ok = std::process::Command::new("bash")
            .args(["scripts/cluster.sh", "start", &self.dir, &self.port])
            .current_dir("..")
            .status()
            .unwrap();
        assert!(ok.success(), "start the cluster again");
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        self.run("stop");
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(format!("{}.conf", self.dir));
    }
}
