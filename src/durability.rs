//! Commit durability of a pop (README, "Durability").
//!
//! A pop's writes — the lease, the attempt count, an auto-ack's cursor advance — can be
//! lost in a server crash without losing a message: the messages are delivered again,
//! which at-least-once delivery allows. So when a transaction's only WAL is the pop's own,
//! its commit does not wait for the WAL flush (`synchronous_commit = off` for that commit
//! alone). A push and an ack keep the configured durability, and so does every
//! transaction that wrote anything else: its writes are the user's, not queen's.
//!
//! "Only the pop's own" is checked by WAL position: `XactLastRecEnd` is 0 until a
//! transaction writes WAL, so it is 0 when the pop starts and, at pre-commit, still where
//! the pop left it. `queen.durable_pop = on` turns this off.

use std::ffi::CStr;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::{register_xact_callback, PgXactCallbackEvent};

static DURABLE_POP: GucSetting<bool> = GucSetting::<bool>::new(false);

/// Called from `_PG_init`.
pub fn init() {
    GucRegistry::define_bool_guc(
        c"queen.durable_pop",
        c"Whether a pop's commit waits for its WAL flush.",
        c"Off (the default): a transaction whose only writes are one pop's commits without \
          waiting for the WAL flush; a server crash can forget that lease or auto-ack, and \
          its messages are delivered again. On: the configured synchronous_commit applies.",
        &DURABLE_POP,
        GucContext::Userset,
        GucFlags::default(),
    );
}

/// WAL end of this transaction so far (0: it has written none).
fn wal_end() -> u64 {
    // SAFETY: a plain read of this backend's own transaction state.
    unsafe { pg_sys::XactLastRecEnd }
}

/// Marks the start of a pop; pass the result to `pop_done`.
pub fn pop_start() -> bool {
    !DURABLE_POP.get() && wal_end() == 0
}

/// Marks the end of a pop. When the pop was the transaction's first writer, its commit
/// skips the flush wait unless something wrote WAL after it.
pub fn pop_done(first_writer: bool) {
    let end = wal_end();
    if !first_writer || end == 0 {
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
