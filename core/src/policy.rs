//! Queue policy: every option queen stores, its default and its limits, the lease
//! precedence, the dead-letter decision, the dedup window, the consumer budget defaults and
//! the limits of each call. The extension reads them from here: its SQL defaults are
//! checked against this module by tests (`sql_defaults` below for `sql/schema.sql` and
//! `sql/api.sql`; an in-server test for the defaults on the Rust entry points), and its
//! error messages are the `Violation`s built here.
//!
//! Durations are whole seconds where queen stores seconds (`lease_time`, `dedup_window`,
//! `retention`), and microseconds where it computes with PostgreSQL intervals.

use crate::lease::{Budget, MICROS};

/// Name rules (queues; partitions and consumer groups), kept in `names`.
pub use crate::names::{lane_name, queue_name, NameError, MAX_NAME};

/// The partition a push uses when none is named.
pub const DEFAULT_PARTITION: &str = "Default";
/// The consumer group of a pop that names none: queue mode, one shared cursor.
pub const QUEUE_MODE_GROUP: &str = "__QUEUE_MODE__";

/// Where a new consumer group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subscription {
    /// From the oldest retained message.
    All,
    /// After the messages present when the group is created.
    New,
}

impl Subscription {
    pub const DEFAULT: Subscription = Subscription::All;

    pub fn parse(s: &str) -> Result<Subscription, Violation> {
        match s {
            "all" => Ok(Subscription::All),
            "new" => Ok(Subscription::New),
            _ => Err(Violation::invalid("subscription", format!("{s:?} (must be 'all' or 'new')"))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Subscription::All => "all",
            Subscription::New => "new",
        }
    }
}

/// The options of one queue, as `queen.queues` stores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueOptions {
    /// Seconds a pop's lease lasts when neither the pop nor the group's budget says.
    pub lease_time: i32,
    /// Failed acks of one batch before its messages are dead-lettered (or passed over).
    pub retry_limit: i32,
    pub dead_letter_queue: bool,
    pub dlq_after_max_retries: bool,
    /// Seconds a producer transaction id is remembered per partition; 0 turns dedup off.
    pub dedup_window: i32,
    pub encryption: bool,
    /// Seconds a fully consumed segment is kept; 0 keeps segments until retention runs
    /// with every group past them.
    pub retention: i32,
    /// The first pause, in microseconds, before a batch that failed is delivered again
    /// (`retry_delay`); 0 (the default) redelivers at once.
    pub retry_backoff: i64,
    /// The longest pause the backoff grows to, in microseconds.
    pub retry_backoff_max: i64,
    /// Microseconds a message waits after it was pushed before it may be delivered
    /// (`due_at`); 0 (the default): at once.
    pub delay: i64,
    /// Whether a pop may create a consumer group that does not exist yet (else only
    /// `create_group` and `configure_group` do).
    pub create_groups: bool,
    /// Microseconds after which a partition nobody pushed to, and that is empty, is
    /// dropped by the background worker; 0 (the default): never.
    pub partition_idle_ttl: i64,
    /// Microseconds a message may wait unconsumed: past it a group's pop does not deliver
    /// it (`expired`) but files it as a dead letter (or drops it without a DLQ); 0 (the
    /// default): for ever.
    pub ttl: i64,
    /// The most unconsumed messages a push may leave in the queue (`overflow::depth`), at
    /// least 1;
    /// None (the default): no limit.
    pub max_depth: Option<i64>,
    /// Microseconds a dead letter of the queue is kept after it was filed (`failed_at`):
    /// older ones are deleted by the background worker's expiry round; 0 (the default):
    /// for ever.
    pub dlq_retention: i64,
}

impl QueueOptions {
    /// What `queen.configure` stores for an option it is not given.
    pub const CONFIGURED: QueueOptions = QueueOptions {
        lease_time: 300,
        retry_limit: 3,
        dead_letter_queue: true,
        dlq_after_max_retries: true,
        dedup_window: 3600,
        encryption: false,
        retention: 0,
        retry_backoff: 0,
        retry_backoff_max: 600 * MICROS,
        delay: 0,
        create_groups: true,
        partition_idle_ttl: 0,
        ttl: 0,
        max_depth: None,
        dlq_retention: 0,
    };

    /// What a queue created implicitly (by its first push, pop or group) stores: the
    /// column defaults of `queen.queues`. Only the lease differs from `CONFIGURED`.
    pub const IMPLICIT: QueueOptions = QueueOptions { lease_time: 60, ..QueueOptions::CONFIGURED };

    /// Checks every option, naming the first one out of range. `max_lease`: the longest
    /// lease allowed, in seconds (`queen.max_lease`).
    pub fn validate(&self, max_lease: i32) -> Result<(), Violation> {
        if self.lease_time < 1 || self.lease_time > max_lease {
            return Err(Violation::invalid(
                "lease_time",
                format!("{} (must be 1 to {max_lease} seconds, queen.max_lease)", self.lease_time),
            ));
        }
        for (name, v) in
            [("retry_limit", self.retry_limit), ("dedup_window", self.dedup_window), ("retention", self.retention)]
        {
            if v < 0 {
                return Err(Violation::invalid(name, format!("{v} (must be >= 0)")));
            }
        }
        let secs = |v: i64| v as f64 / MICROS as f64;
        if self.retry_backoff < 0 || self.retry_backoff > limits::RETRY_DELAY {
            return Err(Violation::invalid(
                "retry_backoff",
                format!("{} s (must be 0 to {} s)", secs(self.retry_backoff), secs(limits::RETRY_DELAY)),
            ));
        }
        if self.retry_backoff_max < self.retry_backoff.max(1) || self.retry_backoff_max > limits::RETRY_DELAY {
            return Err(Violation::invalid(
                "retry_backoff_max",
                format!(
                    "{} s (must be > 0, at least retry_backoff and at most {} s)",
                    secs(self.retry_backoff_max),
                    secs(limits::RETRY_DELAY)
                ),
            ));
        }
        if !(0..=limits::DELAY).contains(&self.delay) {
            return Err(Violation::invalid(
                "delay",
                format!("{} s (must be 0 to {} s)", secs(self.delay), secs(limits::DELAY)),
            ));
        }
        if !(0..=limits::IDLE_TTL).contains(&self.partition_idle_ttl) {
            return Err(Violation::invalid(
                "partition_idle_ttl",
                format!("{} s (must be 0 to {} s)", secs(self.partition_idle_ttl), secs(limits::IDLE_TTL)),
            ));
        }
        if !(0..=limits::TTL).contains(&self.ttl) {
            return Err(Violation::invalid(
                "ttl",
                format!("{} s (must be 0 to {} s)", secs(self.ttl), secs(limits::TTL)),
            ));
        }
        if !(0..=limits::DLQ_RETENTION).contains(&self.dlq_retention) {
            return Err(Violation::invalid(
                "dlq_retention",
                format!("{} s (must be 0 to {} s)", secs(self.dlq_retention), secs(limits::DLQ_RETENTION)),
            ));
        }
        match self.max_depth {
            Some(m) if m < 1 => {
                Err(Violation::invalid("max_depth", format!("{m} (must be at least 1, or NULL for no limit)")))
            }
            _ => Ok(()),
        }
    }

    /// The pause before a batch whose failed acks number `retry_count` (counting the one
    /// just made) is delivered again: `retry_backoff`, doubled for each earlier failure,
    /// at most `retry_backoff_max`; 0 when the queue has no backoff.
    pub fn retry_delay(&self, retry_count: i32) -> i64 {
        backoff_delay(self.retry_backoff, self.retry_backoff_max, retry_count)
    }

    /// Whether this queue files the messages of a batch whose retries are exhausted (and
    /// poison) as dead letters, rather than passing over them.
    pub fn dead_lettering(&self) -> bool {
        dead_lettering(self.dead_letter_queue, self.dlq_after_max_retries)
    }
}

/// The dead-letter decision from the two stored flags: either one asks for it.
pub fn dead_lettering(dead_letter_queue: bool, dlq_after_max_retries: bool) -> bool {
    dead_letter_queue || dlq_after_max_retries
}

/// Lease time when nothing else says: an unknown queue or a failed lookup.
pub const DEFAULT_LEASE_SECONDS: i64 = 60;

/// The shortest lease a group's budget gives: 100 ms. A shorter one may have ended before
/// its pop returns, and a group whose every lease ends that way never acks anything (a
/// budget of 1 µs did that). Budgets of a few hundred milliseconds are for handlers that
/// must answer fast; the leases a caller gives in seconds (`lease_seconds`, `lease_time`,
/// `extend_lease`) are at least 1 s anyway.
pub const MIN_BUDGET_LEASE_MICROS: i64 = 100_000;

/// Effective lease of a pop, in microseconds, in order of precedence: the pop's
/// `lease_seconds` when > 0; else the group's budget (`Budget::lease_micros`, None or 0
/// when the group has none); else the queue's stored `lease_time`; else 60 s. Never
/// longer than `max_lease` seconds (`queen.max_lease`: a setting lowered after a queue
/// or a budget was configured still bounds every lease).
pub fn effective_lease_micros(
    lease_seconds: i32,
    budget_micros: Option<i64>,
    queue_lease_time: Option<i32>,
    max_lease: i32,
) -> i64 {
    let chosen = if lease_seconds > 0 {
        i64::from(lease_seconds) * MICROS
    } else if let Some(b) = budget_micros.filter(|&b| b > 0) {
        // A budget stored before the floor (an older release took any) leases for the floor.
        b.max(MIN_BUDGET_LEASE_MICROS)
    } else {
        match queue_lease_time {
            Some(s) if s > 0 => i64::from(s) * MICROS,
            _ => DEFAULT_LEASE_SECONDS * MICROS,
        }
    };
    chosen.min(i64::from(max_lease.max(1)) * MICROS)
}

/// Checks the `seconds` of `extend_lease`: more than 0, at most `max_lease`.
pub fn check_extend_seconds(seconds: i32, max_lease: i32) -> Result<(), Violation> {
    if seconds <= 0 || seconds > max_lease {
        return Err(Violation::invalid(
            "seconds",
            format!("{seconds} (must be 1 to {max_lease} seconds, queen.max_lease)"),
        ));
    }
    Ok(())
}

/// Seconds `queen.extend_lease` adds when not told.
pub const DEFAULT_EXTEND_SECONDS: i32 = 60;

/// A group's budget when `queen.configure_group` is not given an allowance:
/// handler 30 s, queue margin 15 s, grace 1 s, record margin 2 s (a 48 s lease).
pub const DEFAULT_BUDGET: Budget = Budget {
    handler_timeout: 30 * MICROS,
    queue_margin: 15 * MICROS,
    timeout_grace: MICROS,
    record_margin: 2 * MICROS,
};

impl Budget {
    /// Checks the allowances of a budget: none negative or over `MAX_ALLOWANCE`, and a
    /// handler that may run.
    pub fn validate(&self) -> Result<(), Violation> {
        for (name, v) in [
            ("handler_timeout", self.handler_timeout),
            ("queue_margin", self.queue_margin),
            ("timeout_grace", self.timeout_grace),
            ("record_margin", self.record_margin),
        ] {
            if !(0..=limits::ALLOWANCE).contains(&v) {
                return Err(Violation::invalid(
                    name,
                    format!("{} s (must be 0 to {} s)", v as f64 / MICROS as f64, limits::ALLOWANCE / MICROS),
                ));
            }
        }
        if self.handler_timeout == 0 {
            return Err(Violation::invalid("handler_timeout", "0 (must be > 0)"));
        }
        // The lease a pop takes from it (`MIN_BUDGET_LEASE_MICROS`).
        if self.lease_micros() < MIN_BUDGET_LEASE_MICROS {
            return Err(Violation::invalid(
                "handler_timeout",
                format!(
                    "{} s: the lease budget (handler_timeout + queue_margin + timeout_grace + record_margin) is {} s (must be at least {} s)",
                    self.handler_timeout as f64 / MICROS as f64,
                    self.lease_micros() as f64 / MICROS as f64,
                    MIN_BUDGET_LEASE_MICROS as f64 / MICROS as f64
                ),
            ));
        }
        Ok(())
    }
}

/// Whether a push of items with producer transaction ids checks them for duplicates.
pub fn dedup_applies(dedup_window: i32, any_transaction_id: bool) -> bool {
    dedup_window > 0 && any_transaction_id
}

/// A partition's expired dedup entries are pruned now and then by a push, so the dedup
/// table stays bounded without a pass of its own: by one single-message push in this many,
/// and by every push of at least this many messages.
pub const DEDUP_PRUNE_EVERY: i64 = 64;

/// True when a push that reserved `n` offsets from `first` prunes its partition's
/// expired dedup entries: when `first` lies within `n` past a multiple of
/// `DEDUP_PRUNE_EVERY`.
pub fn dedup_prune_due(first: i64, n: i64) -> bool {
    first.rem_euclid(DEDUP_PRUNE_EVERY) < n
}

/// `QueueOptions::retry_delay` from the two stored options.
pub fn backoff_delay(retry_backoff: i64, retry_backoff_max: i64, retry_count: i32) -> i64 {
    if retry_backoff <= 0 {
        return 0;
    }
    let doublings = retry_count.saturating_sub(1).clamp(0, 62) as u32;
    retry_backoff.checked_mul(1i64 << doublings).unwrap_or(i64::MAX).min(retry_backoff_max)
}

/// The SQL form of "this group gets nothing now" (`queen.pause`) over a queue row aliased
/// `$q` and its group row `$g` (NULL when the group has none): the queue's flag or the
/// group's. Pop reads it with the group's settings; status, totals and metrics show it
/// (pinned by `sql_defaults::status_totals_and_metrics_spell_paused_as_pop_does`).
#[macro_export]
macro_rules! paused_sql {
    ($q:literal, $g:literal) => {
        concat!("(", $q, ".paused OR coalesce(", $g, ".paused, false))")
    };
}

/// The header a redriven message carries (`queen.dlq_redrive(..., to => 'failing_group')`):
/// the name of the one consumer group it is for. Every other group passes over it.
pub const REDRIVE_HEADER: &str = "queen.redrive";

/// Whether `group` passes over a message whose `REDRIVE_HEADER` names `target` (None: the
/// message has none, and every group gets it).
pub fn redrive_passes(target: Option<&str>, group: &str) -> bool {
    target.is_some_and(|t| t != group)
}

/// Where `queen.dlq_redrive` sends what it re-pushes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedriveTo {
    /// Only to the group that dead-lettered each message (`REDRIVE_HEADER`).
    FailingGroup,
    /// To every group, as `dlq_replay` does.
    All,
}

impl RedriveTo {
    /// Whether a dead letter is redriven only while the group that filed it exists: a copy
    /// meant for that group alone would otherwise be passed over by every group, delivered
    /// to none, while its row is marked redriven. Such rows stay in place.
    pub fn needs_its_group(self) -> bool {
        self == RedriveTo::FailingGroup
    }
}

/// Checks `dlq_redrive`'s `max_messages` (1 to `REDRIVE_ROWS`) and `deliver_to`.
pub fn check_redrive(limit: i32, to: &str) -> Result<RedriveTo, Violation> {
    if !(1..=limits::REDRIVE_ROWS).contains(&limit) {
        return Err(Violation::invalid("max_messages", format!("{limit} (must be 1 to {})", limits::REDRIVE_ROWS)));
    }
    match to {
        "failing_group" => Ok(RedriveTo::FailingGroup),
        "all" => Ok(RedriveTo::All),
        _ => Err(Violation::invalid("deliver_to", format!("{to:?} (must be 'failing_group' or 'all')"))),
    }
}

/// Whether a message that could be delivered from `due_at` on (`due_at`: its push, or
/// later with a delay or a delivery time) has outlived the queue's `ttl` at `now` (all
/// microseconds): it is then not delivered to a group that has not consumed it. The ttl
/// counts from the due time, so every message has `ttl` to be delivered, however long it
/// was delayed (from the push, a message delayed by `ttl` or more would expire before it
/// could ever be delivered). Nor before `not_before`, the latest of:
/// - when the queue's options last changed: the due time follows the queue's `delay` as
///   it is now, so a shorter delay (or a `configure` that leaves it out) moves the due
///   time of stored messages back, and would expire at once those that could not be
///   delivered until then;
/// - when the message became readable, if that came late (`offsets::LATE_AFTER` or more
///   after its push: its push transaction, or an earlier one of its partition, stayed
///   open; `offsets::View::readable_after`): no reader could have consumed it before.
///
/// A `ttl` of 0 never expires anything; the boundary itself is expired.
pub fn expired(due_at: i64, not_before: i64, ttl: i64, now: i64) -> bool {
    ttl > 0 && due_at.max(not_before).saturating_add(ttl) <= now
}

/// Whether something dated `at` has outlived a span `keep_for` at `now` (all
/// microseconds): a dead letter filed at `at` under its queue's `dlq_retention` (the
/// worker's expiry deletes it), or a partition last written at `at` under its queue's
/// `partition_idle_ttl` (the worker drops it once it is empty). A span of 0 keeps for
/// ever; the boundary itself is kept.
pub fn outlived(at: i64, keep_for: i64, now: i64) -> bool {
    keep_for > 0 && at < now.saturating_sub(keep_for)
}

/// The SQL form of `outlived` over a time `$at` (an expression) and a span `$keep_for` (an
/// interval column or placeholder): a string literal, for `concat!`. Judged by `now()`,
/// the caller's transaction start. The span counts as its seconds (a day is 86,400 s, as
/// `outlived` has it), not as calendar days, which a change of daylight saving time would
/// make 23 or 25 hours long.
#[macro_export]
macro_rules! outlived_sql {
    ($at:literal, $keep_for:literal) => {
        concat!(
            "(",
            $keep_for,
            " > '0s' AND ",
            $at,
            " < now() - make_interval(secs => extract(epoch FROM ",
            $keep_for,
            ")))"
        )
    };
}

/// `expired` as a pop judges it: `not_before` is the latest of `configured_at` and
/// `readable_after()`, the time after which the message became readable when that came
/// late (None otherwise). `readable_after` is asked only of a message that would expire
/// without it (it takes the offset registry's lock), which few do.
pub fn expired_once_readable(
    due_at: i64,
    configured_at: i64,
    readable_after: impl FnOnce() -> Option<i64>,
    ttl: i64,
    now: i64,
) -> bool {
    expired(due_at, configured_at, ttl, now)
        && readable_after().is_none_or(|at| expired(due_at, configured_at.max(at), ttl, now))
}

/// When a message may be delivered: `delay` (the queue's) after it was pushed, and not
/// before its own `deliver_at`, if the producer gave one. All in microseconds.
pub fn due_at(created_at: i64, delay: i64, deliver_at: Option<i64>) -> i64 {
    let after_delay = created_at.saturating_add(delay);
    deliver_at.map_or(after_delay, |d| d.max(after_delay))
}

/// Whether `text` is an RFC 3339 timestamp with its offset: `YYYY-MM-DDTHH:MM:SS`, an
/// optional fraction, then `Z` or `±HH:MM` (a space may stand for the `T`). The form a
/// `push_batch` item's `deliverAt` takes: what JSON encoders write for a time, and what
/// `to_jsonb(timestamptz)` gives. Checked before PostgreSQL reads it, so that every other
/// text is refused with a clear error naming the item.
pub fn rfc3339(text: &str) -> bool {
    let b = text.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    if b.len() < 20 || !(digits(0..4) && b[4] == b'-' && digits(5..7) && b[7] == b'-' && digits(8..10)) {
        return false;
    }
    let time = matches!(b[10], b'T' | b't' | b' ')
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !time {
        return false;
    }
    let mut i = 19;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    match &b[i..] {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit()),
        _ => false,
    }
}

/// Checks a push's `deliver_at` against the time of the push: at most `limits::DELAY`
/// ahead (a time in the past is allowed: no wait).
pub fn check_deliver_at(deliver_at: i64, now: i64) -> Result<(), Violation> {
    if deliver_at.saturating_sub(now) <= limits::DELAY {
        return Ok(());
    }
    Err(Violation::invalid(
        "deliver_at",
        format!("{} s ahead (at most {} s)", (deliver_at - now) / MICROS, limits::DELAY / MICROS),
    ))
}

/// Checks a `retry_after` given with an ack (microseconds): 0 to `limits::RETRY_DELAY`.
pub fn check_retry_after(micros: i64) -> Result<(), Violation> {
    if (0..=limits::RETRY_DELAY).contains(&micros) {
        return Ok(());
    }
    Err(Violation::invalid(
        "retry_after",
        format!("{} s (must be 0 to {} s)", micros as f64 / MICROS as f64, limits::RETRY_DELAY / MICROS),
    ))
}

/// Limits of single calls.
pub mod limits {
    /// The longest retry pause (`retry_after`, `retry_backoff_max`): 7 days, in
    /// microseconds.
    pub const RETRY_DELAY: i64 = 7 * 24 * 3600 * crate::lease::MICROS;
    /// The longest a message may be held back: a queue's `delay`, or a push's
    /// `deliver_at` ahead of the push: 365 days, in microseconds.
    pub const DELAY: i64 = 365 * 24 * 3600 * crate::lease::MICROS;
    /// Longest message `ttl` (microseconds): 365 days.
    pub const TTL: i64 = 365 * 24 * 3600 * crate::lease::MICROS;
    /// Longest `partition_idle_ttl` (microseconds): 365 days.
    pub const IDLE_TTL: i64 = 365 * 24 * 3600 * crate::lease::MICROS;
    /// Longest `dlq_retention` (microseconds): 365 days (0 keeps dead letters for ever).
    pub const DLQ_RETENTION: i64 = 365 * 24 * 3600 * crate::lease::MICROS;
    /// Most dead letters one step of the expiry round deletes (the round takes more
    /// steps, each its own transaction, while a queue has more).
    pub const DLQ_EXPIRE_STEP: i64 = 10_000;
    /// Longest allowance of a group's budget (`configure_group`, microseconds): 365 days
    /// (a lease is cut to `queen.max_lease` anyway; the bound keeps the stored intervals,
    /// and their sum, in range for the SQL that reads them).
    pub const ALLOWANCE: i64 = 365 * 24 * 3600 * crate::lease::MICROS;
    /// Default of `queen.max_lease`: the longest lease and extension, in seconds (12 hours,
    /// as SQS's longest visibility timeout).
    pub const MAX_LEASE_DEFAULT: i32 = 12 * 3600;
    /// Most messages one pop may ask for (`batch`).
    pub const POP_BATCH: i32 = 100_000;
    /// Most lanes one pop may claim (`max_partitions`).
    pub const POP_PARTITIONS: i32 = 10_000;
    /// Longest a pop may wait for messages (`wait_ms`): five minutes.
    pub const WAIT_MS: i32 = 300_000;
    /// Payload bytes a pop returns at most unless told (`max_bytes`): 32 MiB.
    pub const POP_BYTES_DEFAULT: i64 = 32 << 20;
    /// The largest `max_bytes` a pop may ask for: 1 GiB.
    pub const POP_BYTES: i64 = 1 << 30;
    /// Most dead letters one `dlq_redrive` call re-pushes (`max_messages`).
    pub const REDRIVE_ROWS: i32 = 100_000;
    /// Most messages one peek may return (`max_messages`).
    pub const PEEK_MESSAGES: i32 = 10_000;
    /// Messages a peek returns unless told (`max_messages`).
    pub const PEEK_MESSAGES_DEFAULT: i32 = 100;
    /// Most items one ack may carry.
    pub const ACK_ITEMS: u32 = 100_000;
    /// Largest payload of one message, as jsonb: 64 MiB.
    pub const PAYLOAD_BYTES: usize = 64 << 20;
    /// Most messages one `push_batch` may carry.
    pub const BATCH_ITEMS: usize = 100_000;
    /// Most payload bytes one `push_batch` may carry: 256 MiB.
    pub const CALL_BYTES: usize = 256 << 20;
    /// Longest producer transaction id, in bytes.
    pub const TRANSACTION_ID: usize = 512;
    /// Largest headers object of one message, as jsonb: 64 KiB. Headers are metadata
    /// (tracing, routing), read by every consumer of the message: the payload is for data.
    pub const HEADERS_BYTES: usize = 64 << 10;
    /// Rows of one `queen.dlq` page: default and most.
    pub const PAGE_SIZE_DEFAULT: i32 = 100;
    pub const PAGE_SIZE: i32 = 10_000;
}

/// The arguments of one pop that have limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PopLimits {
    pub batch: i32,
    pub lease_seconds: i32,
    /// The longest lease allowed, in seconds (`queen.max_lease`).
    pub max_lease: i32,
    pub wait_ms: i32,
    pub max_partitions: i32,
    pub max_bytes: i64,
}

impl PopLimits {
    /// Checks a pop's arguments, in signature order.
    pub fn validate(&self) -> Result<(), Violation> {
        use limits::*;
        if self.batch < 1 || self.batch > POP_BATCH {
            return Err(Violation::invalid("batch", format!("{} (must be 1 to {POP_BATCH})", self.batch)));
        }
        if self.lease_seconds < 0 || self.lease_seconds > self.max_lease {
            return Err(Violation::invalid(
                "lease_seconds",
                format!("{} (must be 0 to {} seconds, queen.max_lease)", self.lease_seconds, self.max_lease),
            ));
        }
        if self.wait_ms < 0 {
            return Err(Violation::invalid("wait_ms", format!("{} (must be >= 0)", self.wait_ms)));
        }
        if self.wait_ms > WAIT_MS {
            return Err(Violation::too_big("wait_ms", format!("{} (at most {WAIT_MS})", self.wait_ms)));
        }
        check_max_bytes(self.max_bytes)?;
        if self.max_partitions < 1 || self.max_partitions > POP_PARTITIONS {
            return Err(Violation::invalid(
                "max_partitions",
                format!("{} (must be 1 to {POP_PARTITIONS})", self.max_partitions),
            ));
        }
        Ok(())
    }
}

/// Checks a read's byte budget (`max_bytes` of pop and peek): 1 byte to 1 GiB.
pub fn check_max_bytes(max_bytes: i64) -> Result<(), Violation> {
    use limits::POP_BYTES;
    if max_bytes < 1 {
        return Err(Violation::invalid("max_bytes", format!("{max_bytes} (must be >= 1)")));
    }
    if max_bytes > POP_BYTES {
        return Err(Violation::too_big("max_bytes", format!("{max_bytes} (at most {POP_BYTES})")));
    }
    Ok(())
}

/// Checks a peek's arguments (`queen.peek`): 1 to `PEEK_MESSAGES` messages, an offset of 1
/// or more, a byte budget as pop's.
pub fn check_peek(max_messages: i32, from_offset: Option<i64>, max_bytes: i64) -> Result<(), Violation> {
    use limits::PEEK_MESSAGES;
    if !(1..=PEEK_MESSAGES).contains(&max_messages) {
        return Err(Violation::invalid("max_messages", format!("{max_messages} (must be 1 to {PEEK_MESSAGES})")));
    }
    if let Some(o) = from_offset.filter(|&o| o < 1) {
        return Err(Violation::invalid("from_offset", format!("{o} (must be >= 1: offsets start at 1)")));
    }
    check_max_bytes(max_bytes)
}

/// Checks the item count of one ack.
pub fn check_ack_items(n: u32) -> Result<(), Violation> {
    if n > limits::ACK_ITEMS {
        return Err(Violation::too_big("acks", format!("{n} items (at most {} per call)", limits::ACK_ITEMS)));
    }
    Ok(())
}

/// How an argument breaks the policy; the extension maps it to its SQLSTATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViolationKind {
    /// A value the argument cannot take (22023).
    Invalid,
    /// A value past a documented limit (54000).
    TooBig,
}

/// An argument that breaks the policy, with the text of the error a user sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: ViolationKind,
    pub argument: &'static str,
    pub detail: String,
}

impl Violation {
    pub fn invalid(argument: &'static str, detail: impl Into<String>) -> Violation {
        Violation { kind: ViolationKind::Invalid, argument, detail: detail.into() }
    }

    pub fn too_big(argument: &'static str, detail: impl Into<String>) -> Violation {
        Violation { kind: ViolationKind::TooBig, argument, detail: detail.into() }
    }

    /// The error message, as queen raises it.
    pub fn message(&self) -> String {
        match self.kind {
            ViolationKind::Invalid => format!("queen: invalid {}: {}", self.argument, self.detail),
            ViolationKind::TooBig => format!("queen: {} is too large: {}", self.argument, self.detail),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_boundary() {
        assert!(!expired(100, 0, 0, i64::MAX), "ttl 0 never expires");
        assert!(!expired(100, 0, 50, 149));
        assert!(expired(100, 0, 50, 150), "the boundary is expired");
        assert!(expired(100, 0, 50, 151));
        assert!(!expired(i64::MAX - 1, 0, 50, i64::MAX - 1), "no overflow");
        // A message delayed by the ttl or more gets the ttl from its due time.
        let due = due_at(100, 50, Some(400));
        assert!(!expired(due, 0, 50, 400), "due, not expired: deliverable");
        assert!(!expired(due, 0, 50, 449));
        assert!(expired(due, 0, 50, 450));
        // Pushed at 100 with a delay of 1,000 (due at 1,100), ttl 50; at 600 the delay is
        // cut to 0: due at 100 now, yet deliverable only since 600, so it has until 650.
        let due = due_at(100, 0, None);
        assert!(!expired(due, 600, 50, 600), "not expired by the change itself");
        assert!(!expired(due, 600, 50, 649));
        assert!(expired(due, 600, 50, 650));
        // Pushed at 100, ttl 50, readable only from 2,000 on (its transaction stayed open):
        // it has until 2,050. Asked only when it would expire without it.
        let late = || Some(2_000);
        assert!(!expired_once_readable(due, 0, late, 50, 2_049));
        assert!(expired_once_readable(due, 0, late, 50, 2_050));
        assert!(expired_once_readable(due, 0, || None, 50, 150), "not late: from its push");
        assert!(!expired_once_readable(due, 0, || panic!("asked"), 50, 149), "not asked");
        assert!(!expired_once_readable(due, 600, late, 50, 2_049), "the later floor counts");
        assert!(!expired_once_readable(due, 3_000, late, 50, 3_049));
        let too_long = QueueOptions { ttl: limits::TTL + 1, ..QueueOptions::CONFIGURED };
        assert_eq!(too_long.validate(limits::MAX_LEASE_DEFAULT).unwrap_err().argument, "ttl");
        assert_eq!(
            QueueOptions { ttl: -1, ..QueueOptions::CONFIGURED }
                .validate(limits::MAX_LEASE_DEFAULT)
                .unwrap_err()
                .argument,
            "ttl"
        );
    }

    #[test]
    fn outlived_once_older_than_the_span() {
        let hour = 3600 * MICROS;
        assert!(!outlived(0, 0, i64::MAX), "0 keeps for ever");
        assert!(!outlived(1_000, hour, 1_000 + hour), "the boundary is kept");
        assert!(outlived(1_000, hour, 1_001 + hour));
        assert!(!outlived(i64::MIN, hour, i64::MIN + 5), "no overflow at the low end");
    }

    #[test]
    fn dlq_retention_is_0_to_365_days() {
        let with =
            |r| QueueOptions { dlq_retention: r, ..QueueOptions::CONFIGURED }.validate(limits::MAX_LEASE_DEFAULT);
        assert!(with(0).is_ok() && with(limits::DLQ_RETENTION).is_ok());
        assert_eq!(with(-1).unwrap_err().argument, "dlq_retention");
        assert_eq!(with(limits::DLQ_RETENTION + 1).unwrap_err().argument, "dlq_retention");
    }

    #[test]
    fn max_depth_is_at_least_one() {
        let with = |m| QueueOptions { max_depth: m, ..QueueOptions::CONFIGURED }.validate(limits::MAX_LEASE_DEFAULT);
        assert_eq!(with(Some(0)).unwrap_err().argument, "max_depth");
        assert_eq!(with(Some(-5)).unwrap_err().argument, "max_depth");
        assert!(with(Some(1)).is_ok() && with(None).is_ok());
    }

    #[test]
    fn redrive_rules() {
        assert!(!redrive_passes(None, "billing"), "an ordinary message goes to every group");
        assert!(!redrive_passes(Some("billing"), "billing"));
        assert!(redrive_passes(Some("billing"), "audit"));
        assert_eq!(check_redrive(1, "failing_group"), Ok(RedriveTo::FailingGroup));
        assert_eq!(check_redrive(limits::REDRIVE_ROWS, "all"), Ok(RedriveTo::All));
        assert_eq!(check_redrive(0, "all").unwrap_err().argument, "max_messages");
        assert_eq!(check_redrive(limits::REDRIVE_ROWS + 1, "all").unwrap_err().argument, "max_messages");
        assert_eq!(check_redrive(1, "everyone").unwrap_err().argument, "deliver_to");
        assert!(RedriveTo::FailingGroup.needs_its_group(), "a copy for a dropped group reaches no one");
        assert!(!RedriveTo::All.needs_its_group(), "every group gets the copy");
    }

    #[test]
    fn peek_limits() {
        let ok = |m, o, b| check_peek(m, o, b).is_ok();
        assert!(ok(1, None, 1) && ok(limits::PEEK_MESSAGES, Some(1), limits::POP_BYTES));
        let arg = |m, o, b| check_peek(m, o, b).unwrap_err().argument;
        assert_eq!(arg(0, None, 1), "max_messages");
        assert_eq!(arg(limits::PEEK_MESSAGES + 1, None, 1), "max_messages");
        assert_eq!(arg(1, Some(0), 1), "from_offset");
        assert_eq!(arg(1, None, 0), "max_bytes");
        assert_eq!(check_peek(1, None, limits::POP_BYTES + 1).unwrap_err().kind, ViolationKind::TooBig);
    }

    #[test]
    fn deliver_at_text_is_rfc_3339() {
        for ok in [
            "2026-12-01T10:50:00Z",
            "2026-12-01T10:50:00.123456+00:00",
            "2026-12-01 10:50:00.5-07:30",
            "2000-01-01t00:00:00z",
        ] {
            assert!(rfc3339(ok), "{ok}");
        }
        for bad in [
            "",
            "soon",
            "tomorrow",
            "infinity",
            "2026-12-01",
            "2026-12-01T10:50:00",
            "2026-12-01T10:50:00.Z",
            "2026-12-01T10:50:00+0000",
            "2026-12-01T10:50Z",
            "12026-12-01T10:50:00Z",
            "2026-12-01T10:50:00Z ",
            "2026-1x-01T10:50:00Z",
        ] {
            assert!(!rfc3339(bad), "{bad}");
        }
    }

    #[test]
    fn a_message_is_due_after_the_delay_and_its_own_time() {
        assert_eq!(due_at(100, 0, None), 100, "no delay: at once");
        assert_eq!(due_at(100, 50, None), 150);
        assert_eq!(due_at(100, 50, Some(120)), 150, "the later of the two");
        assert_eq!(due_at(100, 50, Some(900)), 900);
        assert_eq!(due_at(100, 0, Some(10)), 100, "a time in the past: at once");
        assert_eq!(due_at(i64::MAX - 1, 50, None), i64::MAX);
        assert!(check_deliver_at(limits::DELAY, 0).is_ok() && check_deliver_at(-5, 0).is_ok());
        assert_eq!(check_deliver_at(limits::DELAY + 1, 0).unwrap_err().argument, "deliver_at");
        let q = QueueOptions::CONFIGURED;
        assert!(QueueOptions { delay: limits::DELAY, ..q }.validate(limits::MAX_LEASE_DEFAULT).is_ok());
        for bad in [-1, limits::DELAY + 1] {
            assert_eq!(
                QueueOptions { delay: bad, ..q }.validate(limits::MAX_LEASE_DEFAULT).unwrap_err().argument,
                "delay"
            );
        }
    }

    #[test]
    fn retry_backoff_doubles_up_to_its_cap() {
        let q = QueueOptions { retry_backoff: 2 * MICROS, retry_backoff_max: 10 * MICROS, ..QueueOptions::CONFIGURED };
        let delays: Vec<i64> = (1..=6).map(|r| q.retry_delay(r) / MICROS).collect();
        assert_eq!(delays, vec![2, 4, 8, 10, 10, 10]);
        assert_eq!(q.retry_delay(i32::MAX), 10 * MICROS, "no overflow");
        assert_eq!(QueueOptions::CONFIGURED.retry_delay(3), 0, "off by default: redelivered at once");
        assert!(q.validate(limits::MAX_LEASE_DEFAULT).is_ok());
        for (bad, name) in [
            (QueueOptions { retry_backoff: -1, ..q }, "retry_backoff"),
            (QueueOptions { retry_backoff: limits::RETRY_DELAY + 1, ..q }, "retry_backoff"),
            (QueueOptions { retry_backoff_max: MICROS, ..q }, "retry_backoff_max"),
            (QueueOptions { retry_backoff: 0, retry_backoff_max: 0, ..q }, "retry_backoff_max"),
            (QueueOptions { retry_backoff_max: limits::RETRY_DELAY + 1, ..q }, "retry_backoff_max"),
        ] {
            assert_eq!(bad.validate(limits::MAX_LEASE_DEFAULT).unwrap_err().argument, name, "{bad:?}");
        }
        assert!(check_retry_after(0).is_ok() && check_retry_after(limits::RETRY_DELAY).is_ok());
        assert!(check_retry_after(-1).is_err() && check_retry_after(limits::RETRY_DELAY + 1).is_err());
    }

    #[test]
    fn configured_and_implicit_differ_only_in_the_lease() {
        assert_eq!(QueueOptions::CONFIGURED.lease_time, 300);
        assert_eq!(QueueOptions::IMPLICIT.lease_time, 60);
        assert_eq!(QueueOptions { lease_time: 300, ..QueueOptions::IMPLICIT }, QueueOptions::CONFIGURED);
        assert!(QueueOptions::CONFIGURED.validate(limits::MAX_LEASE_DEFAULT).is_ok());
        assert!(QueueOptions::IMPLICIT.validate(limits::MAX_LEASE_DEFAULT).is_ok());
    }

    #[test]
    fn options_out_of_range_name_their_argument() {
        let base = QueueOptions::CONFIGURED;
        let e = QueueOptions { lease_time: 0, ..base }.validate(limits::MAX_LEASE_DEFAULT).unwrap_err();
        assert_eq!((e.kind, e.argument), (ViolationKind::Invalid, "lease_time"));
        assert_eq!(e.message(), "queen: invalid lease_time: 0 (must be 1 to 43200 seconds, queen.max_lease)");
        assert!(QueueOptions { lease_time: 43_201, ..base }.validate(limits::MAX_LEASE_DEFAULT).is_err());
        assert!(QueueOptions { lease_time: 43_200, ..base }.validate(limits::MAX_LEASE_DEFAULT).is_ok());
        assert_eq!(
            QueueOptions { partition_idle_ttl: -1, ..base }.validate(limits::MAX_LEASE_DEFAULT).unwrap_err().argument,
            "partition_idle_ttl"
        );
        for (o, name) in [
            (QueueOptions { retry_limit: -1, ..base }, "retry_limit"),
            (QueueOptions { dedup_window: -1, ..base }, "dedup_window"),
            (QueueOptions { retention: -5, ..base }, "retention"),
        ] {
            assert_eq!(o.validate(limits::MAX_LEASE_DEFAULT).unwrap_err().argument, name);
        }
        // 0 is a value, not an absence: no retries, no dedup, no retention delay.
        assert!(QueueOptions { retry_limit: 0, dedup_window: 0, retention: 0, ..base }
            .validate(limits::MAX_LEASE_DEFAULT)
            .is_ok());
    }

    #[test]
    fn dead_lettering_needs_either_flag() {
        assert!(dead_lettering(true, false));
        assert!(dead_lettering(false, true));
        assert!(!dead_lettering(false, false));
        assert!(QueueOptions::CONFIGURED.dead_lettering());
    }

    #[test]
    fn lease_precedence() {
        const M: i32 = limits::MAX_LEASE_DEFAULT;
        let budget = DEFAULT_BUDGET.lease_micros();
        assert_eq!(budget, 48 * MICROS);
        assert_eq!(effective_lease_micros(2, Some(budget), Some(300), M), 2 * MICROS);
        assert_eq!(effective_lease_micros(0, Some(budget), Some(300), M), 48 * MICROS);
        assert_eq!(effective_lease_micros(0, Some(0), Some(300), M), 300 * MICROS);
        assert_eq!(
            effective_lease_micros(0, Some(1), Some(300), M),
            MIN_BUDGET_LEASE_MICROS,
            "a budget leases at least 100 ms"
        );
        assert_eq!(effective_lease_micros(0, None, Some(5), M), 5 * MICROS);
        assert_eq!(effective_lease_micros(0, None, Some(0), M), 60 * MICROS);
        assert_eq!(effective_lease_micros(0, None, None, M), 60 * MICROS);
        // queen.max_lease bounds every source of a lease.
        assert_eq!(effective_lease_micros(0, None, Some(600), 100), 100 * MICROS);
        assert_eq!(effective_lease_micros(0, Some(budget), None, 10), 10 * MICROS);
        assert!(check_extend_seconds(M, M).is_ok() && check_extend_seconds(1, M).is_ok());
        assert_eq!(check_extend_seconds(M + 1, M).unwrap_err().argument, "seconds");
        assert_eq!(check_extend_seconds(0, M).unwrap_err().argument, "seconds");
    }

    #[test]
    fn budgets_need_a_handler_and_no_negative_allowance() {
        assert!(DEFAULT_BUDGET.validate().is_ok());
        assert_eq!(Budget { handler_timeout: 0, ..DEFAULT_BUDGET }.validate().unwrap_err().argument, "handler_timeout");
        assert_eq!(Budget { record_margin: -1, ..DEFAULT_BUDGET }.validate().unwrap_err().argument, "record_margin");
        // Huge allowances (as a stand-in for "no timeout") are refused: stored, they wrapped
        // or made the budget's sum overflow in every pop of the group.
        assert_eq!(
            Budget { queue_margin: limits::ALLOWANCE + 1, ..DEFAULT_BUDGET }.validate().unwrap_err().argument,
            "queue_margin"
        );
        assert!(Budget { handler_timeout: limits::ALLOWANCE, queue_margin: limits::ALLOWANCE, ..DEFAULT_BUDGET }
            .validate()
            .is_ok());
        assert!(Budget { queue_margin: 0, timeout_grace: 0, record_margin: 0, ..DEFAULT_BUDGET }.validate().is_ok());
        // The lease the budget gives is at least 100 ms, whichever allowances make it up.
        let tiny = Budget { handler_timeout: 1, queue_margin: 0, timeout_grace: 0, record_margin: 0 };
        assert_eq!(tiny.validate().unwrap_err().argument, "handler_timeout");
        let floor = Budget {
            handler_timeout: MIN_BUDGET_LEASE_MICROS / 4,
            queue_margin: MIN_BUDGET_LEASE_MICROS / 4,
            timeout_grace: MIN_BUDGET_LEASE_MICROS / 4,
            record_margin: MIN_BUDGET_LEASE_MICROS / 4,
        };
        assert!(floor.validate().is_ok());
        assert!(Budget { record_margin: MIN_BUDGET_LEASE_MICROS / 4 - 1, ..floor }.validate().is_err());
    }

    #[test]
    fn subscriptions() {
        assert_eq!(Subscription::parse("all"), Ok(Subscription::All));
        assert_eq!(Subscription::parse("new").unwrap().as_str(), "new");
        assert_eq!(Subscription::DEFAULT.as_str(), "all");
        let e = Subscription::parse("ALL").unwrap_err();
        assert_eq!(e.message(), "queen: invalid subscription: \"ALL\" (must be 'all' or 'new')");
    }

    #[test]
    fn dedup_rules() {
        assert!(dedup_applies(1, true));
        assert!(!dedup_applies(0, true));
        assert!(!dedup_applies(3600, false));
        // Exactly one push in every run of DEDUP_PRUNE_EVERY single-offset pushes prunes.
        let due = (1..=DEDUP_PRUNE_EVERY * 3).filter(|&f| dedup_prune_due(f, 1)).count();
        assert_eq!(due, 3);
        // A batch that starts close enough past a multiple prunes; a batch of at least
        // DEDUP_PRUNE_EVERY always does.
        assert!(dedup_prune_due(70, 10));
        assert!(!dedup_prune_due(60, 10));
        assert!((0..DEDUP_PRUNE_EVERY).all(|f| dedup_prune_due(f, DEDUP_PRUNE_EVERY)));
        assert!(dedup_prune_due(0, 1));
    }

    #[test]
    fn pop_limits() {
        let ok = PopLimits {
            batch: 1,
            lease_seconds: 0,
            max_lease: limits::MAX_LEASE_DEFAULT,
            wait_ms: 0,
            max_partitions: 1,
            max_bytes: limits::POP_BYTES_DEFAULT,
        };
        assert!(ok.validate().is_ok());
        let at_most = PopLimits {
            batch: limits::POP_BATCH,
            wait_ms: limits::WAIT_MS,
            max_partitions: limits::POP_PARTITIONS,
            max_bytes: limits::POP_BYTES,
            ..ok
        };
        assert!(at_most.validate().is_ok());
        let e = PopLimits { wait_ms: limits::WAIT_MS + 1, ..ok }.validate().unwrap_err();
        assert_eq!((e.kind, e.argument), (ViolationKind::TooBig, "wait_ms"));
        assert_eq!(e.message(), "queen: wait_ms is too large: 300001 (at most 300000)");
        assert_eq!(
            PopLimits { max_bytes: limits::POP_BYTES + 1, ..ok }.validate().unwrap_err().kind,
            ViolationKind::TooBig
        );
        for (p, name) in [
            (PopLimits { batch: 0, ..ok }, "batch"),
            (PopLimits { lease_seconds: limits::MAX_LEASE_DEFAULT + 1, ..ok }, "lease_seconds"),
            (PopLimits { batch: limits::POP_BATCH + 1, ..ok }, "batch"),
            (PopLimits { lease_seconds: -1, ..ok }, "lease_seconds"),
            (PopLimits { wait_ms: -1, ..ok }, "wait_ms"),
            (PopLimits { max_partitions: 0, ..ok }, "max_partitions"),
            (PopLimits { max_bytes: 0, ..ok }, "max_bytes"),
        ] {
            let e = p.validate().unwrap_err();
            assert_eq!((e.kind, e.argument), (ViolationKind::Invalid, name), "{p:?}");
        }
        assert!(check_ack_items(limits::ACK_ITEMS).is_ok());
        assert_eq!(check_ack_items(limits::ACK_ITEMS + 1).unwrap_err().kind, ViolationKind::TooBig);
    }

    /// The defaults written in SQL (column defaults, and the wrappers' argument defaults)
    /// are this module's.
    mod sql_defaults {
        use super::super::*;

        const SCHEMA: &str = include_str!("../../sql/schema.sql");
        const API: &str = include_str!("../../sql/api.sql");
        /// `queen.pop`, `queen.peek` and `queen.get` are declared beside their C functions.
        const POP: &str = include_str!("../../src/ops/pop.rs");
        const PEEK: &str = include_str!("../../src/ops/peek.rs");

        /// The DEFAULT of `column` inside the `CREATE TABLE queen.<table>` statement.
        fn column_default(table: &str, column: &str) -> String {
            let start =
                SCHEMA.find(&format!("CREATE TABLE queen.{table} (")).unwrap_or_else(|| panic!("no table {table}"));
            let body = &SCHEMA[start..start + SCHEMA[start..].find(");").unwrap()];
            let line = body
                .lines()
                .find(|l| l.split_whitespace().next() == Some(column))
                .unwrap_or_else(|| panic!("no column {table}.{column}"));
            let after = &line[line.find("DEFAULT ").unwrap_or_else(|| panic!("{line}: no DEFAULT")) + 8..];
            after.trim_end_matches(',').split_whitespace().next().unwrap().trim_end_matches(',').to_string()
        }

        /// The DEFAULT of argument `arg` of `CREATE FUNCTION queen.<func>(`.
        fn argument_default(func: &str, arg: &str) -> String {
            let head = format!("CREATE FUNCTION queen.{func}(");
            let (text, start) = [API, POP, PEEK]
                .into_iter()
                .find_map(|t| t.find(&head).map(|at| (t, at)))
                .unwrap_or_else(|| panic!("no function {func}"));
            let sig = &text[start..start + text[start..].find(") RETURNS").unwrap()];
            let line = sig
                .lines()
                .find(|l| l.split_whitespace().next() == Some(arg))
                .unwrap_or_else(|| panic!("no argument {func}.{arg}"));
            let after = &line[line.find("DEFAULT ").unwrap_or_else(|| panic!("{line}: no DEFAULT")) + 8..];
            after.trim().trim_end_matches(',').to_string()
        }

        #[test]
        fn queues_columns_are_the_implicit_options() {
            let o = QueueOptions::IMPLICIT;
            assert_eq!(column_default("queues", "lease_time"), o.lease_time.to_string());
            assert_eq!(column_default("queues", "retry_limit"), o.retry_limit.to_string());
            assert_eq!(column_default("queues", "dead_letter_queue"), o.dead_letter_queue.to_string());
            assert_eq!(column_default("queues", "dlq_after_max_retries"), o.dlq_after_max_retries.to_string());
            assert_eq!(column_default("queues", "dedup_window"), o.dedup_window.to_string());
            assert_eq!(column_default("queues", "encryption"), o.encryption.to_string());
            assert_eq!(column_default("queues", "retention"), o.retention.to_string());
            assert_eq!(column_default("queues", "retry_backoff"), format!("'{}s'", o.retry_backoff / MICROS));
            assert_eq!(column_default("queues", "retry_backoff_max"), format!("'{}s'", o.retry_backoff_max / MICROS));
            assert_eq!(column_default("queues", "ttl"), format!("'{}s'", o.ttl / MICROS));
            assert_eq!(column_default("queues", "delay"), format!("'{}s'", o.delay / MICROS));
            assert_eq!(column_default("queues", "create_groups"), o.create_groups.to_string());
            assert_eq!(column_default("queues", "partition_idle_ttl"), format!("'{}s'", o.partition_idle_ttl / MICROS));
            assert_eq!(column_default("queues", "dlq_retention"), format!("'{}s'", o.dlq_retention / MICROS));
        }

        #[test]
        fn the_metrics_fresh_probe_floor_is_compactions_limit() {
            let floor = format!("f.first_offset > l.committed + 1 - {}", crate::compaction::FRESH_MAX);
            assert_eq!(API.matches(&floor).count(), 1, "sql/api.sql: {floor}");
        }

        #[test]
        fn groups_subscribe_to_all_by_default() {
            assert_eq!(column_default("groups", "subscription"), format!("'{}'", Subscription::DEFAULT.as_str()));
        }

        #[test]
        fn wrapper_arguments() {
            assert_eq!(argument_default("pop", "consumer_group"), format!("'{QUEUE_MODE_GROUP}'"));
            assert_eq!(argument_default("pop", "subscription"), format!("'{}'", Subscription::DEFAULT.as_str()));
            assert_eq!(argument_default("pop", "max_bytes"), limits::POP_BYTES_DEFAULT.to_string());
            assert_eq!(argument_default("dlq", "page_size"), limits::PAGE_SIZE_DEFAULT.to_string());
            assert_eq!(argument_default("peek", "max_messages"), limits::PEEK_MESSAGES_DEFAULT.to_string());
            assert_eq!(argument_default("peek", "max_bytes"), limits::POP_BYTES_DEFAULT.to_string());
        }

        #[test]
        fn status_totals_and_metrics_spell_paused_as_pop_does() {
            assert_eq!(paused_sql!("q", "gr"), "(q.paused OR coalesce(gr.paused, false))");
            assert_eq!(API.matches(paused_sql!("q", "gr")).count(), 3, "sql/api.sql: status, totals, metrics");
        }

        #[test]
        fn the_parser_reads_what_it_claims() {
            // A misspelled name must fail, not compare two empty strings.
            assert!(std::panic::catch_unwind(|| column_default("queues", "lease_tim")).is_err());
            assert!(std::panic::catch_unwind(|| argument_default("pop", "max_byte")).is_err());
        }
    }
}
