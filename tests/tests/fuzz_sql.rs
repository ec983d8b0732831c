//! A SQL-level generator of random bad calls: wrong types, huge and negative numbers,
//! malformed JSON, odd names with quotes, semicolons and unicode, unknown leases. Only
//! clean errors may come back (data exceptions, limits, not-found, not-supported), the
//! server never restarts, and a queue used alongside keeps its invariants.

use queen_it::{connect, unique};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const CALLS: usize = 10_000;

fn odd_text(r: &mut impl Rng) -> Option<String> {
    let pool = [
        "",
        " ",
        "a b",
        "x'; DROP TABLE queen.queues; --",
        "\"quoted\"",
        "semi;colon",
        "ünïcødé",
        "日本語",
        "🚀",
        "tab\there",
        "new\nline",
        "%s%s%n",
        "\\",
        "Default",
        "__QUEUE_MODE__",
        "ok-name",
        "a.b:c",
        "-1",
        "0",
        "99999999999999999999",
        "1e309",
        "NaN",
        "null",
        "true",
        "[]",
        "{}",
        "{\"a\":",
        "[1,2",
        "{\"queue\": \"x\"}",
        "[{\"queue\": \"fz\", \"payload\": 1}]",
        "[{\"queue\": 1}]",
        "[{\"partitionId\": \"00000000-0000-0000-0000-000000000000\", \"offset\": 1}]",
        "00000000-0000-0000-0000-000000000000",
        "not-a-uuid",
        "1 s",
        "-5 s",
        "1 mon",
        "366 days",
        "106751992 days",
        "2147483647 days -2562047787:00:54.775807",
        "all",
        "new",
        "retry",
        "dlq",
    ];
    match r.gen_range(0..10) {
        0 => None,
        1 => Some("x".repeat(r.gen_range(190..260))),
        2 => Some((0..r.gen_range(1..12)).map(|_| char::from_u32(r.gen_range(0x20..0x2FFF)).unwrap_or('?')).collect()),
        _ => Some(pool.choose(r).unwrap().to_string()),
    }
}

fn odd_int(r: &mut impl Rng) -> Option<String> {
    let pool = ["0", "-1", "1", "2147483647", "-2147483648", "2147483648", "100001", "10001", "5", "abc", "1.5", ""];
    if r.gen_bool(0.1) {
        None
    } else {
        Some(pool.choose(r).unwrap().to_string())
    }
}

#[test]
fn ten_thousand_bad_calls_give_clean_errors_only() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5155_454e);
    let mut c = connect();
    let started: std::time::SystemTime = c.query_one("SELECT pg_postmaster_start_time()", &[]).unwrap().get(0);
    let live = unique("fuzzlive");
    c.execute("SELECT * FROM queen.push($1, '1')", &[&live]).unwrap();

    let calls: [&str; 12] = [
        "SELECT * FROM queen.push($1::text, $2::text::jsonb, $3::text, $4::text)",
        "SELECT * FROM queen.push_batch($1::text::jsonb)",
        "SELECT * FROM queen.pop($1::text, $2::text, $3::text::int, $4::text, $5::text::int, false, 0, $6::text::int, $7::text)",
        "SELECT queen.ack($1::text::uuid)",
        "SELECT queen.ack($1::text::uuid, $2::text::jsonb)",
        "SELECT queen.ack($1::text::uuid, $2::text::uuid, $3::text::bigint, $4::text, $5::text)",
        "SELECT queen.extend_lease($1::text::uuid, $2::text::int)",
        "SELECT queen.configure($1::text, $2::text::int, $3::text::int, ttl => $4::text::interval)",
        "SELECT * FROM queen.dlq($1::text, $2::text, $3::text::int, $4::text::int)",
        "SELECT queen.dlq_replay($1::text::uuid, $2::text)",
        "SELECT queen.configure_group($1::text, $2::text, $3::text::interval)",
        "SELECT queen.may_start($1::text::uuid, $2::text::interval)",
    ];
    let stmts: Vec<_> = calls.iter().map(|s| c.prepare(s).unwrap()).collect();
    let (mut ok, mut refused) = (0, 0);
    for i in 0..CALLS {
        let k = rng.gen_range(0..calls.len());
        let n = stmts[k].params().len();
        let args: Vec<Option<String>> = (0..n)
            .map(|j| {
                let int_like = calls[k].contains(&format!("${}::text::int", j + 1))
                    || calls[k].contains(&format!("${}::text::bigint", j + 1));
                if int_like && rng.gen_bool(0.7) {
                    odd_int(&mut rng)
                } else {
                    odd_text(&mut rng)
                }
            })
            .collect();
        let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
            args.iter().map(|a| a as &(dyn postgres::types::ToSql + Sync)).collect();
        match c.query(&stmts[k], &params) {
            Ok(_) => {
                ok += 1;
                // What a configure call accepted must not break the queue's (or the group's)
                // pops: a value stored as given that the pop's SQL cannot read would stall
                // it for good.
                if calls[k].contains("queen.configure") {
                    let group = if calls[k].contains("configure_group") { args[1].clone() } else { None }
                        .unwrap_or_else(|| "__QUEUE_MODE__".to_string());
                    if let Err(e) = c.query("SELECT count(*) FROM queen.pop($1::text, $2::text)", &[&args[0], &group]) {
                        panic!("call {i} ({}) with {args:?} was accepted, and then a pop failed: {e}", calls[k]);
                    }
                }
            }
            Err(e) => {
                let code = e
                    .code()
                    .unwrap_or_else(|| panic!("call {i} ({}) {args:?}: no SQLSTATE: {e}", calls[k]))
                    .code()
                    .to_string();
                let clean = code.starts_with("22") || code.starts_with("54") || code == "0A000" || code == "P0002";
                assert!(clean, "call {i} ({}) with {args:?} gave {code}: {e}", calls[k]);
                refused += 1;
            }
        }
    }
    assert!(refused > CALLS / 2, "most calls are bad: {refused} refused, {ok} accepted");
    let now: std::time::SystemTime = c.query_one("SELECT pg_postmaster_start_time()", &[]).unwrap().get(0);
    assert_eq!(started, now, "the server never restarted");
    // The queue used alongside is intact: its one message is still there, at offset 1.
    let rows = c.query("SELECT msg_offset, payload FROM queen.pop($1, auto_ack => true)", &[&live]).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, i64>(0), 1);
}
