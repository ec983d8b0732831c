//! Transaction ends that a shared-memory registry could not take at once, kept and done
//! later: one mechanism for both registries (`offsets`, `lane::registry`).
//!
//! A transaction's end reaches a registry from a transaction callback, where nothing may
//! raise (after a commit an ERROR is a PANIC). So `finish` applies the end and, if the
//! update panics (it then changed nothing: each registry writes through an undo log that
//! a panic puts back), tries once more; if that fails too, the end is kept in this backend, in
//! order. It is done (`settle_all`) before this backend next reads or changes either
//! registry, and when the backend exits. Until then what the end would release stays held
//! by this backend (lanes locked, reservations in flight), so other backends skip or wait:
//! nothing is lost, skipped or delivered twice meanwhile.

use std::cell::RefCell;
use std::thread::LocalKey;

use pgrx::pg_sys;
use pgrx::prelude::*;

/// A registry whose transaction ends may be deferred.
pub trait Registry: 'static {
    /// One transaction's (or subtransaction's) end, as the registry applies it.
    type End: 'static;
    /// The registry's name in messages ("lane", "offset").
    const NAME: &'static str;
    /// What stays held when the backend exits with ends still pending (for the log).
    const LOST_AT_EXIT: &'static str;
    /// This backend's pending ends, oldest first.
    fn pending() -> &'static LocalKey<RefCell<Vec<Self::End>>>;
    /// Applies one end to the shared registry. A panic leaves the registry as it was.
    fn apply(end: &Self::End);
}

/// A registry's `settle`, and what stays held if it cannot run at exit (`LOST_AT_EXIT`).
type Settler = (fn(), &'static str);

thread_local! {
    /// The settler of each registry that has had pending ends in this backend, in the
    /// order they first had one.
    static SETTLERS: RefCell<Vec<Settler>> = const { RefCell::new(Vec::new()) };
}

/// Applies `end` now; raises nothing (see the module comment).
pub fn finish<R: Registry>(end: R::End) {
    if R::pending().with(|p| !p.borrow().is_empty()) {
        // Keep the order: an older end comes first.
        R::pending().with(|p| p.borrow_mut().push(end));
        let _ = std::panic::catch_unwind(settle::<R>);
        return;
    }
    for _ in 0..2 {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| R::apply(&end))).is_ok() {
            return;
        }
    }
    R::pending().with(|p| p.borrow_mut().push(end));
    remember::<R>();
    pgrx::warning!(
        "queen: the {} registry could not take a transaction's end; it is retried before this session's next queen call",
        R::NAME
    );
}

/// Does `R`'s pending ends, in order. A failure is an ERROR of the current call; the end
/// stays pending (nothing is lost).
pub fn settle<R: Registry>() {
    loop {
        let Some(end) = R::pending().with(|p| {
            let mut p = p.borrow_mut();
            (!p.is_empty()).then(|| p.remove(0))
        }) else {
            return;
        };
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| R::apply(&end))) {
            R::pending().with(|p| p.borrow_mut().insert(0, end));
            std::panic::resume_unwind(e);
        }
    }
}

/// Does every registry's pending ends: what an earlier transaction end of this backend
/// could not do comes before its next use of either registry. (A registry settles its own
/// first, so that another registry that keeps failing does not hold its ends back.)
pub fn settle_all() {
    // Copied out: a settle may not run while the list is borrowed (it never changes it,
    // but a panic must not leave it borrowed either).
    let settlers = SETTLERS.with(|s| s.borrow().clone());
    for (settle, _) in settlers {
        settle();
    }
}

/// Registers `R`'s settle, and the exit hook on the first registry that needs one.
fn remember<R: Registry>() {
    let first = SETTLERS.with(|s| {
        let mut s = s.borrow_mut();
        let f: fn() = settle::<R>;
        let first = s.is_empty();
        if !s.iter().any(|(g, _)| std::ptr::fn_addr_eq(*g, f)) {
            s.push((f, R::LOST_AT_EXIT));
        }
        first
    });
    if first {
        // SAFETY: registering a process-exit callback is allowed at any time in a backend.
        unsafe { pg_sys::before_shmem_exit(Some(settle_at_exit), pg_sys::Datum::from(0)) };
    }
}

/// The backend exits: the last chance for its pending ends.
#[pg_guard]
unsafe extern "C-unwind" fn settle_at_exit(_code: i32, _arg: pg_sys::Datum) {
    let settlers = SETTLERS.with(|s| s.borrow().clone());
    for (settle, lost) in settlers {
        if std::panic::catch_unwind(settle).is_err() {
            pgrx::log!("queen: {lost} until the server restarts");
        }
    }
}
