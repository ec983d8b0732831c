//! The retention worker: with `shared_preload_libraries = 'queen'` it runs a retention
//! pass every `queen.retention_interval` seconds in `queen.retention_database` (the test
//! cluster sets 1 second and this database, scripts/test.conf). Consumed segments older
//! than a queue's retention disappear without anybody calling `queen.retain`; a queue
//! without retention keeps its segments.

use std::time::{Duration, Instant};

use postgres::Client;
use queen_it::{connect, unique};

fn segments(c: &mut Client, queue: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM queen.segments s JOIN queen.partitions p USING (partition_id)
           JOIN queen.queues q USING (queue_id) WHERE q.name = $1",
        &[&queue],
    )
    .unwrap()
    .get(0)
}

#[test]
fn worker_deletes_consumed_segments_past_the_retention() {
    let mut c = connect();
    // The worker starts with the server; until this database exists it exits and is
    // restarted (every 5 s), so give it a moment.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let workers: i64 = c
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queen retention'", &[])
            .unwrap()
            .get(0);
        if workers == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no retention worker is running (queen preloaded, scripts/test.conf)");
        std::thread::sleep(Duration::from_millis(200));
    }

    let (short, keep) = (unique("retained"), unique("kept"));
    c.execute("SELECT queen.configure($1, retention => 1)", &[&short]).unwrap();
    for q in [&short, &keep] {
        for i in 0..3 {
            c.execute("SELECT count(*) FROM queen.push($1, to_jsonb($2::int))", &[q, &i]).unwrap();
        }
        let n = c.query("SELECT 1 FROM queen.pop($1, batch => 10, auto_ack => true)", &[q]).unwrap().len();
        assert_eq!(n, 3);
    }
    assert_eq!(segments(&mut c, &short), 3);

    let deadline = Instant::now() + Duration::from_secs(30);
    while segments(&mut c, &short) > 0 {
        assert!(Instant::now() < deadline, "the worker did not delete the consumed segments within 30 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(segments(&mut c, &keep), 3, "a queue without retention keeps its segments");

    // The queue works on: a new message after the deleted ones, and a new group starts
    // after what was deleted.
    c.execute("SELECT count(*) FROM queen.push($1, '42')", &[&short]).unwrap();
    let rows = c.query("SELECT msg_offset, payload::text FROM queen.pop($1, 'late', batch => 10, auto_ack => true)", &[&short]).unwrap();
    let got: Vec<(i64, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(got, vec![(4, "42".to_string())]);
}
