//! Interleaved slices: systems measured alone, taking turns in slices of a second.
//!
//! A single push waits for its WAL flush, and this machine's flush speed drifts by a factor
//! of two over ten seconds or so: a plain INSERT with 8 clients runs at 4,500 msg/s one
//! second and 8,800 a few seconds later. Runs of 10 s one after the other then compare
//! different disks: their per-round ratios spread from 0.5 to 1.5. Here each system keeps
//! its own clients connected, and the systems take turns in slices of about a second, the
//! order changing each round (`orders`), so every system samples the same minutes of the
//! disk. Only one system runs at any moment: each is measured alone, with all of its
//! clients.

use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use postgres::Client;

use super::{client_cpu_seconds, connect};

/// One client's work: one transaction (or call); returns the messages it moved. The
/// arguments are the client's number and its call count.
pub type Step = Arc<dyn Fn(&mut Client, usize, u64) -> usize + Send + Sync>;

/// One system's standing clients: each on its own connection, working only during the
/// slices it is given.
struct Crew {
    /// Each client's next slice: its deadline (None: end).
    slices: Vec<mpsc::Sender<Option<Instant>>>,
    /// Messages each client moved in the slice, or why it stopped.
    done: mpsc::Receiver<Result<u64, String>>,
    handles: Vec<JoinHandle<()>>,
}

impl Crew {
    fn new(dsn: &str, clients: usize, step: Step) -> Crew {
        let (done_tx, done) = mpsc::channel();
        let mut slices = Vec::new();
        let mut handles = Vec::new();
        for k in 0..clients {
            let (tx, rx) = mpsc::channel::<Option<Instant>>();
            let (dsn, step, done_tx) = (dsn.to_string(), step.clone(), done_tx.clone());
            handles.push(thread::spawn(move || {
                // A client that fails (cannot connect, or a statement errs) says so, so
                // that the coordinator stops instead of waiting for it for ever.
                let failed = |e: Box<dyn std::any::Any + Send>| {
                    e.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "a client panicked".to_string())
                };
                let mut c = std::panic::catch_unwind(|| connect(&dsn)).map_err(failed);
                let mut i = 0u64;
                while let Ok(Some(deadline)) = rx.recv() {
                    let result = match c.as_mut() {
                        Ok(client) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            let mut n = 0u64;
                            while Instant::now() < deadline {
                                n += step(client, k, i) as u64;
                                i += 1;
                            }
                            n
                        }))
                        .map_err(failed),
                        Err(why) => Err(why.clone()),
                    };
                    // After a failure the coordinator stops at this slice: nothing more to do.
                    let failed = result.is_err();
                    let _ = done_tx.send(result);
                    if failed {
                        return;
                    }
                }
            }));
            slices.push(tx);
        }
        Crew { slices, done, handles }
    }

    /// Every client works for `secs`; returns the messages moved and the wall time until
    /// the last client's last call returned.
    fn slice(&self, secs: f64) -> (u64, f64) {
        let start = Instant::now();
        let deadline = start + Duration::from_secs_f64(secs);
        for s in &self.slices {
            s.send(Some(deadline)).unwrap();
        }
        let mut n = 0;
        for _ in 0..self.slices.len() {
            match self.done.recv() {
                Ok(Ok(moved)) => n += moved,
                Ok(Err(why)) => panic!("a bench client failed: {why}"),
                Err(_) => panic!("a bench client thread ended"),
            }
        }
        (n, start.elapsed().as_secs_f64())
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        for s in &self.slices {
            let _ = s.send(None);
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// What one system did over every slice.
#[derive(Default, Clone)]
pub struct Tally {
    /// Per round: messages and seconds (the slice's wall time, plus what `after` charged).
    pub rounds: Vec<(u64, f64)>,
    /// The client's CPU seconds during the system's slices.
    pub client_cpu: f64,
    /// The slices' wall time alone (for the client's CPU share).
    pub slice_secs: f64,
    /// The seconds `after` added.
    pub charged_secs: f64,
}

impl Tally {
    /// Messages per second over every slice.
    pub fn rate(&self) -> f64 {
        let (n, s) = self.rounds.iter().fold((0u64, 0.0), |(n, s), r| (n + r.0, s + r.1));
        n as f64 / s
    }

    /// Each round's rate.
    pub fn round_rates(&self) -> Vec<f64> {
        self.rounds.iter().map(|&(n, s)| n as f64 / s).collect()
    }

    /// The ratio of this system's rate to `other`'s over every slice, with a 90 % interval:
    /// the 5th and 95th percentiles of the same ratio over 2,000 resamplings of the rounds
    /// (with replacement, a round's two slices kept together). Rounds are taken as
    /// independent; the disk's drift makes neighbouring rounds alike, so the true interval
    /// is somewhat wider.
    pub fn ratio_to(&self, other: &Tally) -> (f64, f64, f64) {
        let n = self.rounds.len().min(other.rounds.len());
        let ratio = |idx: &mut dyn Iterator<Item = usize>| {
            let (mut a, mut sa, mut b, mut sb) = (0u64, 0.0, 0u64, 0.0);
            for k in idx {
                (a, sa, b, sb) =
                    (a + self.rounds[k].0, sa + self.rounds[k].1, b + other.rounds[k].0, sb + other.rounds[k].1);
            }
            (a as f64 / sa) / (b as f64 / sb)
        };
        let whole = ratio(&mut (0..n));
        if n == 0 {
            return (whole, f64::NAN, f64::NAN);
        }
        // xorshift64*: a fixed seed, so a run's interval is reproducible from its rounds.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
        };
        let mut resampled: Vec<f64> = (0..2000).map(|_| ratio(&mut (0..n).map(|_| next()))).collect();
        resampled.sort_by(|x, y| x.partial_cmp(y).unwrap_or(std::cmp::Ordering::Equal));
        (whole, resampled[100], resampled[1899])
    }

    /// The client's CPU use during the slices, in cores.
    pub fn client_cores(&self) -> f64 {
        self.client_cpu / self.slice_secs
    }
}

/// The orders of a round, balanced for what runs just before what (a Williams design):
/// over `n` rounds (`2n` when `n` is odd) every system is in every position equally often
/// and follows every other system equally often. A slice may inherit work the slice before
/// it left (WAL still to write, say), so no system should always follow the same one.
fn orders(n: usize) -> Vec<Vec<usize>> {
    // The first row: 0, 1, n-1, 2, n-2, ...; row r adds r to each (mod n).
    let mut first = Vec::with_capacity(n);
    let (mut lo, mut hi) = (0usize, n);
    for j in 0..n {
        if j % 2 == 0 {
            first.push(lo);
            lo += 1;
        } else {
            hi -= 1;
            first.push(hi % n);
        }
    }
    let mut rows: Vec<Vec<usize>> = (0..n).map(|r| first.iter().map(|&x| (x + r) % n).collect()).collect();
    if n % 2 == 1 {
        let mirrored: Vec<Vec<usize>> = rows.iter().map(|row| row.iter().rev().copied().collect()).collect();
        rows.extend(mirrored);
    }
    rows
}

/// Runs `systems` alone in turns: one warm-up slice each (not counted), `warmed()`, then
/// `rounds` rounds of one slice of `secs` per system, in the orders of `orders`. After
/// each counted slice, `after(k)` runs and returns seconds to add to system `k`'s time (the
/// work a slice leaves behind that belongs to it).
pub fn run(
    dsn: &str,
    clients: usize,
    systems: Vec<Step>,
    secs: f64,
    rounds: usize,
    mut warmed: impl FnMut(),
    mut after: impl FnMut(usize) -> f64,
) -> Vec<Tally> {
    let crews: Vec<Crew> = systems.into_iter().map(|step| Crew::new(dsn, clients, step)).collect();
    for crew in &crews {
        crew.slice(secs.min(1.0));
    }
    warmed();
    let mut tallies = vec![Tally::default(); crews.len()];
    let orders = orders(crews.len());
    for round in 0..rounds {
        for &k in &orders[round % orders.len()] {
            let cpu0 = client_cpu_seconds();
            let (n, wall) = crews[k].slice(secs);
            tallies[k].client_cpu += client_cpu_seconds() - cpu0;
            tallies[k].slice_secs += wall;
            let charged = after(k);
            tallies[k].charged_secs += charged;
            tallies[k].rounds.push((n, wall + charged));
        }
    }
    tallies
}

#[cfg(test)]
mod tests {
    use super::orders;

    /// Every system in every position equally often, and every ordered pair of
    /// neighbours equally often.
    #[test]
    fn orders_are_balanced() {
        for n in 2..=7 {
            let rows = orders(n);
            let mut position = vec![vec![0; n]; n];
            let mut follows = vec![vec![0; n]; n];
            for row in &rows {
                let mut sorted = row.clone();
                sorted.sort();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n = {n}: {row:?} is not a permutation");
                for (j, &k) in row.iter().enumerate() {
                    position[k][j] += 1;
                }
                for w in row.windows(2) {
                    follows[w[0]][w[1]] += 1;
                }
            }
            let per = rows.len() / n;
            assert!(position.iter().flatten().all(|&c| c == per), "n = {n}: positions {position:?}");
            // rows * (n - 1) neighbour pairs over n * (n - 1) ordered pairs.
            for (a, row) in follows.iter().enumerate() {
                for (b, &c) in row.iter().enumerate() {
                    if a != b {
                        assert_eq!(c, per, "n = {n}: {a} -> {b}");
                    }
                }
            }
        }
    }
}
