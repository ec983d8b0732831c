//! Compaction: which small segments to merge.
//!
//! A push of a few messages to a partition writes a small segment of its own to the fresh
//! tier (`queen.fresh_segments`), so single-message producers do not contend on anything.
//! Compaction merges runs of those small segments into one segment of the durable tier
//! (`queen.segments`), in one transaction: readers see either the small segments or the
//! merged one, and every offset holds what it held (gaps stay gaps). Once the fresh tier is
//! empty, VACUUM can hand its pages back.
//!
//! `plan` takes a partition's segments of both tiers in offset order and picks the runs.

/// A push of fewer offsets than this to one partition writes its segment to the fresh tier;
/// a larger one writes a durable segment directly.
pub const FRESH_MAX: usize = 64;

/// Limits of a compaction pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most offsets (messages and gaps) in one merged segment.
    pub max_entries: i64,
    /// A run with fewer offsets than this waits for more, unless it is old (`linger`).
    pub min_entries: i64,
    /// Microseconds after which a short run is merged anyway, so the fresh tier empties.
    pub linger_micros: i64,
}

pub const LIMITS: Limits = Limits { max_entries: 4096, min_entries: 256, linger_micros: 10_000_000 };

/// A segment's place, as compaction sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// In the fresh tier (else durable, which compaction never rewrites).
    pub fresh: bool,
    pub first: i64,
    pub last: i64,
    /// When it was written (microseconds).
    pub created_at: i64,
}

/// Picks runs of consecutive fresh segments to merge, as index ranges into `segs` (which
/// must be sorted by offset and not overlap). A run:
/// - holds fresh segments only: a durable segment between two fresh ones splits them (the
///   merged segment must not cover the durable one's offsets);
/// - ends at or below `readable`: every offset in it is decided, so an offset missing
///   between two of its segments is a gap for ever, not a push still in flight;
/// - spans at most `max_entries` offsets;
/// - is long enough (`min_entries`), or its newest segment is older than `linger`.
pub fn plan(segs: &[Seg], readable: i64, now: i64, limits: Limits) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < segs.len() {
        if !segs[i].fresh || segs[i].last > readable {
            i += 1;
            continue;
        }
        let start = i;
        let mut newest = segs[i].created_at;
        let mut j = i + 1;
        while j < segs.len()
            && segs[j].fresh
            && segs[j].last <= readable
            && segs[j].last - segs[start].first < limits.max_entries
        {
            newest = newest.max(segs[j].created_at);
            j += 1;
        }
        let span = segs[j - 1].last - segs[start].first + 1;
        if span >= limits.min_entries || now.saturating_sub(newest) >= limits.linger_micros {
            runs.push(start..j);
        }
        i = j;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const L: Limits = Limits { max_entries: 10, min_entries: 4, linger_micros: 100 };

    fn fresh(first: i64, last: i64, t: i64) -> Seg {
        Seg { fresh: true, first, last, created_at: t }
    }
    fn durable(first: i64, last: i64) -> Seg {
        Seg { fresh: false, first, last, created_at: 0 }
    }

    #[test]
    fn runs_split_at_durable_segments_and_stop_at_readable() {
        let segs =
            [fresh(1, 1, 0), fresh(2, 3, 0), fresh(5, 6, 0), durable(7, 100), fresh(101, 104, 0), fresh(105, 105, 0)];
        assert_eq!(plan(&segs, 1000, 0, L), vec![0..3, 4..6]);
        // Offset 105 is not decided yet (readable 104): the run stops before it.
        assert_eq!(plan(&segs, 104, 0, L), vec![0..3, 4..5]);
    }

    #[test]
    fn short_runs_wait_unless_old() {
        let segs = [fresh(1, 1, 50), fresh(2, 2, 60)];
        assert!(plan(&segs, 10, 100, L).is_empty(), "2 offsets, newest 40 us old");
        assert_eq!(plan(&segs, 10, 160, L), vec![0..2]);
    }

    #[test]
    fn long_runs_are_cut_at_max_entries() {
        let segs: Vec<Seg> = (1..=25).map(|o| fresh(o, o, 0)).collect();
        assert_eq!(plan(&segs, 25, 0, L), vec![0..10, 10..20, 20..25]);
    }

    proptest! {
        #[test]
        fn prop_runs_are_safe(spec in proptest::collection::vec((any::<bool>(), 1i64..4, 0i64..3, 0i64..200), 0..60),
                              readable in 0i64..150, now in 0i64..400) {
            let mut segs = Vec::new();
            let mut next = 1;
            for (is_fresh, len, gap, t) in spec {
                next += gap;
                segs.push(Seg { fresh: is_fresh, first: next, last: next + len - 1, created_at: t });
                next += len;
            }
            let runs = plan(&segs, readable, now, L);
            let mut prev_end = 0;
            for r in &runs {
                prop_assert!(r.start >= prev_end && r.start < r.end);
                prev_end = r.end;
                for s in &segs[r.clone()] {
                    prop_assert!(s.fresh);
                    prop_assert!(s.last <= readable);
                }
                let span = segs[r.end - 1].last - segs[r.start].first + 1;
                prop_assert!(span <= L.max_entries || r.len() == 1);
                let newest = segs[r.clone()].iter().map(|s| s.created_at).max().unwrap();
                prop_assert!(span >= L.min_entries || now - newest >= L.linger_micros);
            }
        }
    }
}
