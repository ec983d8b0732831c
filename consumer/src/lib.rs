//! queen-consumer: a worker for a queen queue that lives by its lease budget
//! (`queen.configure_group`).
//!
//! A consumer claims a range with one `queen.pop`, holds it in a local queue and runs its
//! handler on one message at a time. All messages of a claim share one lease deadline:
//! before starting each one, the consumer asks `queen.may_start` whether the remaining
//! lease covers the handler timeout, the cancellation grace and the record margin. A
//! message that may not start is left unprocessed and reported as an
//! [`Event::MayNotStart`]; it did not run.
//!
//! The event carries the server's own `SQL0105` WARNING (message, SQLSTATE and the DETAIL
//! with the lease figures) as the server sent it, when the consumer can see it: notices
//! travel on the connection, not the [`Client`], so build the consumer with
//! [`Builder::build_with_connection`], which drives the connection and forwards its
//! notices. A consumer built with [`Builder::build`] from a bare client never sees them
//! and reports `warning: None`; so does one whose session filters warnings out
//! (`client_min_messages` above `warning`). The library never makes the text up.
//!
//! Each handler gets a cancellation token that fires at its timeout; after the grace the
//! consumer stops waiting for it (a handler that ignores cancellation may keep running)
//! and records it as failed. Once every started message has a result, the claim's results
//! are recorded in one `queen.ack` call: completed ones commit, errors become `failed`,
//! [`Outcome::RetryLater`] becomes `retry`, [`Outcome::Poison`] becomes `dlq`, and the
//! first message that could not start is released with `retry`, so it and the rest
//! redeliver at once.
//!
//! A design choice: messages that may not start are not left to wait for the lease to
//! expire before another instance reclaims them. The consumer releases them in its ack,
//! so they come back immediately, to this instance or another.
//!
//! - **Heartbeat.** While a handler runs, the lease is extended a third of its length after
//!   the handler started, then every third, and at once when less than a third of it is
//!   left ([`Builder::heartbeat`], on by default), so a handler slower than the lease keeps
//!   its message, also one that started late in the lease. Messages waiting their turn do
//!   not extend it.
//! - **A lane stops at its first message that does not complete**: the rest of that
//!   partition's claim is not run (the ack's lowest signal decides the lane, and what
//!   follows is delivered again).
//! - **Graceful stop.** Cancel [`Consumer::shutdown_token`] (on SIGTERM, say): the running
//!   handler finishes, the rest of the claim is released with `retry`, and [`Consumer::run`]
//!   returns. A long-poll in progress ends within a second: a long `wait` is a series of
//!   pops of at most a second each, and the token is checked between them.
//! - **Errors.** `Err(text)` (and a panic or a timeout) is acked as the error policy
//!   decides ([`Builder::error_policy`]: `failed` by default; [`backoff_policy`] for an
//!   exponential `retryAfter`); [`Outcome::RetryAfter`] asks for a `retry` later.
//! - **Batches.** [`Consumer::run_batch`] hands a whole claim to one handler. A `retry`
//!   outcome applies to each lane's first message; a failure runs the claim again one
//!   message at a time, so that only the message that fails is charged.
//! - **Concurrency.** One consumer runs one handler at a time; [`Builder::build_pool`]
//!   makes N consumers on N connections that run together under one shutdown token
//!   ([`Pool`], `examples/pool.rs`).
//!
//! The same scenarios run against this crate, the Python package and the Node.js package:
//! `clients/conformance/scenarios.json`.

use queen_core::policy::DEFAULT_BUDGET;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Mutex};
use tokio_postgres::error::{DbError, Severity};
use tokio_postgres::{AsyncMessage, Client, Connection};
pub use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// What a handler decided about a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done: commit it.
    Completed,
    /// It can succeed later: redeliver at once, charge no retry budget (`retry`).
    RetryLater,
    /// It can succeed later, not before this long: `retry` with a `retryAfter`.
    RetryAfter(Duration),
    /// Never again: dead-letter it now with this error (`dlq`).
    Poison(String),
}

/// How a handler's error (`Err(text)`, a panic, a timeout) is acked: the error policy's
/// answer ([`Builder::error_policy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// `failed`: charges the lane's retry budget; past the queue's `retry_limit` the message
    /// is dead-lettered. `retry_after` None: the queue's backoff.
    Failed { retry_after: Option<Duration> },
    /// `retry`: no budget charged.
    Retry { after: Option<Duration> },
    /// `dlq`: dead-lettered now.
    DeadLetter,
}

/// An error policy: what to do with a message whose handler failed with this text.
pub type ErrorPolicy = dyn Fn(&Message, &str) -> Decision + Send + Sync;

/// The default policy: `failed`, the queue's backoff.
pub fn default_error_policy(_: &Message, _: &str) -> Decision {
    Decision::Failed { retry_after: None }
}

/// `failed` with an exponential `retry_after`: `base` × 2^attempt, at most `cap`.
pub fn backoff_policy(base: Duration, cap: Duration) -> impl Fn(&Message, &str) -> Decision + Send + Sync {
    move |m, _| Decision::Failed { retry_after: Some(base.saturating_mul(1u32 << m.attempt.clamp(0, 20)).min(cap)) }
}

/// One claimed message.
#[derive(Debug, Clone)]
pub struct Message {
    pub lease_id: Uuid,
    pub partition_id: Uuid,
    pub partition: String,
    pub offset: i64,
    pub message_id: Uuid,
    pub transaction_id: String,
    pub payload: Value,
    pub attempt: i32,
    /// The headers the producer pushed with the message (`queen.push(..., headers =>)`),
    /// or None.
    pub headers: Option<Value>,
}

impl Message {
    /// The producer's W3C trace context (`headers.traceparent`), when it is a well-formed
    /// `traceparent` (version 00: `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`,
    /// ids not all zero): the consumer's span continues that trace. Anything else is None,
    /// as the W3C rules ask of a receiver.
    pub fn traceparent(&self) -> Option<&str> {
        let t = self.headers.as_ref()?.get("traceparent")?.as_str()?;
        valid_traceparent(t).then_some(t)
    }
}

/// Headers that carry a W3C trace context to the consumer: pass them as `headers` to
/// `queen.push` or as the `"headers"` key of a `queen.push_batch` item.
pub fn trace_headers(traceparent: &str) -> Value {
    json!({ "traceparent": traceparent })
}

fn valid_traceparent(t: &str) -> bool {
    let parts: Vec<&str> = t.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    parts.len() == 4
        && parts[0] == "00"
        && hex(parts[1], 32)
        && nonzero(parts[1])
        && hex(parts[2], 16)
        && nonzero(parts[2])
        && hex(parts[3], 2)
}

/// What happened, for logs and tests.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Claimed {
        messages: usize,
    },
    Started {
        offset: i64,
    },
    Finished {
        offset: i64,
        status: &'static str,
    },
    /// The handler passed its timeout; its cancellation token fired.
    TimedOut {
        offset: i64,
    },
    /// The handler ignored cancellation for the whole grace: no longer waited for.
    Abandoned {
        offset: i64,
    },
    /// `queen.may_start` said no: the message did not run.
    MayNotStart {
        offset: i64,
        /// The WARNING the server raised during that `may_start` call, as received:
        /// its message begins `SQL0105: queued message has insufficient lease time` and
        /// its detail gives the lease remaining and what starting needs. `None` when no
        /// warning reached the consumer: it was built with [`Builder::build`] (it cannot
        /// see the connection's notices), or the session does not send warnings
        /// (`client_min_messages`). Never filled in by the library itself.
        warning: Option<Box<DbError>>,
    },
    /// The claim's results, recorded in one ack call.
    Recorded {
        ack: Value,
    },
    /// A round of [`Consumer::run`] or [`Consumer::run_batch`] ended in an error worth
    /// another ([`retryable`]); the loop goes on after a second.
    Retrying {
        error: String,
    },
}

/// The four allowances of a lease budget, and where to read from.
#[derive(Debug, Clone)]
pub struct Config {
    pub queue: String,
    pub group: String,
    pub batch: i32,
    pub partition: Option<String>,
    pub max_partitions: i32,
    pub wait: Duration,
    /// The longest a handler may run: the group's ceiling.
    pub handler_timeout: Duration,
    /// Time a claimed message may wait in the local queue.
    pub queue_margin: Duration,
    /// How long to wait for a handler after cancelling it.
    pub timeout_grace: Duration,
    /// Time kept to record the results.
    pub record_margin: Duration,
    /// The pop's `lease_seconds`; None: the group's budget (which `build` stores).
    pub lease: Option<Duration>,
    /// Extend the lease while a handler runs ([`Builder::heartbeat`]).
    pub heartbeat: bool,
    /// Ask `queen.may_start` before each message.
    pub check_may_start: bool,
}

fn micros(us: i64) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

/// Builds a [`Consumer`]; the budget defaults are queen's (`queen_core::policy::DEFAULT_BUDGET`,
/// the same as `queen.configure_group`'s).
#[derive(Clone)]
pub struct Builder {
    cfg: Config,
    events: Option<mpsc::UnboundedSender<Event>>,
    policy: Arc<ErrorPolicy>,
}

impl Builder {
    pub fn new(queue: &str, group: &str) -> Self {
        Builder {
            cfg: Config {
                queue: queue.into(),
                group: group.into(),
                batch: 10,
                partition: None,
                max_partitions: 1,
                wait: Duration::from_secs(1),
                handler_timeout: micros(DEFAULT_BUDGET.handler_timeout),
                queue_margin: micros(DEFAULT_BUDGET.queue_margin),
                timeout_grace: micros(DEFAULT_BUDGET.timeout_grace),
                record_margin: micros(DEFAULT_BUDGET.record_margin),
                lease: None,
                heartbeat: true,
                check_may_start: true,
            },
            events: None,
            policy: Arc::new(default_error_policy),
        }
    }
    pub fn batch(mut self, n: i32) -> Self {
        self.cfg.batch = n;
        self
    }
    pub fn partition(mut self, p: &str) -> Self {
        self.cfg.partition = Some(p.into());
        self
    }
    pub fn max_partitions(mut self, n: i32) -> Self {
        self.cfg.max_partitions = n;
        self
    }
    /// How long a claim waits for messages (the pop's `wait_ms`, sent as pops of at most a
    /// second each).
    pub fn wait(mut self, d: Duration) -> Self {
        self.cfg.wait = d;
        self
    }
    pub fn handler_timeout(mut self, d: Duration) -> Self {
        self.cfg.handler_timeout = d;
        self
    }
    pub fn queue_margin(mut self, d: Duration) -> Self {
        self.cfg.queue_margin = d;
        self
    }
    pub fn timeout_grace(mut self, d: Duration) -> Self {
        self.cfg.timeout_grace = d;
        self
    }
    pub fn record_margin(mut self, d: Duration) -> Self {
        self.cfg.record_margin = d;
        self
    }
    /// Lease each claim for this long (`pop`'s `lease_seconds`, whole seconds) instead of
    /// the group's budget.
    pub fn lease(mut self, d: Duration) -> Self {
        self.cfg.lease = Some(d);
        self
    }
    /// Extend the lease while a handler runs (on by default): a third of the lease after the
    /// handler started, then every third, and at once when less than a third of the lease is
    /// left, `queen.extend_lease` renews it for its length, so a handler slower than the
    /// lease keeps its message. Messages waiting their turn do not extend it.
    pub fn heartbeat(mut self, on: bool) -> Self {
        self.cfg.heartbeat = on;
        self
    }
    /// Ask `queen.may_start` before each message (on by default).
    pub fn check_may_start(mut self, on: bool) -> Self {
        self.cfg.check_may_start = on;
        self
    }
    /// How a handler's error is acked (default: `failed`, the queue's backoff). See
    /// [`backoff_policy`].
    pub fn error_policy(mut self, policy: impl Fn(&Message, &str) -> Decision + Send + Sync + 'static) -> Self {
        self.policy = Arc::new(policy);
        self
    }
    /// Receive [`Event`]s.
    pub fn events(mut self, tx: mpsc::UnboundedSender<Event>) -> Self {
        self.events = Some(tx);
        self
    }

    /// Stores the budget for the group (`queen.configure_group`) and returns the consumer.
    ///
    /// The caller drives `client`'s connection, so the consumer cannot see the server's
    /// notices: every [`Event::MayNotStart`] has `warning: None`. Use
    /// [`Builder::build_with_connection`] to have the server's warning reported.
    pub async fn build(self, client: Client) -> Result<Consumer, tokio_postgres::Error> {
        self.finish(client, None).await
    }

    /// Like [`Builder::build`], but takes the client's connection too and drives it on a
    /// tokio task (do not spawn it yourself), forwarding the server's notices to the
    /// consumer, so each [`Event::MayNotStart`] carries the WARNING that its
    /// `queen.may_start` call raised. The task ends when the connection closes or fails;
    /// the client's next call then returns the error.
    pub async fn build_with_connection<S, T>(
        self,
        client: Client,
        connection: Connection<S, T>,
    ) -> Result<Consumer, tokio_postgres::Error>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(drive(connection, tx));
        self.finish(client, Some(rx)).await
    }

    async fn finish(
        self,
        client: Client,
        notices: Option<mpsc::UnboundedReceiver<DbError>>,
    ) -> Result<Consumer, tokio_postgres::Error> {
        let c = &self.cfg;
        client
            .execute(
                "SELECT queen.configure_group($1, $2, make_interval(secs => $3), make_interval(secs => $4),
                                              make_interval(secs => $5), make_interval(secs => $6))",
                &[
                    &c.queue,
                    &c.group,
                    &c.handler_timeout.as_secs_f64(),
                    &c.queue_margin.as_secs_f64(),
                    &c.timeout_grace.as_secs_f64(),
                    &c.record_margin.as_secs_f64(),
                ],
            )
            .await?;
        Ok(Consumer {
            cfg: self.cfg,
            client,
            notices: notices.map(Mutex::new),
            events: self.events,
            shutdown: CancellationToken::new(),
            policy: self.policy,
        })
    }
}

/// Drives a connection, sending each notice the server raises to `notices`. A notice is
/// sent before the connection reads any later message of its statement's reply, so it is
/// in the channel by the time the client's call returns.
async fn drive<S, T>(mut connection: Connection<S, T>, notices: mpsc::UnboundedSender<DbError>)
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notice(notice))) => {
                // The consumer may be gone; keep driving until the connection ends.
                let _ = notices.send(notice);
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break,
        }
    }
}

/// The longest one pop of the consumer waits: a longer [`Builder::wait`] is several pops,
/// so that a shutdown ends a long-poll within this.
const WAIT_SLICE: Duration = Duration::from_secs(1);

/// A worker bound to one queue and consumer group.
pub struct Consumer {
    cfg: Config,
    client: Client,
    /// The connection's notices, when the consumer drives it. Held across a `may_start`
    /// call so that the notices received meanwhile belong to that call.
    notices: Option<Mutex<mpsc::UnboundedReceiver<DbError>>>,
    events: Option<mpsc::UnboundedSender<Event>>,
    shutdown: CancellationToken,
    policy: Arc<ErrorPolicy>,
}

/// A handler's result: an outcome, or an error message (recorded as `failed`).
pub type HandlerResult = Result<Outcome, String>;

/// Gives a message its own handler timeout (see [`Consumer::run_once`]).
pub type TimeoutOverride<'a> = dyn Fn(&Message) -> Option<Duration> + Sync + 'a;

impl Consumer {
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// A token whose cancellation stops the consumer after the claim in hand is recorded.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Asks `queen.may_start`; on a no, also returns the first WARNING the server sent
    /// during the call (`None` if none reached the consumer).
    async fn may_start(
        &self,
        lease: Uuid,
        timeout: Duration,
    ) -> Result<(bool, Option<Box<DbError>>), tokio_postgres::Error> {
        let ask = || async {
            let row = self
                .client
                .query_one("SELECT queen.may_start($1, make_interval(secs => $2))", &[&lease, &timeout.as_secs_f64()])
                .await?;
            Ok::<bool, tokio_postgres::Error>(row.get(0))
        };
        let Some(notices) = &self.notices else {
            return Ok((ask().await?, None));
        };
        let mut notices = notices.lock().await;
        // Notices from earlier statements (pop, ack) are not this call's.
        while notices.try_recv().is_ok() {}
        let may = ask().await?;
        let mut warning = None;
        while let Ok(n) = notices.try_recv() {
            if warning.is_none() && is_warning(&n) {
                warning = Some(Box::new(n));
            }
        }
        Ok((may, if may { None } else { warning }))
    }

    /// Extends `lease` by `lease_length` seconds from now, and moves `expires` (this
    /// process's clock) with it.
    async fn extend(
        &self,
        lease: Uuid,
        lease_length: i32,
        expires: &mut tokio::time::Instant,
    ) -> Result<(), tokio_postgres::Error> {
        let now = tokio::time::Instant::now();
        self.client.execute("SELECT queen.extend_lease($1, $2)", &[&lease, &lease_length]).await?;
        *expires = now + Duration::from_secs(lease_length.max(1) as u64);
        Ok(())
    }

    /// Waits for a handler up to `timeout` (None: it timed out), extending the lease by
    /// `lease_length` seconds meanwhile when the heartbeat is on: a third of the lease after
    /// the handler started, then every third, and at once when less than a third of the
    /// lease is left by `expires` (the claim's, updated here), so that a handler that
    /// started late in the lease does not lose it. Waiting messages do not extend it. A
    /// failed extension is not an error here: the ack reports a lease that was lost.
    async fn wait_beating(
        &self,
        task: &mut tokio::task::JoinHandle<HandlerResult>,
        timeout: Duration,
        lease: Uuid,
        lease_length: i32,
        expires: &mut tokio::time::Instant,
    ) -> Option<Result<HandlerResult, tokio::task::JoinError>> {
        let start = tokio::time::Instant::now();
        let deadline = start + timeout;
        let beat = Duration::from_secs_f64(f64::from(lease_length) / 3.0);
        let mut due = (start + beat).min(expires.checked_sub(beat).unwrap_or(start));
        loop {
            let next = if self.cfg.heartbeat { deadline.min(due) } else { deadline };
            tokio::select! {
                joined = &mut *task => return Some(joined),
                _ = tokio::time::sleep_until(next) => {
                    if tokio::time::Instant::now() >= deadline {
                        return None;
                    }
                    let now = tokio::time::Instant::now();
                    let _ = self.extend(lease, lease_length, expires).await;
                    due = now + beat;
                }
            }
        }
    }

    fn emit(&self, e: Event) {
        if let Some(tx) = &self.events {
            let _ = tx.send(e);
        }
    }

    /// Claims, processes and records until shut down. An error the server says to retry
    /// ([`retryable`]) is reported ([`Event::Retrying`]) and the loop goes on after a
    /// second: a claim it left unacked comes back when its lease expires. Any other error,
    /// a lost connection among them, ends the loop.
    pub async fn run<H, F>(&self, handler: H) -> Result<(), tokio_postgres::Error>
    where
        H: Fn(Message, CancellationToken) -> F + Send + Sync + 'static,
        F: Future<Output = HandlerResult> + Send + 'static,
    {
        let handler = Arc::new(handler);
        while !self.shutdown.is_cancelled() {
            let h = handler.clone();
            let r = self.run_once(move |m, t| h(m, t), None).await;
            self.go_on_after(r).await?;
        }
        Ok(())
    }

    /// Ok for a round that ended well or with an error worth another round (after a
    /// pause of a second, or until shutdown); the error otherwise.
    async fn go_on_after(&self, r: Result<usize, tokio_postgres::Error>) -> Result<(), tokio_postgres::Error> {
        match r {
            Err(e) if retryable(&e) => {
                self.emit(Event::Retrying { error: e.to_string() });
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = self.shutdown.cancelled() => {}
                }
                Ok(())
            }
            r => r.map(|_| ()),
        }
    }

    /// One pop: the claimed messages (None: nothing came within the wait), the lease
    /// length a heartbeat renews (the pop's `lease_seconds`, else what the lease had left
    /// by the server's clock), and when the lease expires, by this process's clock.
    async fn claim(&self) -> Result<Option<(Vec<Message>, i32, tokio::time::Instant)>, tokio_postgres::Error> {
        let c = &self.cfg;
        let lease_seconds = c.lease.map_or(0, |d| d.as_secs().max(1) as i32);
        // The wait as pops of at most WAIT_SLICE each, the shutdown token checked between
        // them. (Cancelling a pop in flight instead would race: a cancel request that
        // arrives after the pop returned could cancel the statement after it.)
        let now = tokio::time::Instant::now();
        let deadline = now.checked_add(c.wait).unwrap_or(now + Duration::from_secs(365 * 86_400));
        let rows = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let slice = left.min(WAIT_SLICE);
            let rows = self
                .client
                .query(
                    "SELECT lease_id, partition_id, partition, msg_offset, message_id, transaction_id, payload, attempt,
                            headers, extract(epoch FROM lease_expires_at - clock_timestamp())::float8
                       FROM queen.pop($1, $2, batch => $3, partition => $4, wait_ms => $5, max_partitions => $6,
                                      lease_seconds => $7)",
                    &[
                        &c.queue,
                        &c.group,
                        &c.batch,
                        &c.partition,
                        &(slice.as_millis() as i32),
                        &c.max_partitions,
                        &lease_seconds,
                    ],
                )
                .await?;
            if !rows.is_empty() || left <= WAIT_SLICE || self.shutdown.is_cancelled() {
                break rows;
            }
        };
        if rows.is_empty() {
            return Ok(None);
        }
        let popped = tokio::time::Instant::now();
        let messages: Vec<Message> = rows
            .iter()
            .map(|r| Message {
                lease_id: r.get(0),
                partition_id: r.get(1),
                partition: r.get(2),
                offset: r.get(3),
                message_id: r.get(4),
                transaction_id: r.get(5),
                payload: r.get(6),
                attempt: r.get(7),
                headers: r.get(8),
            })
            .collect();
        self.emit(Event::Claimed { messages: messages.len() });
        let left = rows[0].get::<_, Option<f64>>(9);
        let lease_length = match lease_seconds {
            0 => left.filter(|s| *s > 0.0).map_or(60, |s| s.ceil() as i32),
            n => n,
        };
        let left = left.unwrap_or(f64::from(lease_length)).clamp(0.0, 86_400.0);
        Ok(Some((messages, lease_length, popped + Duration::from_secs_f64(left))))
    }

    /// One claim handled as a whole: `handler` gets every message of it at once (after
    /// `may_start` for the first), under the heartbeat and the handler timeout. `Completed`
    /// commits every lane; `RetryLater` / `RetryAfter` (or an error the policy retries)
    /// releases each lane from its first message with `retry`. `Poison`, or an error the
    /// policy fails or dead-letters, runs the claim again one message at a time (the
    /// handler gets a one-message batch each time, as [`Consumer::run_once`] would run
    /// them), so that only the message that fails is charged; a claim of one message is
    /// acked at once. Returns the number of messages claimed.
    pub async fn run_batch_once<H, F>(&self, handler: H) -> Result<usize, tokio_postgres::Error>
    where
        H: Fn(Vec<Message>, CancellationToken) -> F,
        F: Future<Output = HandlerResult> + Send + 'static,
    {
        let c = &self.cfg;
        let Some((messages, lease_length, mut expires)) = self.claim().await? else {
            return Ok(0);
        };
        let lease = messages[0].lease_id;
        let mut firsts: Vec<&Message> = Vec::new(); // each lane's first message
        let mut lasts: Vec<&Message> = Vec::new();
        for m in &messages {
            match firsts.iter().position(|f| f.partition_id == m.partition_id) {
                None => {
                    firsts.push(m);
                    lasts.push(m);
                }
                Some(i) if m.offset > lasts[i].offset => lasts[i] = m,
                Some(_) => {}
            }
        }
        let item = |m: &Message, status: &str, error: Option<&str>, after: Option<f64>| {
            let mut v = json!({"partitionId": m.partition_id.to_string(), "offset": m.offset, "status": status,
                               "error": error});
            if let Some(s) = after {
                v["retryAfter"] = json!(s);
            }
            v
        };
        let may = if self.shutdown.is_cancelled() {
            false
        } else if c.check_may_start {
            let (may, warning) = self.may_start(lease, c.handler_timeout).await?;
            if !may {
                self.emit(Event::MayNotStart { offset: messages[0].offset, warning });
            }
            may
        } else {
            true
        };
        let acks: Vec<Value> = if !may {
            firsts.iter().map(|m| item(m, "retry", None, None)).collect()
        } else {
            self.emit(Event::Started { offset: messages[0].offset });
            let token = CancellationToken::new();
            let mut task = tokio::spawn(handler(messages.clone(), token.clone()));
            // Whether the handler still runs: it ignored cancellation past the grace.
            let mut abandoned = false;
            let result = match self.wait_beating(&mut task, c.handler_timeout, lease, lease_length, &mut expires).await
            {
                Some(joined) => joined.unwrap_or_else(|e| Err(format!("handler panicked: {e}"))),
                None => {
                    self.emit(Event::TimedOut { offset: messages[0].offset });
                    token.cancel();
                    abandoned = tokio::time::timeout(c.timeout_grace, &mut task).await.is_err();
                    if abandoned {
                        self.emit(Event::Abandoned { offset: messages[0].offset });
                    }
                    Err(format!("handler timed out after {:?}", c.handler_timeout))
                }
            };
            let secs = |d: Option<Duration>| d.map(pause_secs);
            let (status, error, after) = match &result {
                Ok(Outcome::Completed) => ("completed", None, None),
                Ok(Outcome::RetryLater) => ("retry", None, None),
                Ok(Outcome::RetryAfter(d)) => ("retry", None, Some(pause_secs(*d))),
                Ok(Outcome::Poison(e)) => ("dlq", Some(e.clone()), None),
                Err(e) => match (self.policy)(&messages[0], e) {
                    Decision::Failed { retry_after } => ("failed", Some(e.clone()), secs(retry_after)),
                    Decision::Retry { after } => ("retry", Some(e.clone()), secs(after)),
                    Decision::DeadLetter => ("dlq", Some(e.clone()), None),
                },
            };
            self.emit(Event::Finished { offset: messages[0].offset, status });
            // The first lane's first message charged with the batch's outcome; the other
            // lanes released at once.
            let charge_first = || {
                let mut v = vec![item(firsts[0], status, error.as_deref(), after)];
                v.extend(firsts[1..].iter().map(|m| item(m, "retry", None, None)));
                v
            };
            if status == "completed" {
                lasts.iter().map(|m| item(m, "completed", None, None)).collect()
            } else if status == "retry" {
                // A free retry: every lane from its first.
                firsts.iter().map(|m| item(m, status, error.as_deref(), after)).collect()
            } else if messages.len() == 1 || abandoned {
                // The one message that failed; or a handler still running, which must not
                // meet a second run of the same messages.
                charge_first()
            } else {
                // Which message failed is not known, and charging each lane's first would
                // dead-letter (or drop) messages that may be sound: run the claim again one
                // message at a time, on a lease extended for it, so that only a message
                // that fails is charged.
                if c.heartbeat {
                    self.extend(lease, lease_length, &mut expires).await?;
                }
                let (acks, started) =
                    self.run_each(&messages, lease_length, &mut expires, |m, t| handler(vec![m], t), None).await?;
                if started {
                    acks
                } else {
                    // Not one could start (may_start, a stop): charge the first lane's
                    // first, so that a batch that always fails is not handed back free.
                    charge_first()
                }
            }
        };
        let ack: Value =
            self.client.query_one("SELECT queen.ack($1, $2)", &[&lease, &Value::Array(acks)]).await?.get(0);
        self.emit(Event::Recorded { ack });
        Ok(messages.len())
    }

    /// [`Consumer::run_batch_once`] until shut down; errors as [`Consumer::run`] treats them.
    pub async fn run_batch<H, F>(&self, handler: H) -> Result<(), tokio_postgres::Error>
    where
        H: Fn(Vec<Message>, CancellationToken) -> F,
        F: Future<Output = HandlerResult> + Send + 'static,
    {
        while !self.shutdown.is_cancelled() {
            let r = self.run_batch_once(&handler).await;
            self.go_on_after(r).await?;
        }
        Ok(())
    }

    /// One claim: pop, run handlers one at a time under the budget, record in one ack.
    /// `timeout_override` gives a message its own timeout (capped at the group's).
    /// Returns the number of messages claimed.
    pub async fn run_once<H, F>(
        &self,
        handler: H,
        timeout_override: Option<&TimeoutOverride<'_>>,
    ) -> Result<usize, tokio_postgres::Error>
    where
        H: Fn(Message, CancellationToken) -> F,
        F: Future<Output = HandlerResult> + Send + 'static,
    {
        let Some((messages, lease_length, mut expires)) = self.claim().await? else {
            return Ok(0);
        };
        let lease = messages[0].lease_id;
        let (acks, _) = self.run_each(&messages, lease_length, &mut expires, handler, timeout_override).await?;
        let ack: Value =
            self.client.query_one("SELECT queen.ack($1, $2)", &[&lease, &Value::Array(acks)]).await?.get(0);
        self.emit(Event::Recorded { ack });
        Ok(messages.len())
    }

    /// Runs a claim's messages one at a time under the budget and returns the ack's items,
    /// and whether any handler started.
    async fn run_each<H, F>(
        &self,
        messages: &[Message],
        lease_length: i32,
        expires: &mut tokio::time::Instant,
        handler: H,
        timeout_override: Option<&TimeoutOverride<'_>>,
    ) -> Result<(Vec<Value>, bool), tokio_postgres::Error>
    where
        H: Fn(Message, CancellationToken) -> F,
        F: Future<Output = HandlerResult> + Send + 'static,
    {
        let c = &self.cfg;
        let lease = messages[0].lease_id;
        let mut acks: Vec<Value> = Vec::new();
        let mut started_any = false;
        let mut stopped = false;
        // Lanes whose message did not complete: the rest of such a lane is not run (the
        // ack's lowest signal decides the lane; what follows is delivered again).
        let mut ended_lanes: Vec<Uuid> = Vec::new();
        for m in messages {
            if stopped || self.shutdown.is_cancelled() {
                stopped = true;
                break;
            }
            if ended_lanes.contains(&m.partition_id) {
                continue;
            }
            let timeout =
                timeout_override.and_then(|f| f(m)).map(|t| t.min(c.handler_timeout)).unwrap_or(c.handler_timeout);
            if c.check_may_start {
                let (may, warning) = self.may_start(lease, timeout).await?;
                if !may {
                    self.emit(Event::MayNotStart { offset: m.offset, warning });
                    // The message did not run: release it (and the rest) at once.
                    acks.push(
                        json!({"partitionId": m.partition_id.to_string(), "offset": m.offset, "status": "retry"}),
                    );
                    stopped = true;
                    continue;
                }
            }
            self.emit(Event::Started { offset: m.offset });
            started_any = true;
            let token = CancellationToken::new();
            let mut task = tokio::spawn(handler(m.clone(), token.clone()));
            let result = match self.wait_beating(&mut task, timeout, lease, lease_length, expires).await {
                Some(joined) => joined.unwrap_or_else(|e| Err(format!("handler panicked: {e}"))),
                None => {
                    self.emit(Event::TimedOut { offset: m.offset });
                    token.cancel();
                    match tokio::time::timeout(c.timeout_grace, &mut task).await {
                        Ok(_) => Err(format!("handler timed out after {timeout:?}")),
                        Err(_) => {
                            self.emit(Event::Abandoned { offset: m.offset });
                            Err(format!("handler timed out after {timeout:?} and ignored cancellation"))
                        }
                    }
                }
            };
            let secs = |d: Option<Duration>| d.map(pause_secs);
            let (status, error, retry_after) = match result {
                Ok(Outcome::Completed) => ("completed", None, None),
                Ok(Outcome::RetryLater) => ("retry", None, None),
                Ok(Outcome::RetryAfter(d)) => ("retry", None, Some(pause_secs(d))),
                Ok(Outcome::Poison(e)) => ("dlq", Some(e), None),
                Err(e) => match (self.policy)(m, &e) {
                    Decision::Failed { retry_after } => ("failed", Some(e), secs(retry_after)),
                    Decision::Retry { after } => ("retry", Some(e), secs(after)),
                    Decision::DeadLetter => ("dlq", Some(e), None),
                },
            };
            self.emit(Event::Finished { offset: m.offset, status });
            if status != "completed" {
                ended_lanes.push(m.partition_id);
            }
            let mut item = json!({"partitionId": m.partition_id.to_string(), "offset": m.offset,
                                  "status": status, "error": error});
            if let Some(s) = retry_after {
                item["retryAfter"] = json!(s);
            }
            acks.push(item);
        }
        if stopped {
            // Shutting down or out of time: release what never started in each lane.
            for m in messages {
                let started =
                    acks.iter().any(|a| a["offset"] == m.offset && a["partitionId"] == m.partition_id.to_string());
                let lane_released =
                    acks.iter().any(|a| a["partitionId"] == m.partition_id.to_string() && a["status"] != "completed");
                if !started && !lane_released {
                    acks.push(
                        json!({"partitionId": m.partition_id.to_string(), "offset": m.offset, "status": "retry"}),
                    );
                }
            }
        }
        Ok((acks, started_any))
    }
}

/// Whether an error is worth another round of the loop rather than ending it: a
/// serialization failure or deadlock (class 40), a cancelled statement (57014), a full
/// shared-memory table (53400: "retry later", docs/errors.md), a lock wait past the
/// session's `lock_timeout` (55P03). The same set as the Python and Node loops, but for a
/// lost connection, which they reconnect after and this consumer (one connection, the
/// caller's) cannot.
pub fn retryable(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    !e.is_closed()
        && e.code().is_some_and(|c| {
            c.code().starts_with("40")
                || [SqlState::QUERY_CANCELED, SqlState::CONFIGURATION_LIMIT_EXCEEDED, SqlState::LOCK_NOT_AVAILABLE]
                    .contains(c)
        })
}

/// A pause before redelivery as an ack takes it: at most 7 days (the ack refuses the whole
/// call, 22023, for a longer one, and every consumer that met the message would stop).
fn pause_secs(d: Duration) -> f64 {
    d.as_secs_f64().min(queen_core::policy::limits::RETRY_DELAY as f64 / 1e6)
}

/// `n` consumers of one queue and group, each on a connection of its own, run together:
/// `n` handlers at once. One shutdown token stops them all.
pub struct Pool {
    consumers: Vec<Consumer>,
    shutdown: CancellationToken,
}

impl Builder {
    /// Connects `n` times to `dsn` (without TLS) and builds a consumer on each
    /// ([`Builder::build_with_connection`]).
    pub async fn build_pool(self, dsn: &str, n: usize) -> Result<Pool, tokio_postgres::Error> {
        let shutdown = CancellationToken::new();
        let mut consumers = Vec::with_capacity(n);
        for _ in 0..n.max(1) {
            let (client, connection) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await?;
            let mut c = self.clone().build_with_connection(client, connection).await?;
            c.shutdown = shutdown.child_token();
            consumers.push(c);
        }
        Ok(Pool { consumers, shutdown })
    }
}

impl Pool {
    /// Cancelling it stops every consumer after the claim in hand is recorded.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Runs every consumer until shut down; the first error stops the others and is
    /// returned once all have stopped.
    pub async fn run<H, F>(self, handler: H) -> Result<(), tokio_postgres::Error>
    where
        H: Fn(Message, CancellationToken) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = HandlerResult> + Send + 'static,
    {
        let mut tasks = Vec::new();
        for c in self.consumers {
            let (h, stop) = (handler.clone(), self.shutdown.clone());
            tasks.push(tokio::spawn(async move {
                let r = c.run(h).await;
                if r.is_err() {
                    stop.cancel();
                }
                r
            }));
        }
        let mut first = Ok(());
        for t in tasks {
            let r = t.await.expect("a consumer task panicked");
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// A notice of WARNING severity (the nonlocalized severity when the server sends it).
fn is_warning(n: &DbError) -> bool {
    match n.parsed_severity() {
        Some(s) => s == Severity::Warning,
        None => n.severity() == "WARNING",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_follows_the_w3c_format() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(valid_traceparent(good));
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // an unknown version
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // upper case
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero parent id
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  // short trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            assert!(!valid_traceparent(bad), "{bad}");
        }
        let m = |headers| Message {
            lease_id: Uuid::nil(),
            partition_id: Uuid::nil(),
            partition: "p".into(),
            offset: 1,
            message_id: Uuid::nil(),
            transaction_id: "t".into(),
            payload: Value::Null,
            attempt: 1,
            headers,
        };
        assert_eq!(m(Some(trace_headers(good))).traceparent(), Some(good));
        assert_eq!(m(Some(json!({"traceparent": 5}))).traceparent(), None);
        assert_eq!(m(None).traceparent(), None);
    }
}
