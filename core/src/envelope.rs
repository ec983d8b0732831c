//! Encryption at rest: AES-256-GCM envelopes for the payloads of encrypted queues.
//!
//! Layout: `magic "QENC" | version u8 (=1) | key fingerprint [8] | nonce [12] | ciphertext+tag`.
//! The nonce is random per envelope. The message id is the associated data, so an
//! envelope cannot be moved to another message undetected. The fingerprint (the first 8
//! bytes of SHA-256 of the key) names the key that sealed it, so that after a key
//! rotation old envelopes still find their key, and a missing key is told apart from a
//! wrong or corrupted envelope.
//!
//! A stored payload is either jsonb's binary form or an envelope: a jsonb container's
//! first 4 bytes (little-endian) have the object or array flag in the top byte (0x40,
//! 0x80 or 0x90), which "QENC" (0x43) does not, so the two cannot be confused.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use sha2::{Digest, Sha256};
use std::fmt;

const MAGIC: &[u8; 4] = b"QENC";
const VERSION: u8 = 1;
const HEADER: usize = 4 + 1 + 8 + 12;

/// A 256-bit key and its fingerprint.
#[derive(Clone)]
pub struct Key {
    cipher: Aes256Gcm,
    fingerprint: [u8; 8],
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.fingerprint_hex()) // never the key itself
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvelopeError {
    /// The key text is not 64 hex digits.
    BadKey(String),
    /// No key given has this envelope's fingerprint.
    NoKey {
        fingerprint: String,
    },
    /// The tag does not verify: the envelope was altered, or belongs to another message.
    Forged,
    Malformed(&'static str),
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvelopeError::BadKey(why) => write!(f, "invalid encryption key: {why}"),
            EnvelopeError::NoKey { fingerprint } => {
                write!(f, "the payload was encrypted with key {fingerprint}, which is not configured")
            }
            EnvelopeError::Forged => write!(f, "the encrypted payload does not authenticate (altered or misplaced)"),
            EnvelopeError::Malformed(what) => write!(f, "malformed encrypted payload: {what}"),
        }
    }
}

impl std::error::Error for EnvelopeError {}

impl Key {
    /// A key from 64 hex digits (32 bytes); surrounding whitespace is ignored.
    pub fn from_hex(text: &str) -> Result<Key, EnvelopeError> {
        // Byte-wise: the text may hold anything (it never appears in an error message).
        let t = text.trim().as_bytes();
        if t.len() != 64 {
            return Err(EnvelopeError::BadKey(format!("expected 64 hex digits, got {} bytes", t.len())));
        }
        let digit = |c: u8| (c as char).to_digit(16).filter(|_| c.is_ascii()).map(|d| d as u8);
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            match (digit(t[2 * i]), digit(t[2 * i + 1])) {
                (Some(hi), Some(lo)) => *b = hi << 4 | lo,
                _ => return Err(EnvelopeError::BadKey("not hexadecimal".to_string())),
            }
        }
        let digest = Sha256::digest(bytes);
        let mut fingerprint = [0u8; 8];
        fingerprint.copy_from_slice(&digest[..8]);
        Ok(Key { cipher: Aes256Gcm::new_from_slice(&bytes).expect("32-byte key"), fingerprint })
    }

    /// A comma-separated list of keys (empty items ignored).
    pub fn list_from_hex(text: &str) -> Result<Vec<Key>, EnvelopeError> {
        text.split(',').filter(|s| !s.trim().is_empty()).map(Key::from_hex).collect()
    }

    pub fn fingerprint_hex(&self) -> String {
        self.fingerprint.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// True when `bytes` is an envelope rather than a plaintext payload.
pub fn is_envelope(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// The associated data of a message's headers envelope: its id, then `headers`. A
/// payload envelope is bound to the id alone, so neither can stand in for the other.
pub fn headers_aad(message_id: &[u8; 16]) -> [u8; 23] {
    let mut aad = [0u8; 23];
    aad[..16].copy_from_slice(message_id);
    aad[16..].copy_from_slice(b"headers");
    aad
}

/// Seals `plaintext` for the message `aad` (its id) with a random nonce.
pub fn seal(key: &Key, aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
    let mut nonce = [0u8; 12];
    getrandom::getrandom(&mut nonce).expect("the OS random number generator");
    seal_with_nonce(key, aad, plaintext, nonce)
}

fn seal_with_nonce(key: &Key, aad: &[u8], plaintext: &[u8], nonce: [u8; 12]) -> Vec<u8> {
    let sealed = key
        .cipher
        .encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad })
        .expect("AES-GCM encryption of an in-memory buffer");
    let mut out = Vec::with_capacity(HEADER + sealed.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&key.fingerprint);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&sealed);
    out
}

/// Opens an envelope with whichever of `keys` sealed it.
pub fn open(keys: &[Key], aad: &[u8], envelope: &[u8]) -> Result<Vec<u8>, EnvelopeError> {
    if !is_envelope(envelope) {
        return Err(EnvelopeError::Malformed("no envelope header"));
    }
    if envelope.len() < HEADER + 16 {
        return Err(EnvelopeError::Malformed("truncated"));
    }
    if envelope[4] != VERSION {
        return Err(EnvelopeError::Malformed("unknown version"));
    }
    let fingerprint = &envelope[5..13];
    let key = keys.iter().find(|k| k.fingerprint == fingerprint).ok_or_else(|| EnvelopeError::NoKey {
        fingerprint: fingerprint.iter().map(|b| format!("{b:02x}")).collect(),
    })?;
    key.cipher
        .decrypt(Nonce::from_slice(&envelope[13..25]), Payload { msg: &envelope[25..], aad })
        .map_err(|_| EnvelopeError::Forged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const K1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const K2: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    #[test]
    fn headers_and_payload_envelopes_do_not_stand_in_for_each_other() {
        let key = Key::from_hex(&"ab".repeat(32)).unwrap();
        let id = [7u8; 16];
        let headers = seal(&key, &headers_aad(&id), b"{\"traceparent\": \"x\"}");
        assert_eq!(open(std::slice::from_ref(&key), &headers_aad(&id), &headers).unwrap(), b"{\"traceparent\": \"x\"}");
        assert!(open(std::slice::from_ref(&key), &id, &headers).is_err(), "headers read as a payload");
        let payload = seal(&key, &id, b"{}");
        assert!(open(std::slice::from_ref(&key), &headers_aad(&id), &payload).is_err(), "a payload read as headers");
        assert!(open(std::slice::from_ref(&key), &headers_aad(&[8u8; 16]), &headers).is_err(), "another message's");
    }

    #[test]
    fn round_trip_and_no_plaintext() {
        let k = Key::from_hex(K1).unwrap();
        let env = seal(&k, b"id-1", b"{\"secret\": \"swordfish\"}");
        assert!(is_envelope(&env));
        assert!(!env.windows(9).any(|w| w == b"swordfish"));
        assert_eq!(open(std::slice::from_ref(&k), b"id-1", &env).unwrap(), b"{\"secret\": \"swordfish\"}");
        // Random nonces: the same plaintext seals differently.
        assert_ne!(seal(&k, b"id-1", b"x"), seal(&k, b"id-1", b"x"));
    }

    #[test]
    fn wrong_missing_and_rotated_keys() {
        let (k1, k2) = (Key::from_hex(K1).unwrap(), Key::from_hex(K2).unwrap());
        let env = seal(&k1, b"id", b"payload");
        assert!(matches!(open(std::slice::from_ref(&k2), b"id", &env), Err(EnvelopeError::NoKey { .. })));
        assert!(matches!(open(&[], b"id", &env), Err(EnvelopeError::NoKey { .. })));
        // After a rotation the old key is still found among the others.
        assert_eq!(open(&[k2, k1.clone()], b"id", &env).unwrap(), b"payload");
        // Moved to another message: the associated data does not match.
        assert_eq!(open(&[k1], b"other", &env), Err(EnvelopeError::Forged));
    }

    #[test]
    fn bad_keys() {
        assert!(Key::from_hex("abc").is_err());
        // Non-ASCII text of the right byte length: an error, not a panic, and the error
        // never quotes the text.
        for bad in ["é".repeat(32), format!("{}é", "a".repeat(62)), format!("a{}", "é".repeat(31)) + "a"] {
            let e = Key::from_hex(&bad).expect_err("refused").to_string();
            assert!(!e.contains('é') && !e.contains("aaaa"), "the error quotes the key: {e}");
        }
        assert!(Key::from_hex(&"é".repeat(33)).is_err());
        assert!(Key::from_hex(&"zz".repeat(32)).is_err());
        assert_eq!(Key::list_from_hex(&format!("{K1}, ,{K2}")).unwrap().len(), 2);
        assert!(!format!("{:?}", Key::from_hex(K1).unwrap()).contains(K1));
    }

    #[test]
    fn jsonb_containers_are_never_envelopes() {
        // Header words of jsonb containers: object, array, raw scalar.
        for flags in [0x40u8, 0x80, 0x90] {
            let bytes = [1, 0, 0, flags, 0, 0, 0, 0];
            assert!(!is_envelope(&bytes));
        }
    }

    proptest! {
        /// Any altered byte is refused, never a different plaintext.
        #[test]
        fn prop_tampering_is_refused(msg in proptest::collection::vec(any::<u8>(), 0..300), at in any::<usize>(), bit in 0u8..8) {
            let k = Key::from_hex(K1).unwrap();
            let env = seal_with_nonce(&k, b"id", &msg, [7; 12]);
            let mut bad = env.clone();
            let i = at % bad.len();
            bad[i] ^= 1 << bit;
            prop_assert!(open(std::slice::from_ref(&k), b"id", &bad).is_err());
            prop_assert_eq!(open(&[k], b"id", &env).unwrap(), msg);
        }
    }
}
