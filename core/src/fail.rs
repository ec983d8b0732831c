//! Fail points: named places inside the shared-memory registries (and, in the extension,
//! the transaction callbacks) where a test can make the code panic, as a bug would.
//!
//! They exist only with the cargo feature `failpoints`, which the test builds turn on and
//! release builds leave off: without it `point` is an empty inline function. With it, a
//! hook that the embedding program installs once (`install`) decides, for each name,
//! whether to panic now. The extension reads the names from the setting
//! `queen.failpoint`; the unit tests arm a thread of their own.
//!
//! What a test shows with them: a registry update cut short by a panic is put back whole
//! (`lanes::Registry`, `offsets::Registry` keep an undo log), so the other backends see
//! the state before the update, never half of it.

/// Every fail point of the core, by name. The extension adds its own (`xact.*`).
pub const POINTS: &[&str] = &[
    "lanes.begin_load",
    "lanes.finish_load",
    "lanes.remove",
    "lanes.lock",
    "lanes.set",
    "lanes.chain",
    "lanes.unlock",
    "lanes.put_back",
    "lanes.evict",
    "lanes.sweep",
    "lanes.forget",
    "lanes.cursor",
    "offsets.reserve",
    "offsets.wrote",
    "offsets.finish",
    "offsets.prepare",
    "offsets.subxact",
    "offsets.begin_load",
    "offsets.finish_load",
    "offsets.remove",
    "offsets.drop",
];

#[cfg(feature = "failpoints")]
static HOOK: std::sync::OnceLock<fn(&'static str) -> bool> = std::sync::OnceLock::new();

/// Installs the hook that decides whether a fail point fires (once per process; later
/// calls are ignored).
#[cfg(feature = "failpoints")]
pub fn install(hook: fn(&'static str) -> bool) {
    let _ = HOOK.set(hook);
}

/// A fail point: panics when the installed hook says so (feature `failpoints` only).
#[inline(always)]
pub fn point(name: &'static str) {
    #[cfg(feature = "failpoints")]
    if HOOK.get().is_some_and(|hook| hook(name)) {
        panic!("queen fail point {name}");
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

#[cfg(test)]
pub mod testing {
    //! The unit tests' hook: each test thread arms its own fail point.
    use std::cell::Cell;

    thread_local! {
        /// The point armed on this thread, and how many of its hits pass before it fires.
        static ARMED: Cell<Option<(&'static str, u32)>> = const { Cell::new(None) };
    }

    #[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
    fn hook(name: &'static str) -> bool {
        ARMED.with(|a| match a.get() {
            Some((armed, 0)) if armed == name => {
                a.set(None);
                true
            }
            Some((armed, n)) if armed == name => {
                a.set(Some((armed, n - 1)));
                false
            }
            _ => false,
        })
    }

    /// Fires `name` at its hit number `skip` (0: the next one), on this thread.
    pub fn arm(name: &'static str, skip: u32) {
        #[cfg(feature = "failpoints")]
        super::install(hook);
        ARMED.with(|a| a.set(Some((name, skip))));
    }

    pub fn disarm() {
        ARMED.with(|a| a.set(None));
    }

    /// Whether the point armed on this thread has fired (or none was armed).
    pub fn fired() -> bool {
        ARMED.with(|a| a.get().is_none())
    }
}
