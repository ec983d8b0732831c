//! Pops from new connections take turns over the partitions, as one session's pops do: the
//! round-robin start point is shared per (queue, group), not kept per backend. Partition
//! `a` holds 1,000 messages and `b` to `e` one each; eight auto-ack pops of 10, each from
//! a connection of its own (as `psql -c`, cron or a serverless function makes them),
//! serve all five partitions. The same through PgBouncer in transaction mode.

use std::collections::BTreeSet;

use postgres::{Client, NoTls};
use queen_it::{connect, unique};

fn fill(c: &mut Client, queue: &str) {
    c.execute(
        "SELECT count(*) FROM queen.push_batch($1::text, (SELECT jsonb_agg(jsonb_build_object('partition', 'a',
                                                                                   'payload', i))
                                                          FROM generate_series(1, 1000) i))",
        &[&queue],
    )
    .unwrap();
    for p in ["b", "c", "d", "e"] {
        c.execute("SELECT count(*) FROM queen.push($1, '1', $2)", &[&queue, &p]).unwrap();
    }
}

/// The partitions eight pops, each from a new connection to `dsn`, got.
fn eight_new_connections(dsn: &str, queue: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for _ in 0..8 {
        let mut c = Client::connect(dsn, NoTls).unwrap();
        for row in c.query("SELECT partition FROM queen.pop($1, batch => 10, auto_ack => true)", &[&queue]).unwrap() {
            seen.insert(row.get::<_, String>(0));
        }
    }
    seen
}

fn all_five() -> BTreeSet<String> {
    ["a", "b", "c", "d", "e"].iter().map(|s| s.to_string()).collect()
}

#[test]
fn pops_from_new_connections_serve_every_partition() {
    let queue = unique("fair");
    fill(&mut connect(), &queue);
    assert_eq!(eight_new_connections(&queen_it::dsn(), &queue), all_five());
}

#[test]
fn pops_through_pgbouncer_serve_every_partition() {
    let pooler = std::env::var("QUEEN_TEST_POOLER_DSN").expect("QUEEN_TEST_POOLER_DSN (set by make integration)");
    let queue = unique("fairpool");
    fill(&mut connect(), &queue);
    assert_eq!(eight_new_connections(&pooler, &queue), all_five());
}
