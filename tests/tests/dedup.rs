//! The dedup window under concurrency: sessions pushing one transaction id to one
//! partition at the same moment store it exactly once.

use std::sync::{Arc, Barrier};
use std::thread;

use queen_it::{connect, unique};

#[test]
fn concurrent_pushes_of_one_transaction_id_store_it_once() {
    const SESSIONS: usize = 8;
    for round in 0..5 {
        let queue = unique("dedup");
        let barrier = Arc::new(Barrier::new(SESSIONS));
        let handles: Vec<_> = (0..SESSIONS)
            .map(|s| {
                let (queue, barrier) = (queue.clone(), barrier.clone());
                thread::spawn(move || {
                    let mut c = connect();
                    barrier.wait();
                    let row = c
                        .query_one(
                            "SELECT status, message_id, msg_offset FROM queen.push($1, jsonb_build_object('s', $2::int), transaction_id => 'same-id')",
                            &[&queue, &(s as i32)],
                        )
                        .unwrap();
                    (row.get::<_, String>(0), row.get::<_, uuid::Uuid>(1), row.get::<_, i64>(2))
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let queued: Vec<_> = results.iter().filter(|r| r.0 == "queued").collect();
        assert_eq!(queued.len(), 1, "round {round}: exactly one push is queued: {results:?}");
        let (_, original_id, original_offset) = queued[0];
        for r in &results {
            if r.0 == "duplicate" {
                assert_eq!((&r.1, &r.2), (original_id, original_offset), "duplicates name the original");
            } else {
                assert_eq!(r.0, "queued");
            }
        }
        let mut c = connect();
        let stored: i64 = c
            .query_one("SELECT count(*) FROM queen.pop($1, batch => 100, auto_ack => true)", &[&queue])
            .unwrap()
            .get(0);
        assert_eq!(stored, 1, "round {round}: one message stored");
    }
}
