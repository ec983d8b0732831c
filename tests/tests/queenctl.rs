//! `queenctl` against a real cluster: each verb's output checked against the database.

use std::io::Write;
use std::process::{Command, Stdio};

use queen_it::{dsn, unique};
use serde_json::{json, Value};

fn bin() -> String {
    format!("{}/../target/debug/queenctl", env!("CARGO_MANIFEST_DIR"))
}

/// Runs `queenctl --dsn … --json ARGS` (with `stdin`), returning its JSON output; panics
/// when it fails.
fn ctl(args: &[&str], stdin: Option<&str>) -> Value {
    let (ok, out, err) = ctl_raw(args, stdin);
    assert!(ok, "queenctl {args:?} failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("queenctl {args:?}: not JSON ({e}): {out}"))
}

fn ctl_raw(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    ctl_at(&dsn(), &[], args, stdin)
}

/// Runs `queenctl --dsn DSN --json ARGS` with the environment `env` added and `stdin`;
/// (succeeded, stdout, stderr).
fn ctl_at(dsn: &str, env: &[(&str, &str)], args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut child = Command::new(bin())
        .args(["--dsn", dsn, "--json"])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (make integration builds it first)", bin()));
    child.stdin.take().unwrap().write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn db() -> postgres::Client {
    postgres::Client::connect(&dsn(), postgres::NoTls).unwrap()
}

#[test]
fn push_from_an_argument_a_file_and_stdin_then_tail_and_status() {
    let q = unique("ctl");
    assert_eq!(ctl(&["push", &q, r#"{"n": 1}"#, "--partition", "a"], None)["pushed"], 1);
    let file = std::env::temp_dir().join(format!("{q}.ndjson"));
    std::fs::write(&file, "{\"n\": 2}\n\n{\"payload\": {\"n\": 3}, \"partition\": \"b\", \"transactionId\": \"t3\"}\n")
        .unwrap();
    assert_eq!(ctl(&["push", &q, "--file", file.to_str().unwrap(), "--partition", "a"], None)["pushed"], 2);
    let r = ctl(
        &["push", &q, "--batch", "2"],
        Some("4\n5\n6\n{\"payload\": 7, \"partition\": \"b\", \"transactionId\": \"t3\"}\n"),
    );
    assert_eq!((r["pushed"].as_i64(), r["duplicates"].as_i64()), (Some(4), Some(1)));

    // What the database holds, by peek, equals what tail shows.
    let mut c = db();
    let want: Vec<(String, i64, Value)> = c
        .query("SELECT partition, msg_offset, payload FROM queen.peek($1, max_messages => 100)", &[&q])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(want.len(), 6);
    let tail = ctl(&["tail", &q, "--limit", "100"], None);
    let mut got: Vec<(String, i64, Value)> = tail
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["partition"].as_str().unwrap().into(), r["msg_offset"].as_i64().unwrap(), r["payload"].clone()))
        .collect();
    got.sort_by(|x, y| (&x.0, x.1).cmp(&(&y.0, y.1)));
    let mut want = want;
    want.sort_by(|x, y| (&x.0, x.1).cmp(&(&y.0, y.1)));
    assert_eq!(got, want);
    assert!(got.contains(&("a".into(), 2, json!({"n": 2}))) && got.contains(&("b".into(), 1, json!({"n": 3}))));

    // status = queen.totals; status QUEUE = queen.status.
    c.execute("SELECT count(*) FROM queen.pop($1, 'g', batch => 2, auto_ack => true)", &[&q]).unwrap();
    let totals = ctl(&["status"], None);
    let mine: Vec<&Value> = totals.as_array().unwrap().iter().filter(|r| r["queue"] == json!(q)).collect();
    let (messages, committed): (i64, i64) = c
        .query_one("SELECT messages, committed FROM queen.totals($1) WHERE consumer_group = 'g'", &[&q])
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!((mine[0]["messages"].as_i64(), mine[0]["committed"].as_i64()), (Some(messages), Some(committed)));
    let lanes = ctl(&["status", &q], None);
    assert_eq!(lanes.as_array().unwrap().len(), 3); // partitions a, b and Default; group g
}

#[test]
fn flow_control_verbs() {
    let q = unique("ctl-flow");
    ctl(&["push", &q, "1"], None);
    let mut c = db();
    c.execute("SELECT count(*) FROM queen.pop($1, 'g', auto_ack => true)", &[&q]).unwrap();
    assert_eq!(ctl(&["pause", &q, "--group", "g"], None)["paused"], true);
    let paused: bool =
        c.query_one("SELECT paused FROM queen.totals($1) WHERE consumer_group = 'g'", &[&q]).unwrap().get(0);
    assert!(paused);
    assert_eq!(ctl(&["resume", &q, "--group", "g"], None)["paused"], false);
    ctl(&["push", &q, "2"], None);
    // A purge names its group, or says every group: a forgotten --group purges nothing.
    let (ok, _, err) = ctl_raw(&["purge", &q], None);
    assert!(!ok && err.contains("--group"), "{err}");
    let lag: i64 = c.query_one("SELECT lag FROM queen.totals($1) WHERE consumer_group = 'g'", &[&q]).unwrap().get(0);
    assert_eq!(lag, 1);
    ctl(&["purge", &q, "--group", "g"], None);
    let lag: i64 = c.query_one("SELECT lag FROM queen.totals($1) WHERE consumer_group = 'g'", &[&q]).unwrap().get(0);
    assert_eq!(lag, 0);
    ctl(&["push", &q, "3"], None);
    ctl(&["purge", &q, "--all-groups"], None);
    let lag: i64 = c.query_one("SELECT lag FROM queen.totals($1) WHERE consumer_group = 'g'", &[&q]).unwrap().get(0);
    assert_eq!(lag, 0);
    let r = ctl(&["limit", &q, "g", "*", "--rate", "2.5", "--burst", "3"], None);
    assert_eq!((r["rate"].as_f64(), r["burst"].as_i64()), (Some(2.5), Some(3)));
    let stored: f64 = c.query_one("SELECT rate::float8 FROM queen.limits WHERE key = '*' AND consumer_group = 'g' AND queue_id = (SELECT queue_id FROM queen.queues WHERE name = $1)", &[&q]).unwrap().get(0);
    assert_eq!(stored, 2.5);
    assert_eq!(ctl(&["limit", &q, "g", "*"], None)["removed"], true);
    // top: two refreshes, the second with rates.
    let (ok, out, err) = ctl_raw(&["top", &q, "--iterations", "2", "--interval", "0.2"], None);
    assert!(ok, "{err}");
    let frames: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(frames.len(), 2);
    assert!(frames[0][0]["acked_per_s"].is_null() && frames[1][0]["acked_per_s"].is_number(), "{frames:?}");
}

#[test]
fn dead_letters_list_show_replay_delete() {
    let q = unique("ctl-dlq");
    let mut c = db();
    c.execute("SELECT count(*) FROM queen.push($1, '{\"bad\": 1}')", &[&q]).unwrap();
    c.execute("SELECT count(*) FROM queen.push($1, '{\"bad\": 2}')", &[&q]).unwrap();
    for _ in 0..2 {
        let r = c.query_one("SELECT lease_id, partition_id, msg_offset FROM queen.pop($1, 'g')", &[&q]).unwrap();
        let (lease, pid, off): (uuid::Uuid, uuid::Uuid, i64) = (r.get(0), r.get(1), r.get(2));
        c.execute("SELECT queen.ack($1, $2, $3, 'dlq', 'broken')", &[&lease, &pid, &off]).unwrap();
    }
    let list = ctl(&["dlq", "list", &q], None);
    let rows = list.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r["error_message"] == "broken" && r["consumer_group"] == "g"));
    let id = rows[0]["id"].as_str().unwrap().to_string();
    let shown = ctl(&["dlq", "show", &id], None);
    assert_eq!(shown["id"], rows[0]["id"]);
    assert_eq!(shown["data"], rows[0]["data"]);
    let replayed = ctl(&["dlq", "replay", &id], None);
    assert_eq!(replayed["replayed"], true);
    let other = rows[1]["id"].as_str().unwrap().to_string();
    ctl(&["dlq", "delete", &other], None);
    let left: i64 = c.query_one("SELECT count(*) FROM queen.dlq($1)", &[&q]).unwrap().get(0);
    assert_eq!(left, 0);
    // The replayed payload is delivered again.
    let again: Value = c.query_one("SELECT payload FROM queen.pop($1, 'g', auto_ack => true)", &[&q]).unwrap().get(0);
    assert_eq!(again, shown["data"]);
    let (ok, _, err) = ctl_raw(&["dlq", "show", &uuid::Uuid::nil().to_string()], None);
    assert!(!ok && err.contains("no dead letter has id"), "{err}");
}

#[test]
fn redrive_in_rounds_and_errors_with_their_sqlstate() {
    let q = unique("ctl-redrive");
    let mut c = db();
    let items: Vec<Value> = (0..1500).map(|i| json!({"queue": q, "payload": i})).collect();
    c.execute("SELECT count(*) FROM queen.push_batch($1)", &[&json!(items)]).unwrap();
    let rows = c.query("SELECT lease_id, partition_id FROM queen.pop($1, 'g', batch => 1500)", &[&q]).unwrap();
    assert_eq!(rows.len(), 1500);
    let (lease, pid): (uuid::Uuid, uuid::Uuid) = (rows[0].get(0), rows[0].get(1));
    // Dead-letter all 1,500 (one dlq per ack: each files E and releases the lease).
    c.execute("SELECT queen.ack($1, $2, 1, 'dlq', 'x')", &[&lease, &pid]).unwrap();
    for off in 2..=1500i64 {
        let r = c.query_one("SELECT lease_id FROM queen.pop($1, 'g')", &[&q]).unwrap();
        let lease: uuid::Uuid = r.get(0);
        c.execute("SELECT queen.ack($1, $2, $3, 'dlq', 'x')", &[&lease, &pid, &off]).unwrap();
    }
    // In rounds of 1,000; a limit that leaves some says so (`more`).
    let r = ctl(&["dlq", "redrive", &q, "--group", "g", "--limit", "1200"], None);
    assert_eq!((r["redriven"].as_i64(), r["more"].as_bool()), (Some(1200), Some(true)), "{r}");
    let r = ctl(&["dlq", "redrive", &q, "--group", "g"], None);
    assert_eq!((r["redriven"].as_i64(), r["more"].as_bool()), (Some(300), Some(false)), "{r}");
    let redriven: i64 =
        c.query_one("SELECT count(*) FROM queen.pop($1, 'g', batch => 5000, auto_ack => true)", &[&q]).unwrap().get(0);
    assert_eq!(redriven, 1500);
    let (ok, _, err) = ctl_raw(&["push", "bad name!", "1"], None);
    assert!(!ok && err.contains("SQLSTATE 22023"), "{err}");
}

#[test]
fn tail_follow_prints_new_messages_of_old_and_new_partitions_once() {
    let q = unique("ctl-follow");
    let mut c = db();
    c.execute("SELECT count(*) FROM queen.push($1, '1', partition => 'a')", &[&q]).unwrap();
    c.execute("SELECT count(*) FROM queen.pop($1, 'g', auto_ack => true)", &[&q]).unwrap(); // a group: lanes name partitions
    let mut child = Command::new(bin())
        .args(["--dsn", &dsn(), "--json", "tail", &q, "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    c.execute("SELECT count(*) FROM queen.push($1, '2', partition => 'a')", &[&q]).unwrap();
    c.execute("SELECT count(*) FROM queen.push($1, '3', partition => 'b')", &[&q]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let mut got: Vec<(String, i64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|r| (r["partition"].as_str().unwrap().to_string(), r["msg_offset"].as_i64().unwrap()))
        .collect();
    got.sort();
    assert_eq!(got, vec![("a".to_string(), 1), ("a".to_string(), 2), ("b".to_string(), 1)]);
}

#[test]
fn a_dead_letter_that_shares_its_address_is_the_one_acted_on() {
    let q = unique("ctl-shared");
    let mut c = db();
    c.execute("SELECT count(*) FROM queen.push($1, '{\"m\": 1}')", &[&q]).unwrap();
    // Groups a then b dead-letter the same message: two rows, one address.
    for g in ["a", "b"] {
        let r = c.query_one("SELECT lease_id, partition_id, msg_offset FROM queen.pop($1, $2)", &[&q, &g]).unwrap();
        let (lease, pid, off): (uuid::Uuid, uuid::Uuid, i64) = (r.get(0), r.get(1), r.get(2));
        c.execute("SELECT queen.ack($1, $2, $3, 'dlq', $4)", &[&lease, &pid, &off, &format!("by {g}")]).unwrap();
    }
    let list = ctl(&["dlq", "list", &q], None);
    let id_of = |g: &str| {
        list.as_array().unwrap().iter().find(|r| r["consumer_group"] == g).unwrap()["id"].as_str().unwrap().to_string()
    };
    let groups = |c: &mut postgres::Client| -> Vec<String> {
        c.query("SELECT consumer_group FROM queen.dlq($1) ORDER BY consumer_group", &[&q])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    // b's letter is the newer one at the address: it goes, and a's (the oldest) stays.
    let deleted = ctl(&["dlq", "delete", &id_of("b")], None);
    assert_eq!(deleted["id"].as_str(), Some(id_of("b").as_str()), "{deleted}");
    assert_eq!(groups(&mut c), ["a"]);
    // Once gone, queenctl says so (it finds the row's address through queen.dlq; the
    // server's side of a row gone meanwhile is pg_test/specs/dlq_shared_address.spec).
    let (ok, _, err) = ctl_raw(&["dlq", "delete", &id_of("b")], None);
    assert!(!ok && err.contains("no dead letter has id"), "{err}");
    assert_eq!(groups(&mut c), ["a"]);
    let replayed = ctl(&["dlq", "replay", &id_of("a")], None);
    assert_eq!(replayed["id"].as_str(), Some(id_of("a").as_str()), "{replayed}");
    assert!(groups(&mut c).is_empty());
}

#[test]
fn a_bad_line_stops_a_push_and_says_where() {
    let q = unique("ctl-badline");
    let file = std::env::temp_dir().join(format!("{q}.ndjson"));
    std::fs::write(&file, "1\n2\nnot json\n4\n").unwrap();
    let (ok, _, err) = ctl_raw(&["push", &q, "--file", file.to_str().unwrap()], None);
    assert!(!ok && err.contains("line 3") && err.contains("nothing was pushed"), "{err}");
    let mut c = db();
    let stored = |c: &mut postgres::Client| -> i64 {
        c.query_one("SELECT coalesce(sum(messages), 0)::int8 FROM queen.totals($1)", &[&q]).unwrap().get(0)
    };
    assert_eq!(stored(&mut c), 0);
    // From stdin the lines before it are pushed, and the message says how many.
    let (ok, _, err) = ctl_raw(&["push", &q, "--batch", "1"], Some("1\n2\nnot json\n4\n"));
    assert!(!ok && err.contains("line 3") && err.contains("the 2 messages before it were pushed"), "{err}");
    assert_eq!(stored(&mut c), 2);
    // A batch the server refuses (the queue full: 53400) stops the push; the batches
    // before it are stored, and the message counts them.
    c.execute("SELECT queen.configure($1, max_depth => 3)", &[&q]).unwrap();
    let (ok, _, err) = ctl_raw(
        &["push", &q, "--batch", "1"],
        Some(
            "5
6
7
",
        ),
    );
    assert!(!ok && err.contains("SQLSTATE 53400") && err.contains("the 1 messages before this batch"), "{err}");
    assert_eq!(stored(&mut c), 3);
}

#[test]
fn a_forced_redrive_redrives_each_letter_once() {
    let q = unique("ctl-force");
    let mut c = db();
    let items: Vec<Value> = (0..30).map(|i| json!({"queue": q, "payload": i})).collect();
    c.execute("SELECT count(*) FROM queen.push_batch($1)", &[&json!(items)]).unwrap();
    for off in 1..=30i64 {
        let r = c.query_one("SELECT lease_id, partition_id FROM queen.pop($1, 'g')", &[&q]).unwrap();
        let (lease, pid): (uuid::Uuid, uuid::Uuid) = (r.get(0), r.get(1));
        c.execute("SELECT queen.ack($1, $2, $3, 'dlq', 'x')", &[&lease, &pid, &off]).unwrap();
    }
    assert_eq!(ctl(&["dlq", "redrive", &q, "--group", "g"], None)["redriven"], 30);
    c.execute("SELECT count(*) FROM queen.pop($1, 'g', batch => 100, auto_ack => true)", &[&q]).unwrap();
    // Forced: every letter again, once each.
    assert_eq!(ctl(&["dlq", "redrive", &q, "--group", "g", "--force"], None)["redriven"], 30);
    let again: Vec<i64> = c
        .query("SELECT (payload)::text::int8 FROM queen.pop($1, 'g', batch => 100, auto_ack => true)", &[&q])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut sorted = again.clone();
    sorted.sort();
    assert_eq!(sorted, (0..30).collect::<Vec<i64>>());
}

fn openssl(dir: &str, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("the openssl command");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A self-signed CA certificate `{name}.crt` (and its key) in `dir`.
fn ca(dir: &str, name: &str, cn: &str) {
    let (key, crt, subject) = (format!("{name}.key"), format!("{name}.crt"), format!("/CN={cn}"));
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", &subject, "-keyout", &key, "-out",
            &crt,
        ],
    );
}

/// queenctl over TLS, as libpq's sslmode has it: a cluster of the test's own that takes
/// TCP connections only over TLS (pg_hba: `hostnossl ... reject`), with a server
/// certificate for `localhost` signed by a CA of the test's. `sslmode=require` connects
/// (the certificate unchecked, as libpq's `require`); `disable` is refused by the server.
/// With `PGSSLROOTCERT` naming the CA the certificate is checked and passes; naming another
/// CA it fails, even when the system's CAs (`SSL_CERT_FILE`) include the right one; and
/// against a server without TLS, the default `prefer` does not fall back to plain text.
#[test]
fn queenctl_connects_over_tls_and_checks_the_certificate_against_pgsslrootcert() {
    const PORT: u16 = 5482;
    let dir = format!("/tmp/queen-tls-{PORT}");
    let dir = dir.as_str();
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    ca(dir, "ca", "queen test CA");
    ca(dir, "other", "another CA");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(format!("{dir}/san.ext"), "subjectAltName = DNS:localhost\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.crt",
        ],
    );
    // The server reads its key as the postgres user, and only a key no one else can read.
    let owned =
        Command::new("chown").args(["postgres:", &format!("{dir}/server.key"), &format!("{dir}/server.crt")]).status();
    assert!(owned.is_ok_and(|s| s.success()));
    let cluster = queen_it::OwnCluster::start(
        PORT,
        &format!("ssl = on\nssl_cert_file = '{dir}/server.crt'\nssl_key_file = '{dir}/server.key'\n"),
    );
    let hba = format!("{}/pg_hba.conf", cluster.dir());
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("hostnossl all all 0.0.0.0/0 reject\nhostnossl all all ::/0 reject\n{rules}"))
        .unwrap();
    let mut admin = postgres::Client::connect(&cluster.dsn("postgres"), postgres::NoTls).unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    admin.batch_execute("CREATE DATABASE tls").unwrap();
    let mut c = postgres::Client::connect(&cluster.dsn("tls"), postgres::NoTls).unwrap();
    c.batch_execute("CREATE EXTENSION queen; SELECT count(*) FROM queen.push('tq', '{\"n\": 1}')").unwrap();
    let at = |mode: &str| format!("host=localhost port={PORT} user=postgres dbname=tls sslmode={mode}");
    // Once the reload is in, a connection without TLS is refused.
    let err = queen_it::eventually(10, || match ctl_at(&at("disable"), &[], &["status"], None) {
        (false, _, err) => Ok(err),
        (true, ..) => Err("a connection without TLS still gets in (the reload is not in yet)".to_string()),
    });
    assert!(err.contains("no encryption"), "refused by hostnossl: {err}");

    let (ok, out, err) = ctl_at(&at("require"), &[], &["status"], None);
    assert!(ok, "sslmode=require: {err}");
    assert!(out.contains("\"tq\""), "status over TLS lists the queue: {out}");
    let (ca_file, other) = (format!("{dir}/ca.crt"), format!("{dir}/other.crt"));
    let (ok, _, err) = ctl_at(&at("require"), &[("PGSSLROOTCERT", &ca_file)], &["status"], None);
    assert!(ok, "the certificate chains to PGSSLROOTCERT and names localhost: {err}");
    let by_address = format!("host=127.0.0.1 port={PORT} user=postgres dbname=tls");
    let (ok, _, err) = ctl_at(&by_address, &[("PGSSLROOTCERT", &ca_file)], &["status"], None);
    assert!(!ok, "the certificate names localhost, not 127.0.0.1: the host name is checked");
    assert!(err.contains("certificate verify failed"), "{err}");
    let (ok, _, err) =
        ctl_at(&at("prefer"), &[("PGSSLROOTCERT", &other), ("SSL_CERT_FILE", &ca_file)], &["status"], None);
    assert!(!ok, "a certificate that does not chain to PGSSLROOTCERT is refused, whatever the system trusts");
    assert!(err.contains("certificate verify failed"), "{err}");
    drop(cluster);
    // The shared test cluster has no TLS: with PGSSLROOTCERT, prefer (the default) means
    // a checked certificate or no connection.
    let port = std::env::var("QUEEN_TEST_PORT").expect("QUEEN_TEST_PORT (set by make integration)");
    let plain = format!("host=127.0.0.1 port={port} user=postgres dbname=queen_it");
    let (ok, _, err) = ctl_at(&plain, &[("PGSSLROOTCERT", &ca_file)], &["status"], None);
    assert!(!ok, "no plain-text fallback with PGSSLROOTCERT set");
    assert!(err.contains("does not support TLS"), "{err}");
    let (ok, _, err) = ctl_at(&plain, &[], &["status"], None);
    assert!(ok, "without it, prefer connects in plain text to a server without TLS: {err}");
    let _ = std::fs::remove_dir_all(dir);
}
