//! Fail points for the tests (cargo feature `failpoints`, which `make install-debug`
//! turns on and release builds leave off).
//!
//! `SET queen.failpoint = 'lanes.set'` (superuser) makes the next pass through that fail
//! point panic in this process, as a bug there would; `'lanes.set:3'` makes the next three
//! panic. The names are `queen_core::fail::POINTS` (inside the registries' updates) and
//! `POINTS` below (the transaction callbacks' registry work). The background worker reads
//! the setting too, from the configuration file (`ALTER SYSTEM`, then a reload).
//!
//! A fail point inside a registry update shows that the update is undone whole; one in a
//! transaction callback shows that the callback does not raise (an ERROR there would be a
//! PANIC after a commit) and that the work it could not do is done later.

/// The extension's own fail points (the tests read this list): the registry work of the transaction callbacks, and
/// one step of two maintenance passes (to show that a failing step stops nothing else).
#[allow(dead_code)] // read by the tests, as text (tests/src/harness.rs; tests/tests/failpoints.rs fires each)
pub const POINTS: &[&str] = &[
    "xact.commit.lanes",
    "xact.abort.lanes",
    "xact.subabort.lanes",
    "xact.commit.offsets",
    "xact.abort.offsets",
    "xact.subabort.offsets",
    "compaction.partition",
    "retention.queue",
];

#[cfg(feature = "failpoints")]
mod armed {
    use std::cell::RefCell;

    use crate::pg::settings;

    thread_local! {
        /// The setting last seen, and how many more passes of its point panic.
        static STATE: RefCell<(String, u32)> = const { RefCell::new((String::new(), 0)) };
    }

    pub fn init() {
        queen_core::fail::install(hook);
    }

    fn hook(name: &'static str) -> bool {
        let spec = settings::failpoint();
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            if s.0 != spec {
                // A new setting arms its point afresh.
                let count = spec.rsplit_once(':').and_then(|(_, n)| n.parse().ok()).unwrap_or(1);
                *s = (spec.clone(), count);
            }
            let point = spec.rsplit_once(':').map_or(spec.as_str(), |(p, _)| p);
            if point == name && s.1 > 0 {
                s.1 -= 1;
                return true;
            }
            false
        })
    }
}

/// Called from `_PG_init`: installs the hook (feature `failpoints` only; the setting is
/// `queen.failpoint`, in `settings`).
pub fn init() {
    #[cfg(feature = "failpoints")]
    armed::init();
}
