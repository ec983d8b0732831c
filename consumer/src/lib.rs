//! queen-consumer: a worker for a queen queue that lives by its lease budget (seed 001).
//!
//! A consumer claims a range with one `queen.pop`, holds it in a local queue and runs its
//! handler on one message at a time. All messages of a claim share one lease deadline:
//! before starting each one, the consumer asks `queen.may_start` whether the remaining
//! lease covers the handler timeout, the cancellation grace and the record margin. A
//! message that may not start is left unprocessed (the server's `SQL0105` warning is
//! reported as an [`Event::MayNotStart`]); it did not run.
//!
//! Each handler gets a cancellation token that fires at its timeout; after the grace the
//! consumer stops waiting for it (a handler that ignores cancellation may keep running)
//! and records it as failed. Once every started message has a result, the claim's results
//! are recorded in one `queen.ack` call: completed ones commit, errors become `failed`,
//! [`Outcome::RetryLater`] becomes `retry`, [`Outcome::Poison`] becomes `dlq`, and the
//! first message that could not start is released with `retry`, so it and the rest
//! redeliver at once.
//!
//! Difference from the seed's system: there, messages that may not start wait for the
//! lease to expire before another instance reclaims them. Here the consumer releases them
//! in its ack, so they come back immediately, to this instance or another.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_postgres::Client;
pub use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// What a handler decided about a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done: commit it.
    Completed,
    /// It can succeed later: redeliver at once, charge no retry budget (`retry`).
    RetryLater,
    /// Never again: dead-letter it now with this error (`dlq`).
    Poison(String),
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
    /// `queen.may_start` said no: the message did not run (SQL0105).
    MayNotStart {
        offset: i64,
        warning: String,
    },
    /// The claim's results, recorded in one ack call.
    Recorded {
        ack: Value,
    },
}

/// The four allowances of seed 001, and where to read from.
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
}

/// Builds a [`Consumer`]; defaults are the seed's example values.
pub struct Builder {
    cfg: Config,
    events: Option<mpsc::UnboundedSender<Event>>,
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
                handler_timeout: Duration::from_secs(30),
                queue_margin: Duration::from_secs(15),
                timeout_grace: Duration::from_secs(1),
                record_margin: Duration::from_secs(2),
            },
            events: None,
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
    /// Receive [`Event`]s.
    pub fn events(mut self, tx: mpsc::UnboundedSender<Event>) -> Self {
        self.events = Some(tx);
        self
    }

    /// Stores the budget for the group (`queen.configure_group`) and returns the consumer.
    pub async fn build(self, client: Client) -> Result<Consumer, tokio_postgres::Error> {
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
        Ok(Consumer { cfg: self.cfg, client, events: self.events, shutdown: CancellationToken::new() })
    }
}

/// A worker bound to one queue and consumer group.
pub struct Consumer {
    cfg: Config,
    client: Client,
    events: Option<mpsc::UnboundedSender<Event>>,
    shutdown: CancellationToken,
}

/// A handler's result: an outcome, or an error message (recorded as `failed`).
pub type HandlerResult = Result<Outcome, String>;

impl Consumer {
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// A token whose cancellation stops the consumer after the claim in hand is recorded.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    fn emit(&self, e: Event) {
        if let Some(tx) = &self.events {
            let _ = tx.send(e);
        }
    }

    /// Claims, processes and records until shut down.
    pub async fn run<H, F>(&self, handler: H) -> Result<(), tokio_postgres::Error>
    where
        H: Fn(Message, CancellationToken) -> F + Send + Sync + 'static,
        F: Future<Output = HandlerResult> + Send + 'static,
    {
        let handler = Arc::new(handler);
        while !self.shutdown.is_cancelled() {
            let h = handler.clone();
            self.run_once(move |m, t| h(m, t), None).await?;
        }
        Ok(())
    }

    /// One claim: pop, run handlers one at a time under the budget, record in one ack.
    /// `timeout_override` gives a message its own timeout (capped at the group's).
    /// Returns the number of messages claimed.
    pub async fn run_once<H, F>(
        &self,
        handler: H,
        timeout_override: Option<&(dyn Fn(&Message) -> Option<Duration> + Sync)>,
    ) -> Result<usize, tokio_postgres::Error>
    where
        H: Fn(Message, CancellationToken) -> F,
        F: Future<Output = HandlerResult> + Send + 'static,
    {
        let c = &self.cfg;
        let rows = self
            .client
            .query(
                "SELECT lease_id, partition_id, partition, msg_offset, message_id, transaction_id, payload, attempt
                   FROM queen.pop($1, $2, batch => $3, partition => $4, wait_ms => $5, max_partitions => $6)",
                &[&c.queue, &c.group, &c.batch, &c.partition, &(c.wait.as_millis() as i32), &c.max_partitions],
            )
            .await?;
        if rows.is_empty() {
            return Ok(0);
        }
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
            })
            .collect();
        self.emit(Event::Claimed { messages: messages.len() });
        let lease = messages[0].lease_id;

        let mut acks: Vec<Value> = Vec::new();
        let mut stopped = false;
        for m in &messages {
            if stopped || self.shutdown.is_cancelled() {
                stopped = true;
                break;
            }
            let timeout =
                timeout_override.and_then(|f| f(m)).map(|t| t.min(c.handler_timeout)).unwrap_or(c.handler_timeout);
            let may: bool = self
                .client
                .query_one("SELECT queen.may_start($1, make_interval(secs => $2))", &[&lease, &timeout.as_secs_f64()])
                .await?
                .get(0);
            if !may {
                self.emit(Event::MayNotStart {
                    offset: m.offset,
                    warning: "SQL0105: queued message has insufficient lease time".into(),
                });
                // The message did not run: release it (and the rest) at once.
                acks.push(json!({"partitionId": m.partition_id.to_string(), "offset": m.offset, "status": "retry"}));
                stopped = true;
                continue;
            }
            self.emit(Event::Started { offset: m.offset });
            let token = CancellationToken::new();
            let mut task = tokio::spawn(handler(m.clone(), token.clone()));
            let result = match tokio::time::timeout(timeout, &mut task).await {
                Ok(joined) => joined.unwrap_or_else(|e| Err(format!("handler panicked: {e}"))),
                Err(_) => {
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
            let (status, error) = match result {
                Ok(Outcome::Completed) => ("completed", None),
                Ok(Outcome::RetryLater) => ("retry", None),
                Ok(Outcome::Poison(e)) => ("dlq", Some(e)),
                Err(e) => ("failed", Some(e)),
            };
            self.emit(Event::Finished { offset: m.offset, status });
            acks.push(json!({"partitionId": m.partition_id.to_string(), "offset": m.offset,
                             "status": status, "error": error}));
        }
        if stopped {
            // Shutting down or out of time: release what never started in each lane.
            for m in &messages {
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
        let ack: Value =
            self.client.query_one("SELECT queen.ack($1, $2)", &[&lease, &Value::Array(acks)]).await?.get(0);
        self.emit(Event::Recorded { ack });
        Ok(messages.len())
    }
}
