//! Producer deduplication within one push call: which items of a partition are stored,
//! which repeat an id the partition already holds within its dedup window, and which
//! repeat an earlier item of the same call. (Whether a queue deduplicates at all, and
//! how long ids are kept, is `policy`'s.)

/// How the items of one partition in one call are classified, by their position in the
/// input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified<T> {
    /// Items to store, in input order: each gets the next offset.
    pub store: Vec<usize>,
    /// Items whose id the partition already holds: (item, what the original was).
    pub known: Vec<(usize, T)>,
    /// Items whose id an earlier stored item of this call carries: (item, the original's
    /// position in `store`).
    pub repeats: Vec<(usize, usize)>,
}

/// Classifies items by their producer transaction ids (`None`: the item has none, and is
/// always stored). With `dedup` false every item is stored. `known` answers whether the
/// partition already holds an id within its window.
pub fn classify<T>(ids: &[Option<&str>], dedup: bool, mut known: impl FnMut(&str) -> Option<T>) -> Classified<T> {
    let mut out = Classified { store: Vec::with_capacity(ids.len()), known: Vec::new(), repeats: Vec::new() };
    let mut in_call: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, id) in ids.iter().enumerate() {
        if let (true, Some(tx)) = (dedup, id) {
            if let Some(original) = known(tx) {
                out.known.push((i, original));
                continue;
            }
            if let Some(&pos) = in_call.get(tx) {
                out.repeats.push((i, pos));
                continue;
            }
            in_call.insert(tx, out.store.len());
        }
        out.store.push(i);
    }
    out
}

/// The dedup window: an id recorded at `created_at` (microseconds) still counts at `now`
/// while it is younger than `window_seconds`. At exactly the window's end it has expired.
/// The one home of this rule: its SQL forms (`dedup_live_sql!`, `dedup_expired_sql!`) are
/// pinned to it by a test, and they are the only ones in queen's SQL.
pub fn dedup_live(created_at: i64, now: i64, window_seconds: i64) -> bool {
    created_at > now.saturating_sub(window_seconds.saturating_mul(1_000_000))
}

/// The SQL form of `dedup_live` over a `queen.dedup` row aliased `$entry`, with `$window`
/// the window in seconds (a column or a placeholder): a string literal, for `concat!`.
/// Judged by `now()`, the transaction's start: a push and the expiry step see one window
/// for their whole transaction.
#[macro_export]
macro_rules! dedup_live_sql {
    ($entry:literal, $window:literal) => {
        concat!("(", $entry, ".created_at > now() - make_interval(secs => ", $window, "))")
    };
}

/// The negation of `dedup_live_sql!`: the entry has expired, and may be replaced or
/// deleted.
#[macro_export]
macro_rules! dedup_expired_sql {
    ($entry:literal, $window:literal) => {
        concat!("(", $entry, ".created_at <= now() - make_interval(secs => ", $window, "))")
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_window_and_its_sql_forms_agree() {
        let second = 1_000_000;
        assert!(super::dedup_live(10 * second + 1, 20 * second, 10));
        assert!(!super::dedup_live(10 * second, 20 * second, 10), "at the window's end it has expired");
        assert!(!super::dedup_live(0, 20 * second, 10));
        // The SQL forms: `>` for live, its complement `<=` for expired, over the same bound.
        assert_eq!(dedup_live_sql!("d", "$3"), "(d.created_at > now() - make_interval(secs => $3))");
        assert_eq!(
            dedup_expired_sql!("d", "q.dedup_window"),
            "(d.created_at <= now() - make_interval(secs => q.dedup_window))"
        );
    }

    #[test]
    fn known_ids_repeats_and_items_without_ids() {
        let ids = [Some("a"), None, Some("b"), Some("a"), None, Some("old"), Some("b")];
        let c = classify(&ids, true, |tx| (tx == "old").then_some(42));
        assert_eq!(c.store, vec![0, 1, 2, 4]);
        assert_eq!(c.known, vec![(5, 42)]);
        assert_eq!(c.repeats, vec![(3, 0), (6, 2)]);
    }

    #[test]
    fn without_dedup_everything_is_stored() {
        let ids = [Some("a"), Some("a"), None];
        let c = classify(&ids, false, |_| Some(1));
        assert_eq!(c.store, vec![0, 1, 2]);
        assert!(c.known.is_empty() && c.repeats.is_empty());
    }

    proptest! {
        /// Every item lands in exactly one class; stored ids are distinct and unknown; a
        /// repeat points at a stored item with its id, placed before it.
        #[test]
        fn a_partition_of_the_items(raw in proptest::collection::vec(proptest::option::of(0u8..6), 0..40),
                                    known_set in proptest::collection::vec(0u8..6, 0..3)) {
            let names: Vec<Option<String>> = raw.iter().map(|o| o.map(|n| format!("t{n}"))).collect();
            let ids: Vec<Option<&str>> = names.iter().map(|o| o.as_deref()).collect();
            let known_names: Vec<String> = known_set.iter().map(|n| format!("t{n}")).collect();
            let c = classify(&ids, true, |tx| known_names.iter().position(|k| k == tx));
            let mut seen = vec![0; ids.len()];
            for &i in &c.store { seen[i] += 1; }
            for &(i, _) in &c.known { seen[i] += 1; }
            for &(i, _) in &c.repeats { seen[i] += 1; }
            prop_assert!(seen.iter().all(|&n| n == 1));
            let stored: Vec<&str> = c.store.iter().filter_map(|&i| ids[i]).collect();
            let mut distinct = stored.clone();
            distinct.sort();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), stored.len());
            prop_assert!(stored.iter().all(|s| !known_names.iter().any(|k| k == s)));
            for &(i, pos) in &c.repeats {
                prop_assert_eq!(ids[i], ids[c.store[pos]]);
                prop_assert!(c.store[pos] < i);
            }
            prop_assert!(c.store.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
