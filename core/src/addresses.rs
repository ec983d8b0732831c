//! The addresses of dead-letter rows that are not one message: a span of offsets a group
//! passed without delivery (`purged F..L` from `queen.purge`, `skipped F..L` from a skip
//! group) and a damaged segment (`corrupt segment F..L`). `dlq_replay` and `dlq_delete`
//! find a dead letter by `(partition_id, transaction_id)`, so a producer's transaction id
//! must never take one of these forms: a push refuses it (`transaction_id_is_free`), else
//! `dlq_delete` of a span could remove a message's dead letter in its place.

/// The kinds of such rows, as their addresses start.
pub const KINDS: [&str; 3] = ["purged", "skipped", "corrupt segment"];

/// The address of a row of `kind` (one of `KINDS`) covering offsets `from..=to`.
pub fn span_address(kind: &str, from: i64, to: i64) -> String {
    debug_assert!(KINDS.contains(&kind));
    format!("{kind} {from}..{to}")
}

/// Whether `tx` has the form of a span's or a damaged segment's address: a kind, a space,
/// digits, `..`, digits (a leading minus allowed on either number).
pub fn is_span_address(tx: &str) -> bool {
    KINDS.iter().any(|kind| {
        tx.strip_prefix(kind)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|rest| rest.split_once(".."))
            .is_some_and(|(a, b)| {
                let number = |s: &str| {
                    let digits = s.strip_prefix('-').unwrap_or(s);
                    !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit())
                };
                number(a) && number(b)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_address_queen_writes_is_recognised_and_ordinary_ids_are_not() {
        for kind in KINDS {
            for (from, to) in [(1, 1), (7, 1_000_000), (0, (1 << 62) - 1)] {
                assert!(is_span_address(&span_address(kind, from, to)), "{kind} {from}..{to}");
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
    }
}
