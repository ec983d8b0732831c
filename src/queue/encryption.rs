//! Encryption at rest (docs/concepts.md, "Encryption"): queues configured with `encryption => true`
//! store each payload as an AES-256-GCM envelope (`queen_core::envelope`), sealed at push
//! and opened at pop, in `queen.dlq` and at replay.
//!
//! Where the keys come from (README, "Encryption", has the threat model):
//! - `queen.encryption_key_file` (preferred): a file that only the server's OS user may
//!   read (mode 0600 or stricter; anything looser is refused). Its first key line is the
//!   sealing key, the next ones are older keys that still open envelopes. Lines that are
//!   empty or start with `#` are skipped. The setting holds only the path; only
//!   superusers can set it. Reading the file needs the OS account, or a role that may read
//!   server files (superuser, `pg_read_server_files`).
//! - `queen.encryption_key` and `queen.encryption_old_keys`, used only when no key file
//!   is set. Superuser-only and hidden from `SHOW ALL`, but members of
//!   `pg_read_all_settings` (part of `pg_monitor`) can read them, and `ALTER SYSTEM` or
//!   `ALTER DATABASE` store them in files and catalogs: kept for tests and compatibility.
//!
//! A missing or unknown key is an ERROR, never a wrong payload, and no error quotes a key.

use std::cell::RefCell;

use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use queen_core::envelope::{self, EnvelopeError, Key};

use crate::pg::errors;
use crate::pg::jsonb::RawJsonb;
use crate::pg::settings;

/// The keys of a key file: (sealing key, older keys). Refuses a file that the group or
/// others may read. No error quotes the file's content.
fn read_key_file(path: &str) -> (String, String) {
    use std::os::unix::fs::PermissionsExt;
    let fail = |detail: String| -> ! {
        errors::raise(
            PgSqlErrorCode::ERRCODE_CONFIG_FILE_ERROR,
            format!("queen: queen.encryption_key_file {path:?}: {detail}"),
        )
    };
    let meta = std::fs::metadata(path).unwrap_or_else(|e| fail(e.to_string()));
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        fail(format!("may be read by others (mode {:o}); allow its owner alone (chmod 600)", mode & 0o777));
    }
    let text = std::fs::read(path).unwrap_or_else(|e| fail(e.to_string()));
    let text = String::from_utf8(text).unwrap_or_else(|_| fail("is not text".to_string()));
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
    let current = lines.next().unwrap_or_else(|| fail("holds no key".to_string())).to_string();
    (current, lines.collect::<Vec<_>>().join(","))
}

/// The key texts in force: (sealing key, older keys, where they came from).
fn key_texts() -> (String, String, &'static str) {
    let (file, key, old) = settings::encryption_keys();
    if file.trim().is_empty() {
        return (key, old, "");
    }
    let (current, old) = read_key_file(file.trim());
    (current, old, "file")
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

fn bad_key(name: &str, e: EnvelopeError) -> ! {
    errors::raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, format!("queen: {name}: {e}"))
}

/// (the sealing key if set, every key that may open an envelope)
fn keys<R>(f: impl FnOnce(Option<&Key>, &[Key]) -> R) -> R {
    let (current, old, from) = key_texts();
    let (current_name, old_name) = if from == "file" {
        ("queen.encryption_key_file (first key)", "queen.encryption_key_file (older keys)")
    } else {
        ("queen.encryption_key", "queen.encryption_old_keys")
    };
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let fresh = !matches!(&*c, Some(p) if p.current_text == current && p.old_text == old);
        if fresh {
            let key = (!current.trim().is_empty())
                .then(|| Key::from_hex(&current).unwrap_or_else(|e| bad_key(current_name, e)));
            let mut all: Vec<Key> = key.iter().cloned().collect();
            all.extend(Key::list_from_hex(&old).unwrap_or_else(|e| bad_key(old_name, e)));
            *c = Some(Parsed { current_text: current, old_text: old, current: key, all });
        }
        let p = c.as_ref().unwrap();
        f(p.current.as_ref(), &p.all)
    })
}

fn no_key(what: &str) -> ! {
    errors::raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("queen: {what}, but no encryption key is set (a superuser sets queen.encryption_key_file)"),
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

/// Seals the headers of each `(message id, headers)` of an encrypted queue (None stays
/// None), bound to their message and purpose (`envelope::headers_aad`).
pub fn seal_headers<'a>(
    queue: &str,
    messages: impl Iterator<Item = (&'a uuid::Uuid, Option<&'a [u8]>)>,
) -> Vec<Option<Vec<u8>>> {
    keys(|key, _| {
        let key = key.unwrap_or_else(|| no_key(&format!("queue {queue:?} is encrypted")));
        messages.map(|(id, h)| h.map(|h| envelope::seal(key, &envelope::headers_aad(id.as_bytes()), h))).collect()
    })
}

/// Why a stored payload cannot be opened.
pub struct Unopenable {
    code: PgSqlErrorCode,
    pub message: String,
}

/// A stored payload in jsonb's binary form, opened when it is an envelope; or why it
/// cannot be (a key that is not configured, or an envelope that does not authenticate).
pub fn try_open(message_id: &[u8; 16], stored: &[u8]) -> Result<Vec<u8>, Unopenable> {
    try_open_for(message_id, stored)
}

/// Stored headers, opened as `try_open` opens a payload.
pub fn try_open_headers(message_id: &[u8; 16], stored: &[u8]) -> Result<Vec<u8>, Unopenable> {
    try_open_for(&envelope::headers_aad(message_id), stored)
}

/// A stored message's payload and headers, opened: an encrypted queue's envelopes, a plain
/// queue's bytes as they are (`try_open`, `try_open_headers`).
pub fn open_frame(f: &queen_core::segment::Frame<'_>) -> Result<(Vec<u8>, Option<Vec<u8>>), Unopenable> {
    let payload = try_open(&f.message_id, f.payload)?;
    let headers = f.headers.map(|h| try_open_headers(&f.message_id, h)).transpose()?;
    Ok((payload, headers))
}

fn try_open_for(aad: &[u8], stored: &[u8]) -> Result<Vec<u8>, Unopenable> {
    if !envelope::is_envelope(stored) {
        return Ok(stored.to_vec());
    }
    keys(|_, all| {
        envelope::open(all, aad, stored).map_err(|e| match e {
            e @ EnvelopeError::NoKey { .. } => Unopenable {
                code: PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                message: format!("queen: {e} (add it to queen.encryption_key_file, or set queen.encryption_old_keys)"),
            },
            e => Unopenable { code: PgSqlErrorCode::ERRCODE_DATA_CORRUPTED, message: format!("queen: {e}") },
        })
    })
}

impl Unopenable {
    /// The envelope names a key that is not configured: a setting to fix rather than a
    /// bad message, so a pop raises it, unless `queen.dead_letter_missing_key` is on.
    pub fn stops_pop(&self) -> bool {
        self.code == PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE && !settings::dead_letter_missing_key()
    }

    pub fn raise(self) -> ! {
        errors::raise(self.code, self.message)
    }
}

/// `try_open`, or an ERROR.
pub fn open(message_id: &[u8; 16], stored: &[u8]) -> Vec<u8> {
    try_open(message_id, stored).unwrap_or_else(|e| e.raise())
}

/// `try_open_headers`, or an ERROR.
pub fn open_headers(message_id: &[u8; 16], stored: &[u8]) -> Vec<u8> {
    try_open_headers(message_id, stored).unwrap_or_else(|e| e.raise())
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._open_dead_letter(bytea, uuid) IS
  'queen internal: opens the envelope of an encrypted dead letter (queen.dlq, dlq_replay); not granted';
"#,
    name = "open_dead_letter_home",
    requires = [open_dead_letter]
);

/// Internal: the plaintext of a dead letter stored as an envelope (queen.dlq, replay).
#[pg_extern(name = "_open_dead_letter")]
#[search_path(pg_catalog, pg_temp)]
fn open_dead_letter(envelope: &[u8], message_id: pgrx::Uuid) -> RawJsonb {
    if let Err(e) = sealed(envelope) {
        e.raise();
    }
    RawJsonb(open(message_id.as_bytes(), envelope))
}

/// A dead letter's `envelope` column holds an envelope, or the bytes of a corrupt segment
/// (never to be read as a payload).
fn sealed(envelope: &[u8]) -> Result<(), Unopenable> {
    if envelope::is_envelope(envelope) {
        return Ok(());
    }
    Err(Unopenable {
        code: PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        message: "queen: the dead letter holds the bytes of a corrupt segment, not a message".to_string(),
    })
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._dead_letter_unopenable(bytea, uuid) IS
  'queen internal: why a dead letter''s envelope cannot be opened (queen.dlq); not granted';
"#,
    name = "dead_letter_unopenable_home",
    requires = [dead_letter_unopenable]
);

/// Internal: why a dead letter's envelope cannot be opened, or NULL when it can
/// (queen.dlq lists such a row with a NULL payload and this reason).
#[pg_extern(name = "_dead_letter_unopenable")]
#[search_path(pg_catalog, pg_temp)]
fn dead_letter_unopenable(envelope: &[u8], message_id: pgrx::Uuid) -> Option<String> {
    sealed(envelope).and_then(|()| try_open(message_id.as_bytes(), envelope).map(drop)).err().map(|e| e.message)
}

extension_sql!(
    r#"
COMMENT ON FUNCTION queen._dead_letter_headers(bytea, uuid) IS
  'queen internal: a dead letter''s headers as jsonb, opened if sealed (queen.dlq); not granted';
"#,
    name = "dead_letter_headers_home",
    requires = [dead_letter_headers]
);

/// Internal: a dead letter's headers (stored as the segment held them: jsonb bytes, or an
/// envelope of an encrypted queue) as jsonb; NULL when they cannot be opened (queen.dlq
/// then gives the reason with the payload, which the same key sealed).
#[pg_extern(name = "_dead_letter_headers")]
#[search_path(pg_catalog, pg_temp)]
fn dead_letter_headers(headers: &[u8], message_id: pgrx::Uuid) -> Option<RawJsonb> {
    try_open_headers(message_id.as_bytes(), headers).ok().map(RawJsonb)
}
