//! Encryption at rest (spec §7, issue 7/7): queues configured with `encryption => true`
//! store each payload as an AES-256-GCM envelope (`queen_core::envelope`), sealed at push
//! with `queen.encryption_key` and opened at pop, in `queen.dlq` and at replay with it or
//! with one of `queen.encryption_old_keys` (key rotation). Both settings are
//! superuser-only and hidden from everybody else; a missing or unknown key is an ERROR,
//! never a wrong payload.

use std::cell::RefCell;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use queen_core::envelope::{self, EnvelopeError, Key};

use crate::errors;
use crate::jsonb::RawJsonb;

static ENCRYPTION_KEY: GucSetting<Option<std::ffi::CString>> = GucSetting::<Option<std::ffi::CString>>::new(None);
static OLD_KEYS: GucSetting<Option<std::ffi::CString>> = GucSetting::<Option<std::ffi::CString>>::new(None);

/// Called from `_PG_init`.
pub fn init() {
    let hidden = GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL;
    GucRegistry::define_string_guc(
        c"queen.encryption_key",
        c"Key (64 hex digits) that seals the payloads of encrypted queues.",
        c"Superuser-only and hidden. Also opens envelopes it sealed.",
        &ENCRYPTION_KEY,
        GucContext::Suset,
        hidden,
    );
    GucRegistry::define_string_guc(
        c"queen.encryption_old_keys",
        c"Earlier keys (comma-separated, 64 hex digits each) that still open envelopes.",
        c"Superuser-only and hidden. For key rotation: envelopes name the key that sealed them.",
        &OLD_KEYS,
        GucContext::Suset,
        hidden,
    );
}

/// Parsed keys and the setting texts they came from: parsing and key expansion once.
struct Parsed {
    current_text: String,
    old_text: String,
    current: Option<Key>,
    /// The current key first, then the old ones: every key that may open an envelope.
    all: Vec<Key>,
}

thread_local! {
    static CACHE: RefCell<Option<Parsed>> = const { RefCell::new(None) };
}

fn setting(g: &GucSetting<Option<std::ffi::CString>>) -> String {
    g.get().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
}

fn bad_key(name: &str, e: EnvelopeError) -> ! {
    errors::raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, format!("queen: {name}: {e}"))
}

/// (the sealing key if set, every key that may open an envelope)
fn keys<R>(f: impl FnOnce(Option<&Key>, &[Key]) -> R) -> R {
    let (current, old) = (setting(&ENCRYPTION_KEY), setting(&OLD_KEYS));
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let fresh = !matches!(&*c, Some(p) if p.current_text == current && p.old_text == old);
        if fresh {
            let key = (!current.trim().is_empty())
                .then(|| Key::from_hex(&current).unwrap_or_else(|e| bad_key("queen.encryption_key", e)));
            let mut all: Vec<Key> = key.iter().cloned().collect();
            all.extend(Key::list_from_hex(&old).unwrap_or_else(|e| bad_key("queen.encryption_old_keys", e)));
            *c = Some(Parsed { current_text: current, old_text: old, current: key, all });
        }
        let p = c.as_ref().unwrap();
        f(p.current.as_ref(), &p.all)
    })
}

fn no_key(what: &str) -> ! {
    errors::raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("queen: {what}, but queen.encryption_key is not set (a superuser sets it, e.g. ALTER SYSTEM)"),
    )
}

/// Refuses `encryption => true` while no key is set: the first push would fail anyway.
pub fn require_key(queue: &str) {
    keys(|key, _| {
        if key.is_none() {
            no_key(&format!("queue {queue:?} is to be encrypted"))
        }
    })
}

/// Seals each `(message id, payload)` of an encrypted queue into an envelope.
pub fn seal_all<'a>(queue: &str, messages: impl Iterator<Item = (&'a uuid::Uuid, &'a [u8])>) -> Vec<Vec<u8>> {
    keys(|key, _| {
        let key = key.unwrap_or_else(|| no_key(&format!("queue {queue:?} is encrypted")));
        messages.map(|(id, payload)| envelope::seal(key, id.as_bytes(), payload)).collect()
    })
}

/// A stored payload in jsonb's binary form: opened when it is an envelope.
pub fn open(message_id: &[u8; 16], stored: &[u8]) -> Vec<u8> {
    if !envelope::is_envelope(stored) {
        return stored.to_vec();
    }
    keys(|_, all| match envelope::open(all, message_id, stored) {
        Ok(plain) => plain,
        Err(e @ EnvelopeError::NoKey { .. }) => errors::raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("queen: {e} (set queen.encryption_key or queen.encryption_old_keys)"),
        ),
        Err(e) => errors::raise(PgSqlErrorCode::ERRCODE_DATA_CORRUPTED, format!("queen: {e}")),
    })
}

/// Internal: the plaintext of a dead letter stored as an envelope (queen.dlq, replay).
#[pg_extern(name = "_open_dead_letter")]
#[search_path(pg_catalog, pg_temp)]
fn open_dead_letter(envelope: &[u8], message_id: pgrx::Uuid) -> RawJsonb {
    RawJsonb(open(message_id.as_bytes(), envelope))
}
