//! Commit durability of a pop (README, "Durability").
//!
//! A pop's lease and attempt count can be lost in a server crash without losing a
//! message: the messages are delivered again, which at-least-once delivery allows. So
//! when a transaction's only WAL is one leasing pop's own, its commit does not wait for
//! the WAL flush (`synchronous_commit = off` for that commit alone).
//!
//! Everything else keeps the configured durability: a push, an ack, an auto-ack pop (it
//! moves the cursor, which must never move back after a crash: an auto-acked message is
//! never delivered again), a pop that created its consumer group (a 'new' group forgotten
//! in a crash would be created again later, at a later end, and skip what came between),
//! a pop that filed dead letters or moved a cursor past messages it passed over (expired,
//! unreadable, redriven to another group: an ack's rule), and every transaction that wrote anything else: its writes are the user's, not queen's.
//!
//! "Only the pop's own" is checked by WAL position: `XactLastRecEnd` is 0 until a
//! transaction writes WAL, so it is 0 when the pop starts and, at pre-commit, still where
//! the pop left it. `queen.durable_pop = on` makes every pop's commit wait.

use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::{register_xact_callback, PgXactCallbackEvent};

use crate::pg::settings;

/// WAL end of this transaction so far (0: it has written none).
fn wal_end() -> u64 {
    // SAFETY: a plain read of this backend's own transaction state.
    unsafe { pg_sys::XactLastRecEnd }
}

/// Marks the start of a pop; pass the result to `pop_done`. An auto-ack pop keeps the
/// configured durability.
pub fn pop_start(auto_ack: bool) -> bool {
    !auto_ack && !settings::durable_pop() && wal_end() == 0
}

/// Marks the end of a pop. When a leasing pop was the transaction's first writer and wrote
/// nothing that must survive a crash (`durable`: it created its group, filed dead letters
/// or passed a cursor), its commit skips the flush wait unless something wrote WAL after
/// it.
pub fn pop_done(first_writer: bool, durable: bool) {
    let end = wal_end();
    if !first_writer || durable || end == 0 {
        return;
    }
    register_xact_callback(PgXactCallbackEvent::PreCommit, move || {
        if wal_end() == end {
            set_local(c"synchronous_commit", c"off");
        }
    });
}

/// `SET LOCAL name = value`: reverted when the transaction ends.
fn set_local(name: &CStr, value: &CStr) {
    // SAFETY: setting a configuration option for the current transaction (GUC_ACTION_LOCAL)
    // from a pre-commit callback, with static names and values.
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            0,
            false,
        );
    }
}
