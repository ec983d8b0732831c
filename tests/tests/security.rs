//! Privileges: a role granted only the documented API privileges can push, pop, ack and
//! read the dead-letter queue end to end; a role without them is refused; neither can
//! read or write queen's tables.

use postgres::{Client, NoTls};
use queen_it::{connect, dsn, unique};

/// GRANT and DROP OWNED rewrite the same catalog rows (the functions' ACLs): two tests doing
/// it at once get "tuple concurrently updated". The tests of this file take turns.
static CATALOG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn admin_ddl(admin: &mut Client, sql: &str) {
    let _turn = CATALOG.lock().unwrap_or_else(|e| e.into_inner());
    admin.batch_execute(sql).unwrap();
}

fn connect_as(role: &str) -> Client {
    let d = dsn().replace("user=postgres", &format!("user={role}"));
    Client::connect(&d, NoTls).expect("connect as the test role")
}

/// The GRANTs the README documents for an application role.
const APP_GRANTS: &str = "
    GRANT USAGE ON SCHEMA queen TO {role};
    GRANT EXECUTE ON FUNCTION queen.push(text, jsonb, text, text, jsonb, timestamptz), queen.push_batch(jsonb),
        queen.send(text, jsonb, text, text, jsonb, timestamptz),
        queen.pop(text, text, int, text, int, bool, int, int, text, bigint),
        queen.ack(uuid), queen.ack(uuid, jsonb), queen.ack(uuid, uuid, bigint, text, text, interval),
        queen.extend_lease(uuid, int), queen.may_start(uuid, interval),
        queen.dlq(text, text, int, int), queen.dlq_replay(uuid, text, uuid), queen.dlq_delete(uuid, text, uuid)
      TO {role};";

#[test]
fn an_api_role_works_end_to_end_and_others_are_refused() {
    let mut admin = connect();
    let app = format!("app_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let stranger = format!("stranger_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    admin_ddl(&mut admin, &format!("CREATE ROLE {app} LOGIN; CREATE ROLE {stranger} LOGIN;"));
    admin_ddl(&mut admin, &APP_GRANTS.replace("{role}", &app));
    let queue = unique("sec");

    let mut c = connect_as(&app);
    c.execute("SELECT * FROM queen.push($1, '{\"a\": 1}')", &[&queue]).unwrap();
    c.execute(
        "SELECT * FROM queen.push_batch(jsonb_build_array(jsonb_build_object('queue', $1::text, 'payload', 2)))",
        &[&queue],
    )
    .unwrap();
    let rows = c.query("SELECT lease_id, partition_id, msg_offset FROM queen.pop($1, batch => 10)", &[&queue]).unwrap();
    assert_eq!(rows.len(), 2);
    let (lease, pid): (uuid::Uuid, uuid::Uuid) = (rows[0].get(0), rows[0].get(1));
    let ext: serde_json::Value = c.query_one("SELECT queen.extend_lease($1, 30)", &[&lease]).unwrap().get(0);
    assert_eq!(ext["renewed"], 1);
    let ack: serde_json::Value =
        c.query_one("SELECT queen.ack($1, $2, 1, 'dlq', 'poison')", &[&lease, &pid]).unwrap().get(0);
    assert_eq!(ack["items"][0]["dlq"], true, "{ack}");
    let dead = c.query("SELECT transaction_id FROM queen.dlq($1)", &[&queue]).unwrap();
    assert_eq!(dead.len(), 1);
    let tx: String = dead[0].get(0);
    let replay: serde_json::Value = c.query_one("SELECT queen.dlq_replay($1, $2)", &[&pid, &tx]).unwrap().get(0);
    assert_eq!(replay["replayed"], true);

    // The tables stay closed to the application role.
    for sql in [
        "SELECT count(*) FROM queen.segments",
        "DELETE FROM queen.lanes",
        "SELECT queen._claimable(gen_random_uuid(), 'g', 0)",
    ] {
        let err = c.batch_execute(sql).expect_err(sql);
        assert_eq!(err.code(), Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE), "{sql}: {err}");
    }
    // Operator functions are not part of the application grant.
    let err = c.execute("SELECT queen.configure($1)", &[&queue]).expect_err("configure is for operators");
    assert_eq!(err.code(), Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE));

    // A role without the grants is refused everywhere.
    let mut s = connect_as(&stranger);
    for sql in ["SELECT * FROM queen.push('x', '1')", "SELECT * FROM queen.pop('x')", "SELECT * FROM queen.dlq()"] {
        let err = s.batch_execute(sql).expect_err(sql);
        assert_eq!(err.code(), Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE), "{sql}: {err}");
    }
    drop(c);
    drop(s);
    admin_ddl(
        &mut admin,
        &format!("DROP OWNED BY {app}; DROP ROLE {app}; DROP OWNED BY {stranger}; DROP ROLE {stranger};"),
    );
}

/// `queen.push`, `queen.send`, `queen.push_batch`, `queen.pop`, `queen.ack` and
/// `queen.extend_lease` carry no `SET search_path` clause: they pin the search path inside
/// the library. A caller who puts a schema of its own first, with operators that would run
/// as the function's owner if they were picked, gets nothing from it: every call works and
/// the operators never run.
#[test]
fn a_callers_search_path_cannot_hijack_queens_calls() {
    let mut admin = connect();
    let app = format!("app_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    admin_ddl(&mut admin, &format!("CREATE ROLE {app} LOGIN; CREATE SCHEMA {app} AUTHORIZATION {app};"));
    admin_ddl(&mut admin, &APP_GRANTS.replace("{role}", &app));
    let queue = unique("hijack");

    let mut c = connect_as(&app);
    c.batch_execute(&format!(
        "CREATE TABLE {app}.calls (who text);
         CREATE FUNCTION {app}.texteq(a text, b text) RETURNS bool LANGUAGE plpgsql AS $$
           BEGIN INSERT INTO {app}.calls VALUES (current_user); RETURN a OPERATOR(pg_catalog.=) b; END $$;
         CREATE OPERATOR {app}.= (LEFTARG = text, RIGHTARG = text, FUNCTION = {app}.texteq);
         CREATE FUNCTION {app}.uuideq(a uuid, b uuid) RETURNS bool LANGUAGE plpgsql AS $$
           BEGIN INSERT INTO {app}.calls VALUES (current_user); RETURN a OPERATOR(pg_catalog.=) b; END $$;
         CREATE OPERATOR {app}.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = {app}.uuideq);
         CREATE FUNCTION {app}.int8eq(a bigint, b bigint) RETURNS bool LANGUAGE plpgsql AS $$
           BEGIN INSERT INTO {app}.calls VALUES (current_user); RETURN a OPERATOR(pg_catalog.=) b; END $$;
         CREATE OPERATOR {app}.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = {app}.int8eq);
         CREATE FUNCTION {app}.to_char(t timestamptz, f text) RETURNS text LANGUAGE plpgsql AS $$
           BEGIN INSERT INTO {app}.calls VALUES (current_user); RETURN pg_catalog.to_char(t, f); END $$;
         SET search_path = {app}, pg_catalog;"
    ))
    .unwrap();
    // The operator is live for this session's own queries...
    let own: bool = c.query_one("SELECT 'a'::text = 'a'::text", &[]).unwrap().get(0);
    assert!(own);
    let before: i64 = c.query_one(&format!("SELECT count(*) FROM {app}.calls"), &[]).unwrap().get(0);
    assert_eq!(before, 1, "the caller's operator is picked for the caller's own query");
    // ... but not inside queen's functions, whatever the caller's search path.
    for _ in 0..3 {
        c.execute("SELECT * FROM queen.push($1, '1')", &[&queue]).unwrap();
        c.execute("SELECT queen.send($1, '1')", &[&queue]).unwrap();
        c.execute(
            "SELECT * FROM queen.push_batch(jsonb_build_array(jsonb_build_object('queue', $1::text, 'payload', 2)))",
            &[&queue],
        )
        .unwrap();
    }
    // pop, extend_lease and ack (each form) pin their search path in the library too.
    let rows = c.query("SELECT lease_id, partition_id, msg_offset FROM queen.pop($1, batch => 2)", &[&queue]).unwrap();
    assert_eq!(rows.len(), 2);
    let (lease, pid, first): (uuid::Uuid, uuid::Uuid, i64) = (rows[0].get(0), rows[0].get(1), rows[0].get(2));
    let ext: serde_json::Value = c.query_one("SELECT queen.extend_lease($1, 30)", &[&lease]).unwrap().get(0);
    assert_eq!(ext["renewed"], 1, "{ext}");
    let one: serde_json::Value = c.query_one("SELECT queen.ack($1, $2, $3)", &[&lease, &pid, &first]).unwrap().get(0);
    assert_eq!(one["lanes"][0]["committed"], first, "{one}");
    let items = serde_json::json!([{"partitionId": pid.to_string(), "offset": first + 1}]);
    let many: serde_json::Value = c.query_one("SELECT queen.ack($1, $2)", &[&lease, &items]).unwrap().get(0);
    assert_eq!(many["lanes"][0]["committed"], first + 1, "{many}");
    let rows = c.query("SELECT lease_id FROM queen.pop($1, batch => 10)", &[&queue]).unwrap();
    assert_eq!(rows.len(), 7);
    let whole: serde_json::Value =
        c.query_one("SELECT queen.ack($1)", &[&rows[0].get::<_, uuid::Uuid>(0)]).unwrap().get(0);
    assert_eq!(whole["lanes"][0]["committed"], first + 8, "{whole}");
    let after: i64 = c.query_one(&format!("SELECT count(*) FROM {app}.calls"), &[]).unwrap().get(0);
    assert_eq!(after, 1, "queen's SQL ran the caller's operator");
    drop(c);
    admin_ddl(&mut admin, &format!("DROP SCHEMA {app} CASCADE; DROP OWNED BY {app}; DROP ROLE {app};"));
}

/// The maintenance worker runs as the bootstrap superuser. A database-level search_path
/// that puts a user's schema before pg_catalog must not let that schema's functions run
/// inside the worker: its path is pinned. `evil.clock_timestamp()` (which retention calls,
/// unqualified) records who called it.
#[test]
fn the_worker_ignores_a_hostile_search_path() {
    let mut admin = connect();
    let db: String = admin.query_one("SELECT current_database()", &[]).unwrap().get(0);
    let queue = unique("workerpath");
    admin_ddl(
        &mut admin,
        "CREATE SCHEMA IF NOT EXISTS evil;
         CREATE TABLE IF NOT EXISTS evil.calls (backend_type text, at timestamptz DEFAULT pg_catalog.now());
         CREATE OR REPLACE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE AS
           $$ INSERT INTO evil.calls (backend_type)
                SELECT backend_type FROM pg_catalog.pg_stat_activity WHERE pid = pg_catalog.pg_backend_pid()
                RETURNING pg_catalog.clock_timestamp() $$;
         CREATE OR REPLACE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql VOLATILE AS
           $$ SELECT evil.clock_timestamp() $$;
         TRUNCATE evil.calls;",
    );
    // Work for the worker's retention pass: a queue with a retention window and a group.
    admin.execute("SELECT queen.configure($1, retention => 1)", &[&queue]).unwrap();
    admin.execute("SELECT queen.push($1, '1')", &[&queue]).unwrap();
    admin.query("SELECT 1 FROM queen.pop($1, auto_ack => true)", &[&queue]).unwrap();
    admin_ddl(&mut admin, &format!("ALTER DATABASE {db} SET search_path = evil, pg_catalog, public"));
    // A fresh worker reads the database's settings when it connects.
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE backend_type = 'queen maintenance' AND datname = current_database()",
            &[],
        )
        .unwrap();
    // The launcher starts it again within about ten seconds, and it passes every second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    let mut passed = false;
    while std::time::Instant::now() < deadline && !passed {
        // Segments that retention may delete (read by the group, older than 1 s), so that
        // its pass evaluates clock_timestamp().
        admin.execute("SELECT queen.push($1, '1')", &[&queue]).unwrap();
        admin.query("SELECT 1 FROM queen.pop($1, auto_ack => true)", &[&queue]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(500));
        passed = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queen maintenance'
                   AND datname = current_database() AND backend_start < pg_catalog.clock_timestamp() - interval '4 s'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            > 0;
    }
    admin_ddl(&mut admin, &format!("ALTER DATABASE {db} RESET search_path"));
    assert!(passed, "the maintenance worker did not come back");
    let calls: Vec<String> = admin
        .query("SELECT DISTINCT backend_type FROM evil.calls", &[])
        .unwrap()
        .iter()
        .map(|r| r.get::<_, Option<String>>(0).unwrap_or_default())
        .collect();
    admin_ddl(&mut admin, "DROP SCHEMA evil CASCADE");
    assert!(!calls.contains(&"queen maintenance".to_string()), "the worker ran evil.clock_timestamp(): {calls:?}");
}

/// The roles the extension ships: a login that is a member of only one of them can call
/// that role's functions and is refused the others' (42501); `queen_admin` reaches every
/// API function and no internal one.
#[test]
fn the_shipped_roles_grant_least_privilege() {
    let mut admin = connect();
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let (p, c, a) = (format!("prod_{tag}"), format!("cons_{tag}"), format!("adm_{tag}"));
    admin_ddl(
        &mut admin,
        &format!(
            "CREATE ROLE {p} LOGIN IN ROLE queen_producer; CREATE ROLE {c} LOGIN IN ROLE queen_consumer;
             CREATE ROLE {a} LOGIN IN ROLE queen_admin;"
        ),
    );
    let queue = unique("roles");
    let refused = |cl: &mut Client, sql: &str| {
        let err = cl.batch_execute(sql).expect_err(sql);
        assert_eq!(err.code(), Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE), "{sql}: {err}");
    };

    let mut producer = connect_as(&p);
    producer.execute("SELECT * FROM queen.push($1, '{\"n\": 1}')", &[&queue]).unwrap();
    producer.execute("SELECT * FROM queen.push($1, '{\"n\": 2}')", &[&queue]).unwrap();
    for sql in [
        format!("SELECT * FROM queen.pop('{queue}')"),
        format!("SELECT * FROM queen.dlq('{queue}')"),
        format!("SELECT queen.configure('{queue}')"),
        "SELECT count(*) FROM queen.segments".to_string(),
    ] {
        refused(&mut producer, &sql);
    }

    let mut consumer = connect_as(&c);
    let rows = consumer.query("SELECT lease_id, partition_id FROM queen.pop($1, batch => 2)", &[&queue]).unwrap();
    assert_eq!(rows.len(), 2);
    let (lease, pid): (uuid::Uuid, uuid::Uuid) = (rows[0].get(0), rows[0].get(1));
    let may: bool = consumer.query_one("SELECT queen.may_start($1)", &[&lease]).unwrap().get(0);
    assert!(may);
    let ext: serde_json::Value = consumer.query_one("SELECT queen.extend_lease($1, 30)", &[&lease]).unwrap().get(0);
    assert_eq!(ext["renewed"], 1);
    let ack: serde_json::Value =
        consumer.query_one("SELECT queen.ack($1, $2, 1, 'dlq', 'bad')", &[&lease, &pid]).unwrap().get(0);
    assert_eq!(ack["items"][0]["dlq"], true, "{ack}");
    let dead = consumer.query("SELECT transaction_id FROM queen.dlq($1)", &[&queue]).unwrap();
    assert_eq!(dead.len(), 1);
    let tx: String = dead[0].get(0);
    for sql in [
        format!("SELECT * FROM queen.push('{queue}', '1')"),
        format!("SELECT queen.dlq_replay('{pid}', '{tx}')"),
        format!("SELECT queen.configure('{queue}')"),
        format!("SELECT * FROM queen.status('{queue}')"),
        format!("SELECT queen.delete_queue('{queue}')"),
    ] {
        refused(&mut consumer, &sql);
    }

    let mut operator = connect_as(&a);
    operator.execute("SELECT queen.configure($1, lease_time => 30)", &[&queue]).unwrap();
    operator.execute("SELECT * FROM queen.push($1, '3')", &[&queue]).unwrap();
    let replay: serde_json::Value = operator.query_one("SELECT queen.dlq_replay($1, $2)", &[&pid, &tx]).unwrap().get(0);
    assert_eq!(replay["replayed"], true, "{replay}");
    let lanes: i64 = operator.query_one("SELECT count(*) FROM queen.status($1)", &[&queue]).unwrap().get(0);
    assert_eq!(lanes, 1);
    refused(&mut operator, "SELECT count(*) FROM queen.lanes");
    let deleted: serde_json::Value = operator.query_one("SELECT queen.delete_queue($1)", &[&queue]).unwrap().get(0);
    assert_eq!(deleted["deleted"], true);

    // Every API function is reachable through queen_admin, and no internal one is. The one
    // exception is setup, like CREATE EXTENSION: queen.distribute() is for the extension's
    // owner (Citus lets only a function's owner distribute it), granted to no role.
    let rows = admin
        .query(
            "SELECT p.oid::regprocedure::text, has_function_privilege('queen_admin', p.oid, 'EXECUTE')
               FROM pg_proc p WHERE p.pronamespace = 'queen'::regnamespace ORDER BY 1",
            &[],
        )
        .unwrap();
    let api: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert!(api.len() > 25, "{api:?}");
    for (f, granted) in &api {
        let internal = f.starts_with("queen._") || f == "queen.distribute()";
        assert_eq!(*granted, !internal, "{f}: executable by queen_admin = {granted}");
    }
    // queen_grantee (the roles of queen.grant, which queen's checks limit to their queues)
    // may call the same functions, and no other.
    let grantee: Vec<(String, bool)> = admin
        .query(
            "SELECT p.oid::regprocedure::text, has_function_privilege('queen_grantee', p.oid, 'EXECUTE')
               FROM pg_proc p WHERE p.pronamespace = 'queen'::regnamespace ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(grantee, api, "queen_grantee's functions");
    drop((producer, consumer, operator));
    admin_ddl(&mut admin, &format!("DROP ROLE {p}; DROP ROLE {c}; DROP ROLE {a};"));
}

/// A long-poll of a role limited to one queue (queen.grant) checks its privilege again in
/// every round: a grant revoked while it waits ends it with 42501, and the message pushed
/// after the revoke is not delivered to it. Before, the pop checked once, at its start,
/// and returned the message.
#[test]
fn a_long_poll_stops_at_a_revoke() {
    let mut admin = connect();
    let role = format!("poller_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let queue = unique("sec-poll");
    admin_ddl(&mut admin, &format!("CREATE ROLE {role} LOGIN;"));
    admin_ddl(&mut admin, &format!("SELECT queen.grant('{queue}', '{role}', 'consume');"));
    let mut c = connect_as(&role);
    // The group exists, so that the pop below only waits.
    c.query("SELECT * FROM queen.pop($1)", &[&queue]).unwrap();
    let q = queue.clone();
    let poller = std::thread::spawn(move || {
        c.query("SELECT payload FROM queen.pop($1, wait_ms => 10000)", &[&q])
            .map(|rows| rows.len())
            .map_err(|e| e.code().map(|c| c.code().to_string()))
    });
    // The revoke comes while the pop waits (past its first round's check).
    queen_it::eventually(10, || {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND state = 'active' AND query LIKE '%wait_ms%'",
                &[&role],
            )
            .map_err(|e| e.to_string())?
            .get(0);
        if waiting == 1 {
            Ok(())
        } else {
            Err("the pop has not started".to_string())
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    admin_ddl(&mut admin, &format!("SELECT queen.revoke('{queue}', '{role}', 'consume');"));
    admin.execute("SELECT count(*) FROM queen.push($1, '\"after the revoke\"')", &[&queue]).unwrap();
    let got = poller.join().unwrap();
    assert_eq!(got, Err(Some("42501".to_string())), "the poll went on after the revoke");
    // The message is there for the groups that may read it.
    let left: i64 = admin.query_one("SELECT count(*) FROM queen.peek($1)", &[&queue]).unwrap().get(0);
    assert_eq!(left, 1);
    admin_ddl(&mut admin, &format!("DROP OWNED BY {role}; DROP ROLE {role};"));
}
