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
    GRANT EXECUTE ON FUNCTION queen.push(text, jsonb, text, text), queen.push_batch(jsonb),
        queen.pop(text, text, int, text, int, bool, int, int, text, bigint),
        queen.ack(uuid), queen.ack(uuid, jsonb), queen.ack(uuid, uuid, bigint, text, text),
        queen.extend_lease(uuid, int), queen.may_start(uuid, interval),
        queen.dlq(text, text, int, int), queen.dlq_replay(uuid, text), queen.dlq_delete(uuid, text)
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
        "SELECT * FROM queen._pop('x', 'g', 1, NULL, 0, false, 0, 1, 'all')",
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

/// `queen.push` and `queen.push_batch` carry no `SET search_path` clause: they pin the
/// search path inside the library. A caller who puts a schema of its own first, with an
/// operator that would run as the function's owner if it were picked, gets nothing from
/// it: the push works and the operator never runs.
#[test]
fn a_callers_search_path_cannot_hijack_a_push() {
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
        c.execute(
            "SELECT * FROM queen.push_batch(jsonb_build_array(jsonb_build_object('queue', $1::text, 'payload', 2)))",
            &[&queue],
        )
        .unwrap();
    }
    let n = c.query("SELECT 1 FROM queen.pop($1, batch => 10, auto_ack => true)", &[&queue]).unwrap().len();
    assert_eq!(n, 6);
    let after: i64 = c.query_one(&format!("SELECT count(*) FROM {app}.calls"), &[]).unwrap().get(0);
    assert_eq!(after, 1, "queen's SQL ran the caller's operator");
    drop(c);
    admin_ddl(&mut admin, &format!("DROP SCHEMA {app} CASCADE; DROP OWNED BY {app}; DROP ROLE {app};"));
}
