//! The addresses of dead-letter rows that are not one message: a span of offsets a group
//! passed without delivery (`purged F..L` from `queen.purge`, `skipped F..L` from a skip
//! group) and a damaged segment (`corrupt segment F..L`). `dlq_replay` and `dlq_delete`
//! find a dead letter by `(partition_id, transaction_id)`, so a producer's transaction id
//! must never take one of these forms: a push refuses one (`is_span_address`), else
//! `dlq_delete` of a span could remove a message's dead letter in its place.

/// What a dead-letter row that is not one message stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// Offsets `queen.purge` moved a group past.
    Purged,
    /// Offsets a `skip` group passed over past its `max_lag`.
    Skipped,
    /// A segment that fails its checks, filed whole.
    CorruptSegment,
}

impl SpanKind {
    pub const ALL: [SpanKind; 3] = [SpanKind::Purged, SpanKind::Skipped, SpanKind::CorruptSegment];

    /// How its address starts.
    pub fn prefix(self) -> &'static str {
        match self {
            SpanKind::Purged => "purged",
            SpanKind::Skipped => "skipped",
            SpanKind::CorruptSegment => "corrupt segment",
        }
    }

    /// Its row's `reason` in `queen.log_dlq`.
    pub fn reason(self) -> &'static str {
        match self {
            SpanKind::Purged => "purged",
            SpanKind::Skipped => "skipped",
            SpanKind::CorruptSegment => "unreadable",
        }
    }
}

/// The address of a row of `kind` covering offsets `from..=to`.
pub fn span_address(kind: SpanKind, from: i64, to: i64) -> String {
    format!("{} {from}..{to}", kind.prefix())
}

/// The forms of `span_address`, for messages: `purged|skipped|corrupt segment F..L`.
pub fn span_forms() -> String {
    let kinds: Vec<&str> = SpanKind::ALL.iter().map(|k| k.prefix()).collect();
    format!("{} F..L", kinds.join("|"))
}

/// Whether `tx` has the form of a span's or a damaged segment's address: a kind's prefix,
/// a space, an integer, `..`, an integer (digits, a leading minus allowed).
pub fn is_span_address(tx: &str) -> bool {
    SpanKind::ALL.iter().any(|kind| {
        tx.strip_prefix(kind.prefix())
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|rest| rest.split_once(".."))
            .is_some_and(|(a, b)| is_integer(a) && is_integer(b))
    })
}

/// Digits, with a leading minus allowed: an integer as `i64`'s `Display` writes it.
pub fn is_integer(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_address_queen_writes_is_recognised_and_ordinary_ids_are_not() {
        for kind in SpanKind::ALL {
            for (from, to) in [(1, 1), (7, 1_000_000), (0, (1 << 62) - 1)] {
                assert!(is_span_address(&span_address(kind, from, to)), "{kind:?} {from}..{to}");
            }
        }
        for free in [
            "order-7",
            "purged",
            "purged 1",
            "purged 1..",
            "purged ..2",
            "purged 1..2 ",
            " purged 1..2",
            "purged  1..2",
            "purged 1...2",
            "purged a..2",
            "Purged 1..2",
            "skipped1..2",
            "corrupt 1..2",
            "corrupt segment 1..2x",
            "0196f3a2-7c1e-7000-8000-000000000000",
        ] {
            assert!(!is_span_address(free), "{free:?}");
        }
        assert_eq!(span_forms(), "purged|skipped|corrupt segment F..L");
    }
}
