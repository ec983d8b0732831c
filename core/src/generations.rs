//! Segment generations: how the segment tables give their space back while a snapshot
//! holds the xmin horizon.
//!
//! A deleted row's space comes back only once VACUUM may remove it, and a transaction that
//! holds an old snapshot (a long report, a session idle in transaction, a replica with
//! `hot_standby_feedback`) keeps every row deleted after it began. Retention's `DELETE`s
//! then free nothing, and the segment tables grow by all that is pushed while the snapshot
//! stands. `TRUNCATE` frees a table's files whatever any snapshot sees, as PgQ's rotated
//! event tables do.
//!
//! So both segment tiers are split into `GENERATIONS` tables, one per generation. Writes
//! go to the *current* generation. A rotation takes the *oldest* one (the next after the
//! current, round-robin), copies the rows still in it (those retention has not deleted:
//! unconsumed, inside the retention window, or of a queue that keeps everything) into the
//! current one, empties it with `TRUNCATE`, and makes it current. A row that is copied
//! keeps its offsets and bytes, so readers see the same messages before and after.
//!
//! Which generation a row is in never decides what it holds, only when its space comes
//! back: a push that writes to a generation that is no longer current is still correct.
//!
//! `rotation_due` decides whether a rotation is worth it, from the sizes measured.

/// How many generations each segment tier has. Two suffice: the rows of the oldest one are
/// copied forward, never dropped, so no reader depends on a third to keep them while a
/// rotation runs.
pub const GENERATIONS: i16 = 2;

/// The default of `queen.rotation_min_size`: a rotation is not worth its exclusive lock until
/// the current generation holds at least this many bytes (tables, TOAST and indexes); below
/// that, what it frees is small.
pub const MIN_ROTATE_BYTES: i64 = 1 << 20;

/// A rotation copies the oldest generation's live rows. It goes ahead only when they are at
/// most this fraction (1 / `LIVE_SHARE_DIVISOR`) of the generation's size, so that what
/// truncation frees outweighs what the copy writes.
pub const LIVE_SHARE_DIVISOR: i64 = 4;

/// What one segment row costs on disk beyond its data: tuple header, line pointer, the
/// other columns, the TOAST pointer and its primary-key index entry (roughly). Counted in
/// a generation's live size, so that many small rows are not taken for little to copy.
pub const ROW_OVERHEAD_BYTES: i64 = 128;

/// The live size of a generation holding `rows` segment rows with `data_bytes` of data.
pub fn live_bytes(rows: i64, data_bytes: i64) -> i64 {
    rows.max(0).saturating_mul(ROW_OVERHEAD_BYTES).saturating_add(data_bytes.max(0))
}

/// The generation after `g` (the oldest one, when `g` is current).
pub fn next(g: i16) -> i16 {
    (g.rem_euclid(GENERATIONS) + 1) % GENERATIONS
}

/// What a rotation would work on, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// On-disk size of the current generation's tables (both tiers, TOAST and indexes).
    pub current: i64,
    /// On-disk size of the oldest generation's tables.
    pub oldest: i64,
    /// Bytes still live in the oldest generation (`live_bytes`): what a rotation copies.
    pub oldest_live: i64,
}

/// Whether to rotate now: the current generation holds at least `min_bytes` (a negative
/// `min_bytes` turns rotation off), and the oldest one is mostly space to free (or empty:
/// then the rotation only moves on).
pub fn rotation_due(s: Sizes, min_bytes: i64) -> bool {
    min_bytes >= 0
        && s.current >= min_bytes
        && s.oldest_live.max(0).saturating_mul(LIVE_SHARE_DIVISOR) <= s.oldest.max(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn next_goes_round() {
        assert_eq!(next(0), 1);
        assert_eq!(next(1), 0);
        assert_eq!(next(next(0)), 0);
    }

    #[test]
    fn small_rows_count_their_overhead() {
        assert_eq!(live_bytes(0, 0), 0);
        assert_eq!(live_bytes(10, 50), 10 * ROW_OVERHEAD_BYTES + 50);
        // 1,000 rows of 10 bytes in a 200 kB generation: not a small share to copy.
        let s = Sizes { current: MIN_ROTATE_BYTES, oldest: 200_000, oldest_live: live_bytes(1000, 10_000) };
        assert!(!rotation_due(s, MIN_ROTATE_BYTES));
    }

    #[test]
    fn nothing_written_means_no_rotation() {
        assert!(!rotation_due(Sizes { current: 0, oldest: 0, oldest_live: 0 }, MIN_ROTATE_BYTES));
        assert!(!rotation_due(
            Sizes { current: MIN_ROTATE_BYTES - 1, oldest: 1 << 30, oldest_live: 0 },
            MIN_ROTATE_BYTES
        ));
        // With no minimum, an empty current generation may rotate too.
        assert!(rotation_due(Sizes { current: 0, oldest: 0, oldest_live: 0 }, 0));
    }

    #[test]
    fn a_negative_minimum_turns_rotation_off() {
        assert!(!rotation_due(Sizes { current: 1 << 40, oldest: 1 << 40, oldest_live: 0 }, -1));
    }

    #[test]
    fn an_empty_oldest_generation_moves_on() {
        assert!(rotation_due(Sizes { current: MIN_ROTATE_BYTES, oldest: 0, oldest_live: 0 }, MIN_ROTATE_BYTES));
    }

    #[test]
    fn mostly_dead_rotates_mostly_live_does_not() {
        let current = 10 * MIN_ROTATE_BYTES;
        let due = |oldest, oldest_live| rotation_due(Sizes { current, oldest, oldest_live }, MIN_ROTATE_BYTES);
        assert!(due(1000, 250));
        assert!(!due(1000, 251));
        // A queue that keeps everything: its oldest generation is all live, and stays put.
        assert!(!due(1000, 1000));
    }

    proptest! {
        #[test]
        fn next_stays_in_range_and_visits_every_generation(g in any::<i16>()) {
            let n = next(g);
            prop_assert!((0..GENERATIONS).contains(&n));
            let mut seen = vec![false; GENERATIONS as usize];
            let mut x = n;
            for _ in 0..GENERATIONS {
                seen[x as usize] = true;
                x = next(x);
            }
            prop_assert!(seen.iter().all(|&s| s));
            prop_assert_eq!(x, n);
        }

        #[test]
        fn the_copy_never_outweighs_the_space_freed(current in 0i64..1 << 40, oldest in 0i64..1 << 40,
                                                    live in 0i64..1 << 40, min in -1i64..1 << 30) {
            let due = rotation_due(Sizes { current, oldest, oldest_live: live }, min);
            if due {
                prop_assert!(min >= 0 && current >= min);
                prop_assert!(live * LIVE_SHARE_DIVISOR <= oldest);
            } else {
                prop_assert!(min < 0 || current < min || live * LIVE_SHARE_DIVISOR > oldest);
            }
        }
    }
}
