//! A `pg_dump` of a database where queen is installed holds its queues: restored into
//! another database (`psql --single-transaction -f`, as docs/concepts.md, "Backup and
//! restore", says), it delivers exactly what the source delivers from the moment of the
//! dump, to every group, with the same cursors, dead letters, options and grants (a lease
//! open at the dump is not in it: its messages come at once), and goes on from there: new
//! pushes take offsets after the restored ones, new queues new ids. Both segment tiers and
//! both generations are in the dump. A restore table by table loses nothing to the
//! maintenance worker, and one over its source nothing to what shared memory held.

use std::path::PathBuf;
use std::process::Command;

use postgres::{Client, NoTls};
use queen_it::{connect, dsn, own_database_with};
use serde_json::{json, Value};

/// The database a DSN names (its last `dbname=`).
fn dbname(dsn: &str) -> String {
    dsn.split_whitespace().filter_map(|kv| kv.strip_prefix("dbname=")).next_back().expect("a dbname").to_string()
}

/// A client program of the server's own version (pg_dump, pg_restore, psql).
fn tool(name: &str) -> Command {
    let out = Command::new("pg_config").arg("--bindir").output().expect("pg_config");
    Command::new(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join(name))
}

/// What a test made outside its databases' tables, dropped however the test ends.
#[derive(Default)]
struct Cleanup {
    databases: Vec<String>,
    roles: Vec<String>,
    files: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        let Ok(mut admin) = Client::connect(&dsn(), NoTls) else { return };
        for d in &self.databases {
            let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {d} WITH (FORCE)"));
        }
        // (A role's EXECUTE grants went with the databases.)
        for r in &self.roles {
            let _ = admin.batch_execute(&format!("DROP ROLE IF EXISTS {r}"));
        }
    }
}

fn ok(out: std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Rows of `sql` as text, in the query's order.
fn rows(c: &mut Client, sql: &str) -> Vec<String> {
    c.query(&format!("SELECT x::text FROM ({sql}) x"), &[]).unwrap().iter().map(|r| r.get(0)).collect()
}

/// Every message `group` can still be given, popped until none is left (auto_ack), as text
/// rows of partition, offset, message id, transaction id, payload and headers, sorted.
fn drain(c: &mut Client, group: &str) -> Vec<String> {
    let mut got = Vec::new();
    loop {
        let batch = rows(
            c,
            &format!(
                "SELECT partition, msg_offset, message_id, transaction_id, payload, headers
                   FROM queen.pop('dq', '{group}', batch => 1000, max_partitions => 100, auto_ack => true)"
            ),
        );
        if batch.is_empty() {
            got.sort();
            return got;
        }
        got.extend(batch);
    }
}

/// Makes a rotation of the segment generations due for `c`'s session (in a database whose
/// worker never rotates: `queen.rotation_min_size = -1`): a filler queue of ~1.5 MB,
/// consumed and past its retention, and the session's minimum size at 1 MB.
fn make_rotation_due(c: &mut Client) {
    c.batch_execute(
        "SELECT queen.configure('filler', retention => 1);
         SELECT count(*) FROM queen.push_batch('filler', (SELECT jsonb_agg(jsonb_build_object('payload',
           jsonb_build_object('pad', (SELECT string_agg(md5(i::text || '.' || j::text), '') FROM generate_series(1, 40) j))))
           FROM generate_series(1, 1500) i));
         SELECT count(*) FROM queen.pop('filler', batch => 2000, auto_ack => true);
         SELECT pg_sleep(1.2);
         SET queen.rotation_min_size = '1MB';",
    )
    .unwrap();
}

/// One retention pass over every queue; whether it rotated the generations.
fn retain_rotates(c: &mut Client) -> bool {
    c.query_one("SELECT (queen.retain()->>'generationRotated')::bool", &[]).unwrap().get(0)
}

/// Retention passes over every queue until one rotates the generations (20 s at most): a
/// pass that finds the oldest generation's tables busy (autovacuum, the worker) backs off,
/// as the worker's does, and the next one rotates.
fn rotates_soon(c: &mut Client, when: &str) {
    queen_it::eventually(20, || {
        if retain_rotates(c) {
            Ok(())
        } else {
            Err(format!("no rotation {when}; generation sizes {:?}", generation_sizes(c)))
        }
    });
}

/// Each generation's segment tables' total size (both tiers, TOAST and indexes included).
fn generation_sizes(c: &mut Client) -> Vec<(i16, i64)> {
    c.query(
        "SELECT g::int2, pg_total_relation_size(format('queen.segments_%s', g)::regclass)
                         + pg_total_relation_size(format('queen.fresh_segments_%s', g)::regclass)
           FROM generate_series(0, 1) g",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

#[test]
fn a_restored_dump_delivers_what_the_source_would() {
    let mut cleanup = Cleanup::default();
    // The source's worker never rotates its generations: only the test's retain() below
    // does (tests/tests/generations.rs).
    let src_dsn = own_database_with(&["queen.rotation_min_size = -1"]);
    cleanup.databases.push(dbname(&src_dsn));
    let mut src = Client::connect(&src_dsn, NoTls).unwrap();
    let role = format!("dump_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let gone_role = format!("{role}_gone");
    let revoked_role = format!("{role}_revoked");
    cleanup.roles.extend([role.clone(), gone_role.clone(), revoked_role.clone()]);
    src.batch_execute(&format!(
        "CREATE ROLE {role}; CREATE ROLE {gone_role};
         SELECT queen.configure('dq', retention => 3600, retry_limit => 5, dedup_window => 600);
         SELECT queen.create_group('dq', 'g1');
         SELECT queen.create_group('dq', 'g2');
         SELECT queen.grant('dq', '{role}', 'consume');
         -- a grant whose role is dropped since: left out of the dump
         SELECT queen.grant('dq', '{gone_role}', 'produce');
         DROP OWNED BY {gone_role}; DROP ROLE {gone_role};
         -- a role whose last grant went: it stays limited (a member of queen_grantee), in
         -- the restore too
         CREATE ROLE {revoked_role};
         SELECT queen.grant('dq', '{revoked_role}', 'produce');
         SELECT queen.revoke('dq', '{revoked_role}', 'produce');"
    ))
    .unwrap();

    // Generation 1 becomes the current one: retention passes until one rotates.
    make_rotation_due(&mut src);
    rotates_soon(&mut src, "of the source's generations");
    // A backend reads the current generation at most once a second.
    src.batch_execute("RESET queen.rotation_min_size; SELECT pg_sleep(1.1)").unwrap();

    // Messages in both tiers of four partitions: single pushes (fresh), batches of 100
    // (durable), some with transaction ids and headers; a compaction in between.
    let mut pushed = 0;
    for round in 0..2 {
        for i in 0..40 {
            let tx = (i % 3 == 0).then(|| format!("tx-{round}-{i}"));
            let headers = (i % 5 == 0).then(|| json!({"h": i}));
            src.execute(
                "SELECT queen.send('dq', $1, partition => $2, transaction_id => $3, headers => $4)",
                &[&json!({"round": round, "i": i}), &format!("p{}", i % 4), &tx, &headers],
            )
            .unwrap();
            pushed += 1;
        }
        let items: Value =
            (0..100).map(|i| json!({"partition": "p1", "payload": {"round": round, "batch": i}})).collect();
        src.execute("SELECT count(*) FROM queen.push_batch('dq', $1)", &[&items]).unwrap();
        pushed += 100;
        if round == 0 {
            src.batch_execute("SELECT queen.compact('dq')").unwrap();
        }
    }
    let tiers: (i64, i64, i64) = {
        let r = src
            .query_one(
                "SELECT (SELECT count(*) FROM queen.segments_1), (SELECT count(*) FROM queen.fresh_segments_1),
                        (SELECT count(*) FROM queen.generations WHERE current_generation = 1)",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert!(tiers.0 > 0 && tiers.1 > 0 && tiers.2 == 1, "both tiers in generation 1, the current one: {tiers:?}");

    // g1 consumes some and dead-letters one; g2 holds a lease of 10 at the dump.
    src.batch_execute(
        "SELECT count(*) FROM queen.pop('dq', 'g1', batch => 30, max_partitions => 4, auto_ack => true);
         SELECT queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'bad')
           FROM queen.pop('dq', 'g1', batch => 1) ;
         SELECT count(*) FROM queen.pop('dq', 'g2', batch => 10, lease_seconds => 600);",
    )
    .unwrap();

    // The dump, while the source's worker runs; the restore into a new database.
    let file = std::env::temp_dir().join(format!("queen_dump_{role}.sql"));
    cleanup.files.push(file.clone());
    ok(tool("pg_dump").args(["-d", &src_dsn, "-f", file.to_str().unwrap()]).output().unwrap(), "pg_dump");
    let dst_name = format!("{}_restored", dbname(&src_dsn));
    let mut admin = connect();
    admin.batch_execute(&format!("CREATE DATABASE {dst_name}")).unwrap();
    cleanup.databases.push(dst_name.clone());
    admin.batch_execute(&format!("ALTER DATABASE {dst_name} SET queen.rotation_min_size = -1")).unwrap();
    let dst_dsn = format!("{} dbname={dst_name}", dsn());
    ok(
        tool("psql")
            .args(["-X", "-q", "--single-transaction", "-v", "ON_ERROR_STOP=1", "-d", &dst_dsn, "-f"])
            .arg(&file)
            .output()
            .unwrap(),
        "the restore",
    );
    let mut dst = Client::connect(&dst_dsn, NoTls).unwrap();

    // The same state, read through the API (and the options from the table). A lease
    // lives in shared memory, not in the dump: the restore has none (its messages are
    // delivered again there, at once, as after a lease that ended).
    let status = "SELECT partition, partition_id, head, consumer_group, committed, retry_count, attempt_count,
                         dead_letters
                    FROM queen.status('dq') ORDER BY partition, consumer_group";
    let leases = "SELECT consumer_group FROM queen.status('dq') WHERE lease_id IS NOT NULL";
    assert_eq!(rows(&mut src, leases), vec!["(g2)".to_string()], "the source's open lease");
    assert!(rows(&mut dst, leases).is_empty(), "the restore has no lease");
    let dlq = "SELECT id, transaction_id, partition, consumer_group, data, error_message, failed_at, reason
                 FROM queen.dlq('dq') ORDER BY id";
    let options = "SELECT to_jsonb(q) - 'queue_id' FROM queen.queues q ORDER BY name";
    for sql in [status, dlq, options] {
        let (a, b) = (rows(&mut src, sql), rows(&mut dst, sql));
        assert!(!a.is_empty(), "nothing to compare: {sql}");
        assert_eq!(a, b, "the restore differs from its source: {sql}");
    }
    let grants = "SELECT queue, role, privilege FROM queen.grants() ORDER BY 1, 2, 3";
    assert_eq!(rows(&mut dst, grants), vec![format!("(dq,{role},consume)")], "grants after the restore");
    assert_eq!(rows(&mut src, grants).len(), 2, "the source keeps its dropped role's grant");
    // The role whose last grant went stays limited in the restore: it may not push to dq,
    // nor to a queue of its own making.
    for queue in ["dq", "dq_made"] {
        let refused = dst
            .batch_execute(&format!("SET ROLE {revoked_role}; SELECT queen.send('{queue}', '{{}}')"))
            .expect_err("a revoked role pushed in the restore");
        assert_eq!(refused.code(), Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE), "{refused}");
        dst.batch_execute("RESET ROLE").unwrap();
    }

    // Once g2's lease ends in the source (the restore has none), both databases give each
    // group the same messages.
    src.batch_execute("SELECT queen.revoke_lease(lease_id) FROM queen.status('dq') WHERE lease_id IS NOT NULL")
        .unwrap();
    for group in ["g1", "g2"] {
        let (a, b) = (drain(&mut src, group), drain(&mut dst, group));
        assert_eq!(a, b, "group {group}: the restore delivers other messages than its source");
        // g2 acknowledged nothing; g1 took 30 and dead-lettered one.
        let left = if group == "g2" { pushed } else { pushed - 31 };
        assert_eq!(b.len(), left, "group {group} of the restore: what it had not consumed");
    }

    // The restore goes on: a push takes an offset past the restored ones, a new queue a
    // new id, and the restored dedup window still knows the source's transaction ids.
    let last: i64 =
        dst.query_one("SELECT max(head) FROM queen.status('dq') WHERE partition = 'p0'", &[]).unwrap().get(0);
    let off: i64 = dst.query_one("SELECT queen.send('dq', '{\"after\": 1}', partition => 'p0')", &[]).unwrap().get(0);
    assert_eq!(off, last + 1, "a push after the restore");
    let dup: i64 = dst
        .query_one("SELECT count(*) FROM queen.push('dq', '{}', partition => 'p0', transaction_id => 'tx-0-0') WHERE status = 'duplicate'", &[])
        .unwrap()
        .get(0);
    assert_eq!(dup, 1, "the restored dedup window");
    dst.batch_execute("SELECT queen.send('dq_new', '{}')").unwrap();
    let new_id: i64 = dst.query_one("SELECT queue_id FROM queen.queues WHERE name = 'dq_new'", &[]).unwrap().get(0);
    let max_old: i64 = src.query_one("SELECT max(queue_id) FROM queen.queues", &[]).unwrap().get(0);
    assert!(new_id > max_old, "a new queue's id ({new_id}) after the restored ones ({max_old})");
    let after =
        rows(&mut dst, "SELECT msg_offset, payload FROM queen.pop('dq', 'g1', partition => 'p0', auto_ack => true)");
    assert_eq!(after, vec![format!("({off},\"{{\"\"after\"\": 1}}\")")], "the message pushed after the restore");

    drop((src, dst));
}

/// A plain dump restored into a cluster that lacks one of its grantee roles, by a restore
/// that goes on past errors (`psql -f` without `ON_ERROR_STOP`): the copy of
/// `queen.queue_grants` fails as a whole and every per-queue grant is lost. The roles
/// those grants limited stay limited (they are members of `queen_grantee`, which the
/// cluster keeps): refused on every queue, their own included, until the grants are made
/// again. Before, `grant` gave EXECUTE to the role itself, the dump's `GRANT`s brought it
/// back while the rows that marked the role limited were lost, and the role read every
/// queue.
#[test]
fn a_restore_that_loses_the_grants_fails_closed() {
    let mut cleanup = Cleanup::default();
    let src_dsn = own_database_with(&[]);
    cleanup.databases.push(dbname(&src_dsn));
    let mut src = Client::connect(&src_dsn, NoTls).unwrap();
    let role = format!("dumpfc_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let missing = format!("{role}_missing");
    cleanup.roles.extend([role.clone(), missing.clone()]);
    src.batch_execute(&format!(
        "CREATE ROLE {role}; CREATE ROLE {missing};
         SELECT queen.send('mine', '{{\"mine\": 1}}');
         SELECT queen.send('victim', '{{\"secret\": 1}}');
         SELECT queen.grant('mine', '{role}', 'consume');
         SELECT queen.grant('mine', '{missing}', 'consume');"
    ))
    .unwrap();
    let file = std::env::temp_dir().join(format!("queen_dump_{role}.sql"));
    cleanup.files.push(file.clone());
    ok(tool("pg_dump").args(["-d", &src_dsn, "-f", file.to_str().unwrap()]).output().unwrap(), "pg_dump");
    // The new cluster lacks one role (here: dropped from this one after the dump).
    src.batch_execute(&format!("DROP OWNED BY {missing}; DROP ROLE {missing}")).unwrap();

    let dst_name = format!("{}_restored", dbname(&src_dsn));
    let mut admin = connect();
    admin.batch_execute(&format!("CREATE DATABASE {dst_name}")).unwrap();
    cleanup.databases.push(dst_name.clone());
    let dst_dsn = format!("{} dbname={dst_name}", dsn());
    let out = tool("psql").args(["-X", "-q", "-d", &dst_dsn, "-f"]).arg(&file).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("role \"{missing}\" does not exist")), "the restore's errors: {stderr}");
    let mut dst = Client::connect(&dst_dsn, NoTls).unwrap();
    assert!(rows(&mut dst, "SELECT * FROM queen.grants()").is_empty(), "the copy of queue_grants failed");
    assert_eq!(rows(&mut dst, "SELECT count(*) FROM queen.queues"), vec!["(2)".to_string()], "the queues came back");

    // The role is refused everywhere, and nothing was read.
    for queue in ["victim", "mine"] {
        let refused = dst
            .batch_execute(&format!("SET ROLE {role}; SELECT payload FROM queen.peek('{queue}')"))
            .expect_err("a role whose grants were lost read a queue");
        assert_eq!(refused.code(), Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE), "{queue}: {refused}");
        dst.batch_execute("RESET ROLE").unwrap();
    }
    // Granted again, it reads its queue, and only that one.
    dst.batch_execute(&format!("SELECT queen.grant('mine', '{role}', 'consume')")).unwrap();
    dst.batch_execute(&format!("SET ROLE {role}")).unwrap();
    assert_eq!(rows(&mut dst, "SELECT payload FROM queen.peek('mine')"), vec!["(\"{\"\"mine\"\": 1}\")".to_string()]);
    let refused = dst.batch_execute("SELECT payload FROM queen.peek('victim')").expect_err("read victim");
    assert_eq!(refused.code(), Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE), "{refused}");
    drop((src, dst));
}

/// A dump restored over the database it came from (`pg_restore --clean`, which drops
/// queen and installs it again, in one transaction), after the source moved on: the
/// restore delivers from its own cursors and takes its own offsets, not those shared
/// memory still held of the install it replaced (a lane slot's cursor past the restored
/// one would skip messages; an offsets slot's head past the restored segments would leave
/// a gap, one behind them would reuse offsets). A dump of INSERTs, so that no COPY makes
/// the registries forget: the new install must.
#[test]
fn a_dump_restored_over_its_source_forgets_the_replaced_install() {
    let mut cleanup = Cleanup::default();
    let own = own_database_with(&[]);
    cleanup.databases.push(dbname(&own));
    let mut c = Client::connect(&own, NoTls).unwrap();
    c.batch_execute(
        "SELECT queen.create_group('dq', 'g1');
         SELECT count(*) FROM (SELECT queen.send('dq', jsonb_build_object('i', i)) FROM generate_series(1, 50) i) s;
         SELECT count(*) FROM queen.pop('dq', 'g1', batch => 10, auto_ack => true);",
    )
    .unwrap();
    let file = std::env::temp_dir().join(format!("queen_dump_{}.custom", dbname(&own)));
    cleanup.files.push(file.clone());
    ok(
        tool("pg_dump").args(["-Fc", "--inserts", "-d", &own, "-f", file.to_str().unwrap()]).output().unwrap(),
        "pg_dump",
    );
    // The source moves on: g1 consumes everything and 20 more.
    c.batch_execute(
        "SELECT count(*) FROM queen.pop('dq', 'g1', batch => 100, auto_ack => true);
         SELECT count(*) FROM (SELECT queen.send('dq', '{}') FROM generate_series(1, 20)) s;
         SELECT count(*) FROM queen.pop('dq', 'g1', batch => 100, auto_ack => true);",
    )
    .unwrap();
    let moved: i64 = c.query_one("SELECT committed FROM queen.status('dq')", &[]).unwrap().get(0);
    assert_eq!(moved, 70);
    drop(c);
    ok(
        tool("pg_restore")
            .args(["--clean", "--if-exists", "--single-transaction", "--exit-on-error", "-d", &own])
            .arg(&file)
            .output()
            .unwrap(),
        "pg_restore",
    );
    let mut c = Client::connect(&own, NoTls).unwrap();
    let got = rows(&mut c, "SELECT msg_offset FROM queen.pop('dq', 'g1', batch => 100, auto_ack => true)");
    let want: Vec<String> = (11..=50).map(|o| format!("({o})")).collect();
    assert_eq!(got, want, "the restored group's messages: those after its cursor at the dump");
    let next: i64 = c.query_one("SELECT queen.send('dq', '{}')", &[]).unwrap().get(0);
    assert_eq!(next, 51, "a push after the restore takes the offset after the restored ones");
    drop(c);
}

/// A restore that is not one transaction (`psql -f` without `--single-transaction`, or
/// `pg_restore` without it) commits table after table, while the database's maintenance
/// worker could run: between the copy of the fresh tier and that of the durable tier,
/// compaction would take the durable segments' offsets for gaps and merge the fresh
/// segments around them into one that hides them for good. The worker stays away while
/// copies into queen's tables run and for a while after (`dbs::copy_in_begins`). Here a
/// pause between the two copies stands for a large table's copy.
#[test]
fn a_restore_table_by_table_loses_nothing_to_maintenance() {
    let mut cleanup = Cleanup::default();
    // Compaction leaves a run of fewer than 256 small segments alone for 10 s after its
    // newest (`queen_core::compaction::LIMITS`), and a partition whose row is held (below)
    // alone: the source keeps both tiers alternating in the partition until the dump.
    let src_dsn = own_database_with(&[]);
    cleanup.databases.push(dbname(&src_dsn));
    let mut src = Client::connect(&src_dsn, NoTls).unwrap();
    src.batch_execute(
        "SELECT queen.create_group('dq', 'g');
         SELECT count(*) FROM (SELECT queen.send('dq', jsonb_build_object('i', i)) FROM generate_series(1, 10) i) s;
         SELECT count(*) FROM queen.push_batch('dq', (SELECT jsonb_agg(jsonb_build_object('payload', jsonb_build_object('i', i)))
           FROM generate_series(11, 110) i));
         SELECT count(*) FROM (SELECT queen.send('dq', jsonb_build_object('i', i)) FROM generate_series(111, 120) i) s;",
    )
    .unwrap();
    // Compaction passes over a partition whose row another transaction holds: held until
    // the dump is taken.
    let mut hold = Client::connect(&src_dsn, NoTls).unwrap();
    hold.batch_execute("BEGIN; SELECT FROM queen.partitions FOR UPDATE").unwrap();
    let tiers: (i64, i64) = {
        let r = src
            .query_one("SELECT (SELECT count(*) FROM queen.fresh_segments), (SELECT count(*) FROM queen.segments)", &[])
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(tiers, (20, 1), "20 fresh segments around a durable one");
    let file = std::env::temp_dir().join(format!("queen_dump_{}.sql", dbname(&src_dsn)));
    cleanup.files.push(file.clone());
    ok(tool("pg_dump").args(["-d", &src_dsn, "-f", file.to_str().unwrap()]).output().unwrap(), "pg_dump");
    hold.batch_execute("ROLLBACK").unwrap();
    // Six seconds between the copy of the fresh tier and that of the durable one, with
    // the fresh segments old enough to be merged by then; meanwhile no maintenance worker
    // may be connected to the database (the launcher would have started one within a
    // second of CREATE EXTENSION, and looks again every 5 s).
    let dump = std::fs::read_to_string(&file).unwrap();
    let at = dump.find("COPY queen.segments_0 ").expect("the durable tier's copy");
    assert!(dump.find("COPY queen.fresh_segments_0 ").expect("the fresh tier's copy") < at);
    let watch = "DO $$ BEGIN
           FOR i IN 1..30 LOOP
             IF EXISTS (SELECT FROM pg_stat_activity
                         WHERE backend_type = 'queen maintenance' AND datname = current_database()) THEN
               RAISE EXCEPTION 'a maintenance worker runs while the database is restored';
             END IF;
             PERFORM pg_sleep(0.2);
           END LOOP;
         END $$;\n";
    std::fs::write(&file, format!("{}{watch}{}", &dump[..at], &dump[at..])).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(10_500));

    let dst_name = format!("{}_restored", dbname(&src_dsn));
    let mut admin = connect();
    admin.batch_execute(&format!("CREATE DATABASE {dst_name}")).unwrap();
    cleanup.databases.push(dst_name.clone());
    let dst_dsn = format!("{} dbname={dst_name}", dsn());
    ok(
        tool("psql").args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &dst_dsn, "-f"]).arg(&file).output().unwrap(),
        "the restore",
    );
    let mut dst = Client::connect(&dst_dsn, NoTls).unwrap();
    let got: Vec<i64> = dst
        .query("SELECT (payload->>'i')::int8 FROM queen.pop('dq', 'g', batch => 1000, auto_ack => true)", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(got, (1..=120).collect::<Vec<i64>>(), "every message, in order, after the restore");
    drop((src, dst, hold));
}

/// `pg_restore --clean` in one transaction while a consumer's ack waits for the tables its
/// `DROP EXTENSION` holds: the ack took its lane in shared memory first (its session had
/// cached what it needs), and would put the old install's cursor and lease back there when
/// it fails, under the partition ids the restore brings back. The new install is refused
/// (55006) rather than run with that; once the restore rolled back, the ack goes through.
#[test]
fn a_new_install_is_refused_while_a_session_of_the_old_one_holds_a_lane() {
    use std::sync::mpsc::channel;
    let mut cleanup = Cleanup::default();
    let own = own_database_with(&[]);
    cleanup.databases.push(dbname(&own));
    Client::connect(&own, NoTls)
        .unwrap()
        .batch_execute(
            "SELECT queen.create_group('dq', 'g'); SELECT queen.send('dq', '1'); SELECT queen.send('dq', '2');",
        )
        .unwrap();
    let (leased_tx, leased_rx) = channel::<()>();
    let (go_tx, go_rx) = channel::<()>();
    let ack_dsn = own.clone();
    let acker = std::thread::spawn(move || {
        let mut c = Client::connect(&ack_dsn, NoTls).unwrap();
        // A first pop and ack fill the session's caches; the second lease waits.
        c.batch_execute("SELECT queen.ack(lease_id) FROM queen.pop('dq', 'g')").unwrap();
        let lease: uuid::Uuid = c.query_one("SELECT lease_id FROM queen.pop('dq', 'g')", &[]).unwrap().get(0);
        leased_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        c.query_one("SELECT queen.ack($1)", &[&lease]).map(|r| r.get::<_, Value>(0))
    });
    leased_rx.recv().unwrap();
    let mut restore = Client::connect(&own, NoTls).unwrap();
    restore.batch_execute("BEGIN; DROP EXTENSION queen CASCADE").unwrap();
    go_tx.send(()).unwrap();
    let mut admin = connect();
    let db = dbname(&own);
    queen_it::eventually(20, || {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE '%queen.ack%'",
                &[&db],
            )
            .unwrap()
            .get(0);
        if waiting == 1 {
            Ok(())
        } else {
            Err("the ack does not wait for the dropped tables yet".to_string())
        }
    });
    let refused = restore.batch_execute("CREATE EXTENSION queen");
    let _ = restore.batch_execute("ROLLBACK");
    let err = refused.expect_err("a new install while the old one's ack holds its lane");
    assert_eq!(err.code(), Some(&postgres::error::SqlState::OBJECT_IN_USE), "{err}");
    let acked = acker.join().unwrap().expect("the ack, once the restore rolled back");
    assert_eq!(acked["lanes"][0]["committed"], json!(2), "{acked}");
    let committed: i64 = Client::connect(&own, NoTls)
        .unwrap()
        .query_one("SELECT committed FROM queen.status('dq')", &[])
        .unwrap()
        .get(0);
    assert_eq!(committed, 2);
}

/// While a session named `pg_dump` is connected to the database, its snapshot may predate
/// a `TRUNCATE` it has not locked out yet: no rotation of the segment generations (the
/// rotated rows would be in neither table for it), and the lane journal is not emptied
/// (its cursors would be seconds old in the dump). Once it is gone, both go on.
#[test]
fn nothing_is_truncated_while_a_pg_dump_is_connected() {
    let mut cleanup = Cleanup::default();
    let own = own_database_with(&["queen.rotation_min_size = -1"]);
    cleanup.databases.push(dbname(&own));
    let mut c = Client::connect(&own, NoTls).unwrap();
    make_rotation_due(&mut c);
    let dump = Client::connect(&format!("{own} application_name=pg_dump"), NoTls).unwrap();
    // Three passes, so that one that finds the tables busy (and backs off for that reason)
    // cannot alone make this pass with the check gone.
    for _ in 0..3 {
        assert!(!retain_rotates(&mut c), "a rotation while a pg_dump is connected");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    // The acks above wrote the lane journal; the worker empties it every 2 s, but not now.
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert!(queen_it::journal_entries(&mut c) > 0, "the lane journal emptied while a pg_dump is connected");
    drop(dump);
    queen_it::eventually(20, || match queen_it::journal_entries(&mut c) {
        0 => Ok(()),
        n => Err(format!("{n} journal entries left after the pg_dump went")),
    });
    // Autovacuum may have truncated the filler's emptied pages in the seconds waited
    // (the rotation is due by the tables' sizes): due again, then a pass rotates. A pass
    // that meets the oldest tables busy (autovacuum, the worker) backs off, as documented,
    // and the next one rotates.
    make_rotation_due(&mut c);
    rotates_soon(&mut c, "once the pg_dump is gone");
}
