//! The reports queen returns as jsonb (`ack`, `extend_lease`, `revoke_lease`): built as a
//! small JSON value (`Json`) and written in jsonb's binary layout directly (`encode`), the
//! bytes `jsonb_in` would make of the value's text.
//!
//! Neither text for `jsonb_in` to parse again nor PostgreSQL's jsonb builder (which sorts
//! every object's keys and copies every value twice), and no general JSON value either: a
//! report's keys are fixed, so `Json` borrows them, and a uuid stays 16 bytes until it is
//! written. BENCHMARKS.md ("Instructions per call, counted") has what each of these saved.

use std::borrow::Cow;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::pg::errors;
use crate::pg::jsonb::jsonb_datum;

/// A report's JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i64),
    /// Any other number, as its JSON text (`numeric_in` reads it, as `jsonb_in` does).
    Number(String),
    Str(Cow<'static, str>),
    /// A uuid, written as its canonical text.
    Uuid([u8; 16]),
    Array(Vec<Json>),
    Object(Members),
}

/// An object's keys and values, in jsonb's key order (shorter keys first, then bytewise),
/// no key twice: only `Members::sorted` makes them, so `encode` writes them as they are.
#[derive(Debug, Clone, PartialEq)]
pub struct Members(Vec<(Cow<'static, str>, Json)>);

impl Members {
    fn sorted(mut pairs: Vec<(Cow<'static, str>, Json)>) -> Members {
        pairs.sort_by(|a, b| a.0.len().cmp(&b.0.len()).then_with(|| a.0.as_bytes().cmp(b.0.as_bytes())));
        debug_assert!(pairs.windows(2).all(|w| w[0].0 != w[1].0), "a key repeated in a report");
        Members(pairs)
    }
}

impl Json {
    /// An object of fixed keys, given in any order.
    pub fn object<const N: usize>(pairs: [(&'static str, Json); N]) -> Json {
        Json::Object(Members::sorted(pairs.into_iter().map(|(k, v)| (Cow::Borrowed(k), v)).collect()))
    }

    /// A fractional number, written as serde_json writes it (`30.0`, `0.25`, `1e300`);
    /// NaN and the infinities, which JSON lacks, as null (as serde_json's `json!` does).
    pub fn float(f: f64) -> Json {
        serde_json::Number::from_f64(f).map_or(Json::Null, |n| Json::Number(n.to_string()))
    }

    pub fn uuid(u: &pgrx::Uuid) -> Json {
        Json::Uuid(*u.as_bytes())
    }
}

impl From<bool> for Json {
    fn from(b: bool) -> Json {
        Json::Bool(b)
    }
}

impl From<i64> for Json {
    fn from(i: i64) -> Json {
        Json::Int(i)
    }
}

impl From<i32> for Json {
    fn from(i: i32) -> Json {
        Json::Int(i64::from(i))
    }
}

impl From<&'static str> for Json {
    fn from(s: &'static str) -> Json {
        Json::Str(Cow::Borrowed(s))
    }
}

impl From<String> for Json {
    fn from(s: String) -> Json {
        Json::Str(Cow::Owned(s))
    }
}

impl<T: Into<Json>> From<Option<T>> for Json {
    fn from(v: Option<T>) -> Json {
        v.map_or(Json::Null, Into::into)
    }
}

/// Any JSON value (the tests compare the encoder with `jsonb_in` on arbitrary values).
#[cfg(any(test, feature = "pg_test"))]
impl From<&serde_json::Value> for Json {
    fn from(v: &serde_json::Value) -> Json {
        use serde_json::Value;
        match v {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Number(n) => n.as_i64().map_or_else(|| Json::Number(n.to_string()), Json::Int),
            Value::String(s) => Json::Str(Cow::Owned(s.clone())),
            Value::Array(a) => Json::Array(a.iter().map(Json::from).collect()),
            Value::Object(m) => {
                Json::Object(Members::sorted(m.iter().map(|(k, v)| (Cow::Owned(k.clone()), Json::from(v))).collect()))
            }
        }
    }
}

/// A report returned as jsonb (`encode`).
pub struct JsonOut(pub Json);

impl IntoDatum for JsonOut {
    /// The bytes `jsonb_in` would make of the value's JSON text (`pg_tests` compares them),
    /// palloc'd in the current memory context.
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(jsonb_datum(&encode(&self.0)))
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

crate::pg::jsonb::sql_jsonb!(JsonOut);

/// The `JsonbContainer` of `v`, as PostgreSQL's `convertToJsonb` lays it out (jsonb.h,
/// jsonb_util.c): a container is a header word (its count and kind) and one `JEntry` word
/// per child (an object's keys first, in jsonb's order: shorter first, then bytewise; then
/// their values), each the child's length with its type, or every 32nd
/// (`JB_OFFSET_STRIDE`) the end offset of its data; then the children's data. Numbers and
/// containers start on a 4-byte boundary of the value (the padding counts in their
/// length). A scalar at the top is a one-element array marked scalar, as `jsonb_in` makes
/// it. The flags and masks are PostgreSQL's own (`pg_sys`).
pub fn encode(v: &Json) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    match v {
        Json::Array(_) | Json::Object(_) => {
            encode_value(&mut out, v);
        }
        _ => {
            container(&mut out, pg_sys::JB_FARRAY | pg_sys::JB_FSCALAR, std::slice::from_ref(v));
        }
    }
    out
}

/// Appends `v`'s data to `out` and returns its `JEntry` (type and length).
fn encode_value(out: &mut Vec<u8>, v: &Json) -> u32 {
    match v {
        Json::Null => pg_sys::JENTRY_ISNULL,
        Json::Bool(true) => pg_sys::JENTRY_ISBOOL_TRUE,
        Json::Bool(false) => pg_sys::JENTRY_ISBOOL_FALSE,
        Json::Str(s) => string_entry(out, s),
        Json::Uuid(u) => {
            out.extend_from_slice(&queen_core::ids::uuid_text(u));
            pg_sys::JENTRY_ISSTRING | entry_length(36)
        }
        Json::Int(i) => {
            let padding = pad(out);
            pg_sys::JENTRY_ISNUMERIC | entry_length(padding + int_numeric(out, *i))
        }
        Json::Number(text) => {
            let padding = pad(out);
            pg_sys::JENTRY_ISNUMERIC | entry_length(padding + numeric_text(out, text))
        }
        Json::Array(a) => pg_sys::JENTRY_ISCONTAINER | container(out, pg_sys::JB_FARRAY, a),
        Json::Object(Members(pairs)) => {
            let n = pairs.len();
            // Keys first (in jsonb's order, as `Members` keeps them), then their values.
            let child = |out: &mut Vec<u8>, i: usize| {
                if i < n {
                    string_entry(out, &pairs[i].0)
                } else {
                    encode_value(out, &pairs[i - n].1)
                }
            };
            pg_sys::JENTRY_ISCONTAINER | children(out, entry_length(n) | pg_sys::JB_FOBJECT, 2 * n, child)
        }
    }
}

/// A string's data, and its `JEntry`.
fn string_entry(out: &mut Vec<u8>, s: &str) -> u32 {
    out.extend_from_slice(s.as_bytes());
    pg_sys::JENTRY_ISSTRING | entry_length(s.len())
}

/// Pads `out` with zeros to a multiple of 4 bytes; returns how many were added.
fn pad(out: &mut Vec<u8>) -> usize {
    let padding = (4 - out.len() % 4) % 4;
    out.resize(out.len() + padding, 0);
    padding
}

/// A length, offset or count as a `JEntry` or container header holds it (28 bits: jsonb's
/// own limit of 256 MB a value, far above any report).
fn entry_length(len: usize) -> u32 {
    u32::try_from(len).ok().filter(|&l| l <= pg_sys::JENTRY_OFFLENMASK).unwrap_or_else(|| {
        errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("queen: a jsonb report would exceed jsonb's limit of {} bytes", pg_sys::JENTRY_OFFLENMASK),
        )
    })
}

/// An array's container (or the raw scalar one): returns its length.
fn container(out: &mut Vec<u8>, kind: u32, items: &[Json]) -> u32 {
    children(out, entry_length(items.len()) | kind, items.len(), |out, i| encode_value(out, &items[i]))
}

/// A container with header word `header` and `n` children, each appended by `child`
/// (which returns its `JEntry`): returns its length from its start (before its padding)
/// to its end.
fn children(out: &mut Vec<u8>, header: u32, n: usize, mut child: impl FnMut(&mut Vec<u8>, usize) -> u32) -> u32 {
    let start = out.len();
    pad(out);
    out.extend_from_slice(&header.to_ne_bytes());
    let mut entries = out.len();
    out.resize(entries + 4 * n, 0);
    let mut total = 0usize;
    for i in 0..n {
        let meta = child(out, i);
        entries = put_entry(out, entries, meta, i, &mut total);
    }
    entry_length(out.len() - start)
}

/// Writes the `JEntry` of child `i` at `at` (every `JB_OFFSET_STRIDE`th as its end
/// offset, as PostgreSQL does) and returns where the next goes.
fn put_entry(out: &mut [u8], at: usize, meta: u32, i: usize, total: &mut usize) -> usize {
    *total += (meta & pg_sys::JENTRY_OFFLENMASK) as usize;
    let offset = entry_length(*total);
    let meta = if i.is_multiple_of(pg_sys::JB_OFFSET_STRIDE as usize) {
        (meta & pg_sys::JENTRY_TYPEMASK) | offset | pg_sys::JENTRY_HAS_OFF
    } else {
        meta
    };
    out[at..at + 4].copy_from_slice(&meta.to_ne_bytes());
    at + 4
}

/// Appends the numeric `numeric_in` makes of `text` (a JSON number's text, as `jsonb_in`
/// reads it), with its 4-byte varlena header, and returns its length.
fn numeric_text(out: &mut Vec<u8>, text: &str) -> usize {
    // A NUL cannot be part of a number; numeric_in then refuses the empty text (22P02).
    let text = std::ffi::CString::new(text).unwrap_or_default();
    // SAFETY: numeric_in of a C string returns a fresh palloc'd numeric varlena (4-byte
    // header), read here by its own length and copied out; it is freed with the memory
    // context. It raises (22P02) on text it cannot read, as jsonb_in would.
    unsafe {
        let d = pgrx::direct_function_call_as_datum(
            pg_sys::numeric_in,
            &[
                Some(pg_sys::Datum::from(text.as_ptr())),
                Some(pg_sys::Datum::from(pg_sys::InvalidOid)),
                Some(pg_sys::Datum::from(-1i32)),
            ],
        )
        .unwrap_or_else(|| errors::internal("numeric_in returned NULL"));
        let p: *mut pg_sys::varlena = d.cast_mut_ptr();
        let bytes = std::slice::from_raw_parts(p as *const u8, pgrx::varsize_any(p));
        out.extend_from_slice(bytes);
        bytes.len()
    }
}

/// Appends `i` as PostgreSQL's `int64_to_numeric` makes it (numeric.c:
/// `int64_to_numericvar`, then `make_result`) and returns its length: the short form, a
/// header word (short, sign, weight; scale 0) and the base-10000 digits from the most
/// significant, trailing zero digits dropped; zero has no digit and weight 0. A call into
/// PostgreSQL for each number cost more than the rest of a small report.
fn int_numeric(out: &mut Vec<u8>, i: i64) -> usize {
    // numeric.c's own (not in a header, so not in pg_sys). The weight is never negative
    // here, so its sign bit (NUMERIC_SHORT_WEIGHT_SIGN_MASK) is never set.
    const NBASE: u64 = 10_000;
    const NUMERIC_SHORT: u16 = 0x8000;
    const NUMERIC_SHORT_SIGN_MASK: u16 = 0x2000;
    const NUMERIC_SHORT_WEIGHT_MASK: u16 = 0x003F;
    let mut digits = [0u16; 5];
    let mut n = 0;
    let mut u = i.unsigned_abs();
    while u > 0 {
        digits[4 - n] = (u % NBASE) as u16;
        u /= NBASE;
        n += 1;
    }
    // The weight is that of the first digit (n - 1 of them follow), before trailing zero
    // digits are dropped.
    let weight = n.saturating_sub(1) as u16;
    let mut kept = &digits[5 - n..];
    while let Some((0, rest)) = kept.split_last() {
        kept = rest;
    }
    let sign = if i < 0 { NUMERIC_SHORT_SIGN_MASK } else { 0 };
    let header = NUMERIC_SHORT | sign | (weight & NUMERIC_SHORT_WEIGHT_MASK);
    let len = pg_sys::VARHDRSZ + 2 + 2 * kept.len();
    // The 4-byte varlena header, as `SET_VARSIZE_4B` (postgres.h; `pgrx::set_varsize_4b`,
    // used by `jsonb_datum`) writes it, here into bytes with no alignment to rely on.
    #[cfg(target_endian = "little")]
    out.extend_from_slice(&((len as u32) << 2).to_ne_bytes());
    #[cfg(target_endian = "big")]
    out.extend_from_slice(&((len as u32) & 0x3FFF_FFFF).to_ne_bytes());
    out.extend_from_slice(&header.to_ne_bytes());
    for d in kept {
        out.extend_from_slice(&d.to_ne_bytes());
    }
    len
}
