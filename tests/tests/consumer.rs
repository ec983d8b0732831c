//! The consumer library against a real cluster: the lease-budget worked example scaled down in
//! time, handler timeouts and cancellation, and a crashed instance whose claim another
//! instance takes over after expiry.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use queen_consumer::{Builder, Event, Outcome};
use queen_it::{dsn, unique};
use serde_json::json;
use tokio::sync::mpsc;

async fn client() -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(&dsn(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    c
}

/// A client and its connection, not yet driven: for `Builder::build_with_connection`.
async fn client_and_connection(
) -> (tokio_postgres::Client, tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>) {
    tokio_postgres::connect(&dsn(), tokio_postgres::NoTls).await.unwrap()
}

/// The figures of the server's DETAIL for a `may_start` that said no: "X s of lease
/// remain; starting needs Y s (handler timeout T s + grace G s + record margin M s)".
/// Returns (X, Y, T, G, M), or None if the text is not the server's.
fn lease_figures(detail: &str) -> Option<(f64, f64, f64, f64, f64)> {
    let (remain, rest) = detail.split_once(" s of lease remain; starting needs ")?;
    let (needs, rest) = rest.split_once(" s (handler timeout ")?;
    let (timeout, rest) = rest.split_once(" s + grace ")?;
    let (grace, rest) = rest.split_once(" s + record margin ")?;
    let margin = rest.strip_suffix(" s)")?;
    Some((remain.parse().ok()?, needs.parse().ok()?, timeout.parse().ok()?, grace.parse().ok()?, margin.parse().ok()?))
}

/// The server's SQL0105 warning: a WARNING (SQLSTATE 01000) whose message begins
/// `SQL0105` and whose detail has the lease figures. Returns the figures.
fn sql0105(warning: &Option<Box<tokio_postgres::error::DbError>>) -> Option<(f64, f64, f64, f64, f64)> {
    let w = warning.as_deref()?;
    if w.severity() != "WARNING" || w.code() != &tokio_postgres::error::SqlState::WARNING {
        return None;
    }
    if !w.message().starts_with("SQL0105: queued message has insufficient lease time") {
        return None;
    }
    lease_figures(w.detail()?)
}

async fn push_n(queue: &str, n: i64) {
    let c = client().await;
    let items: Vec<_> = (1..=n).map(|i| json!({"queue": queue, "payload": {"n": i}})).collect();
    c.execute("SELECT count(*) FROM queen.push_batch($1)", &[&json!(items)]).await.unwrap();
}

fn drain(rx: &mut mpsc::UnboundedReceiver<Event>) -> Vec<Event> {
    let mut v = Vec::new();
    while let Ok(e) = rx.try_recv() {
        v.push(e);
    }
    v
}

/// Seed 001 at a tenth of the time: queue margin 1.5 s, handler timeout 3 s, grace 0.1 s,
/// record margin 0.2 s, so a claim leases for 4.8 s and a start needs 3.3 s. Handlers take
/// 1 s: messages 1 and 2 start (4.8 s and ~3.8 s left), message 3 may not (~2.8 s); its
/// event carries the server's own warning, figures included.
#[tokio::test]
async fn seed_worked_example_scaled_down() {
    let queue = unique("seed001");
    push_n(&queue, 4).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (consumer_client, connection) = client_and_connection().await;
    let consumer = Builder::new(&queue, "charge-cards")
        .batch(4)
        .wait(Duration::from_millis(0))
        .queue_margin(Duration::from_millis(1500))
        .handler_timeout(Duration::from_secs(3))
        .timeout_grace(Duration::from_millis(100))
        .record_margin(Duration::from_millis(200))
        .events(tx)
        .build_with_connection(consumer_client, connection)
        .await
        .unwrap();
    // The stored budget sets the lease: 4.8 s.
    let c = client().await;
    let lease: f64 = c
        .query_one("SELECT (queen.configure_group($1, 'charge-cards', '3 s', '1.5 s', '0.1 s', '0.2 s') ->> 'leaseSeconds')::float8", &[&queue])
        .await
        .unwrap()
        .get(0);
    assert!((lease - 4.8).abs() < 1e-9, "{lease}");

    let n = consumer
        .run_once(
            |_m, _cancel| async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(Outcome::Completed)
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(n, 4);
    let events = drain(&mut rx);
    let started: Vec<i64> =
        events.iter().filter_map(|e| if let Event::Started { offset } = e { Some(*offset) } else { None }).collect();
    assert_eq!(started, vec![1, 2], "{events:?}");
    assert!(
        events.iter().any(
            |e| matches!(e, Event::MayNotStart { offset: 3, warning: Some(w) } if w.message().starts_with("SQL0105"))
        ),
        "{events:?}"
    );
    // The warning is the server's: its detail has the lease the server saw remaining
    // (about 2.8 s, after two 1 s handlers) and the requirement from the stored budget.
    let warning = events
        .iter()
        .find_map(|e| if let Event::MayNotStart { offset: 3, warning } = e { Some(warning.clone()) } else { None })
        .unwrap();
    let (remain, needs, timeout, grace, margin) = sql0105(&warning).unwrap_or_else(|| panic!("{warning:?}"));
    assert!(remain > 2.0 && remain < 3.3, "{warning:?}");
    assert_eq!((needs, timeout, grace, margin), (3.3, 3.0, 0.1, 0.2), "{warning:?}");
    let ack =
        events.iter().find_map(|e| if let Event::Recorded { ack } = e { Some(ack.clone()) } else { None }).unwrap();
    assert_eq!(ack["lanes"][0]["committed"], 2, "{ack}");
    assert_eq!(ack["lanes"][0]["leaseReleased"], true, "{ack}");
    // 3 and 4 come back on the next pop at once, not after the lease would have expired.
    let rows = c
        .query("SELECT msg_offset FROM queen.pop($1, 'charge-cards', batch => 10, auto_ack => true)", &[&queue])
        .await
        .unwrap();
    let offsets: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(offsets, vec![3, 4]);
}

/// A handler that overruns sees its cancellation and is recorded failed; one that ignores
/// cancellation is abandoned after the grace and recorded failed; each failed ack charges
/// the lane's retry budget (docs/functions.md#ack).
#[tokio::test]
async fn handler_timeouts_cancel_then_abandon() {
    let queue = unique("timeouts");
    push_n(&queue, 1).await;
    let c = client().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = Builder::new(&queue, "g")
        .batch(1)
        .wait(Duration::from_millis(0))
        .queue_margin(Duration::from_millis(100))
        .handler_timeout(Duration::from_millis(300))
        .timeout_grace(Duration::from_millis(200))
        .record_margin(Duration::from_millis(100))
        .events(tx)
        .build(client().await)
        .await
        .unwrap();
    let saw_cancel = Arc::new(AtomicUsize::new(0));
    let seen = saw_cancel.clone();
    consumer
        .run_once(
            move |_m, cancel| {
                let seen = seen.clone();
                async move {
                    cancel.cancelled().await;
                    seen.fetch_add(1, Ordering::SeqCst);
                    Ok(Outcome::Completed)
                }
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(saw_cancel.load(Ordering::SeqCst), 1, "the handler saw its cancellation");
    let events = drain(&mut rx);
    assert!(events.contains(&Event::TimedOut { offset: 1 }), "{events:?}");
    assert!(!events.contains(&Event::Abandoned { offset: 1 }), "{events:?}");
    assert!(events.contains(&Event::Finished { offset: 1, status: "failed" }), "{events:?}");
    async fn retries(c: &tokio_postgres::Client, q: String) -> i32 {
        c.query_one("SELECT retry_count FROM queen.status($1) WHERE consumer_group = 'g'", &[&q])
            .await
            .unwrap()
            .get::<_, i32>(0)
    }
    assert_eq!(retries(&c, queue.clone()).await, 1);

    // Ignores cancellation: abandoned after the grace, recorded failed.
    let t0 = std::time::Instant::now();
    consumer
        .run_once(
            |_m, _cancel| async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(Outcome::Completed)
            },
            None,
        )
        .await
        .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "the consumer did not wait for the handler");
    let events = drain(&mut rx);
    assert!(events.contains(&Event::Abandoned { offset: 1 }), "{events:?}");
    let ack =
        events.iter().find_map(|e| if let Event::Recorded { ack } = e { Some(ack.clone()) } else { None }).unwrap();
    assert_eq!(ack["items"][0]["status"], "failed", "{ack}");
    assert!(ack["items"][0]["error"].as_str().unwrap().contains("ignored cancellation"), "{ack}");
    assert_eq!(retries(&c, queue.clone()).await, 2);
}

/// Two instances in one group; one claims and dies without recording. The other reclaims
/// the range after expiry; every message is processed at least once and the cursor passes
/// each offset exactly once.
#[tokio::test]
async fn a_crashed_instance_is_taken_over_after_expiry() {
    let queue = unique("crash");
    push_n(&queue, 5).await;
    let build = |tx| async move {
        Builder::new(&queue_name(), "workers")
            .batch(5)
            .wait(Duration::from_millis(0))
            .queue_margin(Duration::from_millis(500))
            .handler_timeout(Duration::from_millis(300))
            .timeout_grace(Duration::from_millis(100))
            .record_margin(Duration::from_millis(100))
            .events(tx)
            .build(client().await)
            .await
            .unwrap()
    };
    fn queue_name() -> String {
        QUEUE.lock().unwrap().clone()
    }
    static QUEUE: Mutex<String> = Mutex::new(String::new());
    *QUEUE.lock().unwrap() = queue.clone();

    let processed = Arc::new(Mutex::new(Vec::<i64>::new()));
    // Instance A: claims, processes one message, then its process dies (the task is
    // aborted mid-claim: nothing is recorded).
    let (tx_a, _rx_a) = mpsc::unbounded_channel();
    let a = build(tx_a).await;
    let pa = processed.clone();
    let task = tokio::spawn(async move {
        a.run_once(
            move |m, _c| {
                let pa = pa.clone();
                async move {
                    pa.lock().unwrap().push(m.offset);
                    tokio::time::sleep(Duration::from_secs(60)).await; // "crashes" in here
                    Ok(Outcome::Completed)
                }
            },
            None,
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    task.abort();

    // Instance B: nothing to claim while A's lease lives; after expiry it takes the range.
    let (tx_b, mut rx_b) = mpsc::unbounded_channel();
    let b = build(tx_b).await;
    let pb = processed.clone();
    let handler = move |m: queen_consumer::Message, _c| {
        let pb = pb.clone();
        async move {
            pb.lock().unwrap().push(m.offset);
            Ok(Outcome::Completed)
        }
    };
    assert_eq!(b.run_once(handler.clone(), None).await.unwrap(), 0, "A's lease is still live");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut claimed = 0;
    for _ in 0..5 {
        claimed += b.run_once(handler.clone(), None).await.unwrap();
    }
    assert_eq!(claimed, 5);
    let events = drain(&mut rx_b);
    let commits: Vec<i64> = events
        .iter()
        .filter_map(|e| if let Event::Recorded { ack } = e { ack["lanes"][0]["committed"].as_i64() } else { None })
        .collect();
    assert_eq!(commits.last(), Some(&5), "{events:?}");
    let mut seen = processed.lock().unwrap().clone();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, vec![1, 2, 3, 4, 5], "every message processed at least once");
    // The cursor passed each offset once: it only ever moved forward, to 5.
    assert!(commits.windows(2).all(|w| w[0] <= w[1]), "{commits:?}");
}

/// Graceful shutdown: the message in hand finishes, the rest of the claim is released at
/// once (not left to expire), and `run` returns.
#[tokio::test]
async fn graceful_shutdown_finishes_the_current_message_and_releases_the_rest() {
    let queue = unique("shutdown");
    push_n(&queue, 3).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = Builder::new(&queue, "g")
        .batch(3)
        .wait(Duration::from_millis(0))
        .handler_timeout(Duration::from_secs(2))
        .queue_margin(Duration::from_secs(10))
        .events(tx)
        .build(client().await)
        .await
        .unwrap();
    let stop = consumer.shutdown_token();
    consumer
        .run(move |m, _c| {
            let stop = stop.clone();
            async move {
                if m.offset == 1 {
                    stop.cancel(); // shutdown arrives while message 1 runs
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok(Outcome::Completed)
            }
        })
        .await
        .unwrap();
    let events = drain(&mut rx);
    let started: Vec<i64> =
        events.iter().filter_map(|e| if let Event::Started { offset } = e { Some(*offset) } else { None }).collect();
    assert_eq!(started, vec![1], "{events:?}");
    let ack =
        events.iter().find_map(|e| if let Event::Recorded { ack } = e { Some(ack.clone()) } else { None }).unwrap();
    assert_eq!(ack["lanes"][0]["committed"], 1, "{ack}");
    assert_eq!(ack["lanes"][0]["leaseReleased"], true, "{ack}");
    let c = client().await;
    let rows =
        c.query("SELECT msg_offset FROM queen.pop($1, 'g', batch => 10, auto_ack => true)", &[&queue]).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(), vec![2, 3], "released at once");
}

/// A W3C trace context travels from producer to consumer in the message's headers: a
/// handler sees the producer's `traceparent`; a message without headers, or with a
/// malformed traceparent, gives none.
#[tokio::test]
async fn the_producers_traceparent_reaches_the_handler() {
    let queue = unique("trace");
    let c = client().await;
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    c.execute(
        "SELECT count(*) FROM queen.push($1, '{\"n\": 1}', headers => $2)",
        &[&queue, &queen_consumer::trace_headers(trace)],
    )
    .await
    .unwrap();
    c.execute("SELECT count(*) FROM queen.push($1, '{\"n\": 2}')", &[&queue]).await.unwrap();
    let bad = json!({"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "k": "v"});
    c.execute("SELECT count(*) FROM queen.push($1, '{\"n\": 3}', headers => $2)", &[&queue, &bad]).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let consumer = Builder::new(&queue, "g")
        .batch(3)
        .wait(Duration::from_millis(0))
        .handler_timeout(Duration::from_secs(2))
        .queue_margin(Duration::from_secs(10))
        .build(client().await)
        .await
        .unwrap();
    let s = seen.clone();
    let n = consumer
        .run_once(
            move |m, _c| {
                s.lock().unwrap().push((
                    m.payload["n"].as_i64().unwrap(),
                    m.traceparent().map(str::to_string),
                    m.headers,
                ));
                async { Ok(Outcome::Completed) }
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(n, 3);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(1, Some(trace.to_string()), Some(json!({"traceparent": trace}))), (2, None, None), (3, None, Some(bad)),]
    );
}

/// A per-message timeout override applies, capped at the group's ceiling.
#[tokio::test]
async fn per_message_timeout_override_is_capped_at_the_ceiling() {
    let queue = unique("override");
    // Two lanes: a message that does not complete ends its own lane's claim, not the other.
    let c = client().await;
    let items =
        json!([{"queue": queue, "partition": "a", "payload": 1}, {"queue": queue, "partition": "b", "payload": 2}]);
    c.execute("SELECT count(*) FROM queen.push_batch($1)", &[&items]).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = Builder::new(&queue, "g")
        .batch(2)
        .max_partitions(2)
        .wait(Duration::from_millis(0))
        .handler_timeout(Duration::from_millis(600))
        .queue_margin(Duration::from_secs(5))
        .timeout_grace(Duration::from_millis(50))
        .record_margin(Duration::from_millis(50))
        .events(tx)
        .build(client().await)
        .await
        .unwrap();
    // Lane a's message gets 200 ms (it needs 400: times out); lane b's asks for 10 s but
    // is capped at the 600 ms ceiling (it needs 400: completes).
    let override_fn = |m: &queen_consumer::Message| {
        Some(if m.partition == "a" { Duration::from_millis(200) } else { Duration::from_secs(10) })
    };
    consumer
        .run_once(
            |_m, cancel| async move {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(400)) => Ok(Outcome::Completed),
                    _ = cancel.cancelled() => Err("cancelled".to_string()),
                }
            },
            Some(&override_fn),
        )
        .await
        .unwrap();
    let events = drain(&mut rx);
    let count = |e: &Event| events.iter().filter(|x| *x == e).count();
    assert_eq!(count(&Event::TimedOut { offset: 1 }), 1, "{events:?}");
    assert_eq!(count(&Event::Finished { offset: 1, status: "failed" }), 1, "{events:?}");
    assert_eq!(count(&Event::Finished { offset: 1, status: "completed" }), 1, "{events:?}");
}

/// A claim whose lease is exactly what a start needs (no queue margin): by the time the
/// consumer asks, less remains, so the first message may not start. Built with the
/// connection, the event has the server's warning and figures; built from a bare client
/// (the library cannot see notices), it says there is none rather than make one up.
#[tokio::test]
async fn may_not_start_reports_the_servers_warning_or_none() {
    for with_connection in [true, false] {
        let queue = unique("sql0105");
        push_n(&queue, 2).await;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let builder = Builder::new(&queue, "g")
            .batch(2)
            .wait(Duration::from_millis(0))
            .queue_margin(Duration::ZERO)
            .handler_timeout(Duration::from_secs(2))
            .timeout_grace(Duration::from_millis(50))
            .record_margin(Duration::from_millis(50))
            .events(tx);
        let consumer = if with_connection {
            let (c, conn) = client_and_connection().await;
            builder.build_with_connection(c, conn).await.unwrap()
        } else {
            builder.build(client().await).await.unwrap()
        };
        let n = consumer.run_once(|_m, _c| async move { Ok(Outcome::Completed) }, None).await.unwrap();
        assert_eq!(n, 2);
        let events = drain(&mut rx);
        assert!(!events.iter().any(|e| matches!(e, Event::Started { .. })), "{events:?}");
        let warning = events
            .iter()
            .find_map(|e| if let Event::MayNotStart { offset: 1, warning } = e { Some(warning.clone()) } else { None })
            .unwrap_or_else(|| panic!("{events:?}"));
        if with_connection {
            let (remain, needs, timeout, grace, margin) = sql0105(&warning).unwrap_or_else(|| panic!("{warning:?}"));
            assert!(remain > 0.0 && remain <= 2.1, "{warning:?}");
            assert_eq!((needs, timeout, grace, margin), (2.1, 2.0, 0.05, 0.05), "{warning:?}");
        } else {
            assert_eq!(warning, None, "the library cannot see notices, so it reports none");
        }
        // Both messages were released at once.
        let c = client().await;
        let rows = c
            .query("SELECT msg_offset FROM queen.pop($1, 'g', batch => 10, auto_ack => true)", &[&queue])
            .await
            .unwrap();
        assert_eq!(rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(), vec![1, 2]);
    }
}

/// The error policy decides how a handler's error is acked: an exponential `retryAfter`
/// holds the lane back; `DeadLetter` files the message now.
#[tokio::test]
async fn the_error_policy_decides_how_an_error_is_acked() {
    use queen_consumer::{backoff_policy, Decision};
    let queue = unique("policy");
    push_n(&queue, 1).await;
    let consumer = Builder::new(&queue, "g")
        .wait(Duration::from_millis(0))
        .error_policy(backoff_policy(Duration::from_secs(30), Duration::from_secs(60)))
        .build(client().await)
        .await
        .unwrap();
    let failing = |_m, _c| async { Err::<Outcome, String>("down".to_string()) };
    assert_eq!(consumer.run_once(failing, None).await.unwrap(), 1);
    let c = client().await;
    let row = c.query_one("SELECT retry_at IS NOT NULL, retry_count FROM queen.status($1)", &[&queue]).await.unwrap();
    assert_eq!((row.get::<_, bool>(0), row.get::<_, i32>(1)), (true, 1), "backed off, budget charged");
    assert_eq!(consumer.run_once(failing, None).await.unwrap(), 0, "not claimable during the backoff");

    let queue = unique("policy-dlq");
    push_n(&queue, 1).await;
    let consumer = Builder::new(&queue, "g")
        .wait(Duration::from_millis(0))
        .error_policy(
            |_m: &queen_consumer::Message, e: &str| {
                if e.starts_with("fatal") {
                    Decision::DeadLetter
                } else {
                    Decision::Retry { after: None }
                }
            },
        )
        .build(client().await)
        .await
        .unwrap();
    consumer.run_once(|_m, _c| async { Err::<Outcome, String>("fatal: bad input".to_string()) }, None).await.unwrap();
    let dead: Vec<String> =
        c.query("SELECT error_message FROM queen.dlq($1)", &[&queue]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(dead, vec!["fatal: bad input".to_string()]);
}

/// A batch handler gets the whole claim; a failure runs the claim again one message at a
/// time within the same call (the handler gets one-message batches), so that only a
/// message that fails is charged; a completion commits every lane.
#[tokio::test]
async fn a_batch_handler_gets_the_whole_claim() {
    let queue = unique("batch");
    let c = client().await;
    let items: Vec<_> =
        (0..6).map(|i| json!({"queue": queue, "partition": format!("p{}", i % 2), "payload": i})).collect();
    c.execute("SELECT count(*) FROM queen.push_batch($1)", &[&json!(items)]).await.unwrap();
    let consumer = Builder::new(&queue, "g")
        .batch(10)
        .max_partitions(2)
        .wait(Duration::from_millis(0))
        .build(client().await)
        .await
        .unwrap();
    let seen: Arc<Mutex<Vec<Vec<i64>>>> = Arc::default();
    let seen2 = seen.clone();
    let n = consumer
        .run_batch_once(move |ms, _c| {
            let mut payloads: Vec<i64> = ms.iter().map(|m| m.payload.as_i64().unwrap()).collect();
            payloads.sort();
            let mut seen = seen2.lock().unwrap();
            seen.push(payloads);
            let first = seen.len() == 1;
            async move {
                if first {
                    Err("the batch fails once".to_string())
                } else {
                    Ok(Outcome::Completed)
                }
            }
        })
        .await
        .unwrap();
    assert_eq!(n, 6);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[0], vec![0, 1, 2, 3, 4, 5]);
    assert!(seen[1..].iter().all(|b| b.len() == 1), "{seen:?}");
    let mut singles: Vec<i64> = seen[1..].iter().map(|b| b[0]).collect();
    singles.sort();
    assert_eq!(singles, vec![0, 1, 2, 3, 4, 5], "each message once more, alone");
    let retries: Vec<i32> = c
        .query("SELECT retry_count FROM queen.status($1)", &[&queue])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(retries, vec![0, 0], "completed: the budget resets");
    let left = c
        .query("SELECT 1 FROM queen.pop($1, 'g', batch => 10, max_partitions => 2, auto_ack => true)", &[&queue])
        .await
        .unwrap();
    assert!(left.is_empty());
}

/// A shutdown ends a long-poll in progress within about a second, not at the end of the
/// consumer's `wait` (30 s here): the wait is sent as pops of at most a second each. A
/// message that arrives right after the shutdown, while the last pop still waits, is
/// claimed by it and released at once (`retry`), not run and not left leased.
#[tokio::test]
async fn a_shutdown_ends_a_long_poll_in_progress() {
    let queue = unique("longpoll_stop");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer =
        Builder::new(&queue, "g").wait(Duration::from_secs(30)).events(tx).build(client().await).await.unwrap();
    let stop = consumer.shutdown_token();
    let started = std::time::Instant::now();
    let pusher = {
        let queue = queue.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            stop.cancel();
            push_n(&queue, 1).await; // wakes the pop in flight (its slice ends at 1 s)
        })
    };
    let ran = tokio::time::timeout(Duration::from_secs(10), consumer.run(|_m, _c| async { Ok(Outcome::Completed) }))
        .await
        .expect("run returns long before the 30 s wait ends");
    ran.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3), "stopped after {:?}", started.elapsed());
    pusher.await.unwrap();
    let events = drain(&mut rx);
    // The message: claimed by the pop in flight and released (attempt 1), or not claimed
    // at all if the pop had ended first (attempt 0); either way it is there at once.
    let claimed = events.iter().any(|e| matches!(e, Event::Claimed { .. }));
    assert!(
        !events.iter().any(|e| matches!(e, Event::Started { .. })),
        "no handler runs after the shutdown: {events:?}"
    );
    let c = client().await;
    let rows = c
        .query("SELECT msg_offset, attempt FROM queen.pop($1, 'g', batch => 10, auto_ack => true)", &[&queue])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "the message is free for the group: {events:?}");
    assert_eq!(rows[0].get::<_, i32>(1), i32::from(claimed), "{events:?}");
}
