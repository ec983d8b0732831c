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
//! `covers` tells a reader when the fresh tier alone holds what it reads. A
//! run is bounded in offsets and in stored bytes, so the merge (which streams the run into
//! one segment, `segment::Encoder`) holds at most about `max_bytes` of output.

/// A push of fewer offsets than this to one partition writes its segment to the fresh tier;
/// a larger one writes a durable segment directly.
pub const FRESH_MAX: usize = 64;

/// Limits of a compaction pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most offsets (messages and gaps) in one merged segment.
    pub max_entries: i64,
    /// Most stored bytes of the small segments merged into one (a single segment larger
    /// than this is a run of its own).
    pub max_bytes: i64,
    /// A run with fewer offsets than this waits for more, unless it holds `min_bytes` or is
    /// old (`linger`).
    pub min_entries: i64,
    /// A run holding this many stored bytes is long enough, whatever its offsets.
    pub min_bytes: i64,
    /// Microseconds after which a short run is merged anyway, so the fresh tier empties.
    pub linger_micros: i64,
}

pub const LIMITS: Limits =
    Limits { max_entries: 4096, max_bytes: 8 << 20, min_entries: 256, min_bytes: 1 << 20, linger_micros: 10_000_000 };

/// A segment's place, as compaction sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// In the fresh tier (else durable, which compaction never rewrites).
    pub fresh: bool,
    pub first: i64,
    pub last: i64,
    /// When it was written (microseconds).
    pub created_at: i64,
    /// Its stored size in bytes.
    pub bytes: i64,
}

/// Picks runs of consecutive fresh segments to merge, as index ranges into `segs` (which
/// must be sorted by offset and not overlap). A run:
/// - holds fresh segments only: a durable segment between two fresh ones splits them (the
///   merged segment must not cover the durable one's offsets);
/// - ends at or below `readable`: every offset in it is decided, so an offset missing
///   between two of its segments is a gap for ever, not a push still in flight;
/// - spans at most `max_entries` offsets;
/// - holds at most `max_bytes` stored bytes, unless it is one segment larger than that;
/// - is long enough (`min_entries` offsets or `min_bytes` bytes), or its newest segment is
///   older than `linger`.
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
        let mut bytes = segs[i].bytes;
        let mut j = i + 1;
        while j < segs.len()
            && segs[j].fresh
            && segs[j].last <= readable
            && segs[j].last - segs[start].first < limits.max_entries
            && bytes.saturating_add(segs[j].bytes) <= limits.max_bytes
        {
            newest = newest.max(segs[j].created_at);
            bytes = bytes.saturating_add(segs[j].bytes);
            j += 1;
        }
        let span = segs[j - 1].last - segs[start].first + 1;
        if span >= limits.min_entries || bytes >= limits.min_bytes || now.saturating_sub(newest) >= limits.linger_micros
        {
            runs.push(start..j);
        }
        i = j;
    }
    runs
}

/// Whether the segments `spans` of one tier, each as (first offset, last offset) and given
/// in any order (sorted here, in place), hold every offset of `lo..=hi` between them. A
/// read that finds the fresh tier covering its span under one snapshot needs nothing of
/// the durable tier: a compaction moves a run from one tier to the other in one
/// transaction, so a snapshot never sees an offset in both, and a durable segment written
/// by a large push never overlaps another segment.
pub fn covers(spans: &mut [(i64, i64)], lo: i64, hi: i64) -> bool {
    spans.sort_unstable_by_key(|s| s.0);
    let mut next = lo; // the first offset not covered yet
    for &(first, last) in spans.iter() {
        if next > hi {
            break;
        }
        if first > next {
            return false; // `next` is in no segment
        }
        next = next.max(last.saturating_add(1));
    }
    next > hi
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const L: Limits = Limits { max_entries: 10, max_bytes: 1000, min_entries: 4, min_bytes: 600, linger_micros: 100 };

    fn fresh(first: i64, last: i64, t: i64) -> Seg {
        Seg { fresh: true, first, last, created_at: t, bytes: 10 }
    }
    fn sized(first: i64, last: i64, t: i64, bytes: i64) -> Seg {
        Seg { bytes, ..fresh(first, last, t) }
    }
    fn durable(first: i64, last: i64) -> Seg {
        Seg { fresh: false, first, last, created_at: 0, bytes: 0 }
    }

    #[test]
    fn covers_needs_every_offset_of_the_span() {
        assert!(covers(&mut [(5, 9), (1, 4)], 2, 9));
        assert!(covers(&mut [(1, 20)], 5, 6));
        assert!(!covers(&mut [(1, 4), (6, 9)], 2, 9), "5 is in neither");
        assert!(!covers(&mut [(3, 9)], 2, 9), "the segment holding 2 is missing");
        assert!(!covers(&mut [(1, 8)], 2, 9), "9 is past the last");
        assert!(!covers(&mut [], 2, 9));
        assert!(covers(&mut [(1, 3), (2, 2), (4, 4)], 1, 4), "nested and adjacent");
    }

    proptest! {
        #[test]
        fn covers_is_every_offset_in_some_segment(
            spans in proptest::collection::vec((0i64..40, 0i64..6), 0..8),
            lo in 0i64..40,
            len in 0i64..12,
        ) {
            let mut spans: Vec<(i64, i64)> = spans.into_iter().map(|(f, n)| (f, f + n)).collect();
            let hi = lo + len;
            let every = (lo..=hi).all(|o| spans.iter().any(|&(f, l)| f <= o && o <= l));
            prop_assert_eq!(covers(&mut spans, lo, hi), every);
        }
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

    #[test]
    fn runs_are_cut_at_max_bytes() {
        // 300 bytes each: three fit in 1000, a fourth would not.
        let segs: Vec<Seg> = (1..=8).map(|o| sized(o, o, 0, 300)).collect();
        // Three offsets but 900 bytes: long enough (min_bytes); the last two (600) too.
        assert_eq!(plan(&segs, 8, 0, L), vec![0..3, 3..6, 6..8]);
        // Exactly max_bytes still fits.
        let segs = [sized(1, 1, 0, 500), sized(2, 2, 0, 500), sized(3, 3, 0, 1)];
        assert_eq!(plan(&segs, 3, 0, L), vec![0..2]);
    }

    #[test]
    fn a_segment_larger_than_max_bytes_is_a_run_of_its_own() {
        let segs = [sized(1, 1, 0, 10), sized(2, 2, 0, 5000), sized(3, 3, 0, 0), sized(4, 4, 0, 10)];
        // The small first one is short and young: it waits; the big one goes alone (even a
        // segment of no bytes does not join it).
        assert_eq!(plan(&segs, 4, 0, L), vec![1..2]);
        assert_eq!(plan(&segs, 4, 1000, L), vec![0..1, 1..2, 2..4]);
    }

    #[test]
    fn small_runs_wait_for_bytes_or_offsets() {
        let segs = [sized(1, 1, 0, 200), sized(2, 2, 0, 200)];
        assert!(plan(&segs, 2, 0, L).is_empty(), "400 bytes, 2 offsets, young");
        let segs = [sized(1, 1, 0, 300), sized(2, 2, 0, 300)];
        assert_eq!(plan(&segs, 2, 0, L), vec![0..2], "600 bytes: long enough");
    }

    proptest! {
        #[test]
        fn prop_runs_are_safe(spec in proptest::collection::vec((any::<bool>(), 1i64..4, 0i64..3, 0i64..200, 0i64..1500), 0..60),
                              readable in 0i64..150, now in 0i64..400) {
            let mut segs = Vec::new();
            let mut next = 1;
            for (is_fresh, len, gap, t, bytes) in spec {
                next += gap;
                segs.push(Seg { fresh: is_fresh, first: next, last: next + len - 1, created_at: t, bytes });
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
                let bytes: i64 = segs[r.clone()].iter().map(|s| s.bytes).sum();
                prop_assert!(bytes <= L.max_bytes || r.len() == 1, "{} bytes in a run of {}", bytes, r.len());
                let newest = segs[r.clone()].iter().map(|s| s.created_at).max().unwrap();
                prop_assert!(span >= L.min_entries || bytes >= L.min_bytes || now - newest >= L.linger_micros);
            }
            // A run is as long as the limits allow: the segment after it could not join it.
            for r in &runs {
                if let Some(s) = segs.get(r.end) {
                    let bytes: i64 = segs[r.clone()].iter().map(|s| s.bytes).sum();
                    prop_assert!(!s.fresh || s.last > readable
                        || s.last - segs[r.start].first >= L.max_entries
                        || bytes + s.bytes > L.max_bytes);
                }
            }
        }
    }
}
