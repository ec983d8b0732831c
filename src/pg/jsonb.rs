//! Payloads travel as jsonb's own binary form, end to end.
//!
//! A push copies the bytes of the jsonb it was given (no text conversion, no parse); a
//! segment stores them; a pop hands them back as a jsonb datum (no parse either). pgrx's
//! `JsonB` would go through text and serde both ways, which profiles showed to be the
//! largest cost of push and pop.
//!
//! The reports queen returns (`ack`, `extend_lease`, `revoke_lease`) are written in
//! jsonb's binary layout directly: `pg::report`.

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::pg::errors;

/// The bytes of a jsonb value (the `JsonbContainer`, without the varlena header).
pub struct RawJsonb(pub Vec<u8>);

impl FromDatum for RawJsonb {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        if is_null {
            return None;
        }
        // SAFETY: a non-null jsonb datum of the current call; detoasting returns a varlena
        // whose header gives the length of the bytes copied out here.
        unsafe {
            let v = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
            let len = pgrx::varsize_any_exhdr(v);
            let data = pgrx::vardata_any(v) as *const u8;
            Some(RawJsonb(copy_fallibly(std::slice::from_raw_parts(data, len))))
        }
    }
}

/// A copy of jsonb bytes (a payload or headers, of an argument or a row: up to what
/// PostgreSQL accepts, a gigabyte) into Rust memory. Allocated fallibly: out of memory is
/// PostgreSQL's clean `53200` ERROR, as a `palloc` that fails would raise. A failing Rust
/// allocation would otherwise abort the process, and the postmaster then restarts the
/// whole server (every session's connection and every lease in shared memory lost) over
/// one call's data.
pub fn copy_fallibly(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    if out.try_reserve_exact(bytes.len()).is_err() {
        errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
            format!("queen: out of memory copying {} bytes of jsonb", bytes.len()),
        );
    }
    out.extend_from_slice(bytes);
    out
}

impl IntoDatum for RawJsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(jsonb_datum(&self.0))
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

// pgrx's SQL mapping and calling convention for our jsonb types (these, and
// `report::JsonOut`): they are `jsonb` in SQL; arguments unbox through FromDatum and
// returns box through IntoDatum, as pgrx does for its own JsonB.
macro_rules! sql_jsonb {
    ($($t:ident),*) => {$(
        const _: () = {
            use ::pgrx::pgrx_sql_entity_graph::metadata::{
                ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
            };
            // SAFETY: the type is jsonb in SQL, and its datums are jsonb (FromDatum/IntoDatum).
            unsafe impl SqlTranslatable for $t {
                const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!($t);
                const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
                const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
                const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
            }
        };
        // SAFETY: returns are boxed with this type's IntoDatum, as pgrx's own JsonB is.
        unsafe impl pgrx::callconv::BoxRet for $t {
            unsafe fn box_into<'fcx>(self, fcinfo: &mut pgrx::callconv::FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
                match pgrx::IntoDatum::into_datum(self) {
                    // SAFETY: a jsonb datum palloc'd in the call's memory context.
                    Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
                    None => fcinfo.return_null(),
                }
            }
        }
    )*};
}
sql_jsonb!(RawJsonb, JsonbArg);
pub(crate) use sql_jsonb;

// Arguments of the two jsonb types that take them.
macro_rules! arg_jsonb {
    ($($t:ident),*) => {$(
        // SAFETY: arguments are unboxed with this type's FromDatum, as pgrx's own JsonB is.
        unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for $t {
            unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
                let index = arg.index();
                // SAFETY: pgrx calls this for an argument of this SQL type (jsonb).
                unsafe {
                    arg.unbox_arg_using_from_datum()
                        .unwrap_or_else(|| panic!("argument {index} must not be null"))
                }
            }
            unsafe fn unbox_nullable_arg(arg: pgrx::callconv::Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
                // SAFETY: as above; NULL is handled by FromDatum.
                unsafe { arg.unbox_arg_using_from_datum().into() }
            }
        }
    )*};
}
arg_jsonb!(RawJsonb, JsonbArg);

/// A jsonb datum (palloc'd in the current memory context) holding `container` bytes.
pub fn jsonb_datum(container: &[u8]) -> pg_sys::Datum {
    // SAFETY: a fresh palloc of header + bytes; the copy stays within it.
    unsafe {
        let total = container.len() + pg_sys::VARHDRSZ;
        let p = pg_sys::palloc(total) as *mut pg_sys::varlena;
        pgrx::set_varsize_4b(p, total as i32);
        std::ptr::copy_nonoverlapping(container.as_ptr(), (p as *mut u8).add(pg_sys::VARHDRSZ), container.len());
        pg_sys::Datum::from(p)
    }
}

/// A detoasted jsonb argument, read in place (for `push_batch`'s items).
#[derive(Clone, Copy)]
pub struct JsonbArg(*mut pg_sys::Jsonb);

impl FromDatum for JsonbArg {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        if is_null {
            None
        } else {
            // Full detoast: a 4-byte header keeps the container aligned for PostgreSQL's
            // jsonb accessors.
            // SAFETY: a non-null jsonb datum of the current call.
            unsafe { Some(JsonbArg(pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::Jsonb)) }
        }
    }
}

impl IntoDatum for JsonbArg {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(pg_sys::Datum::from(self.0))
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

/// A value found inside a jsonb container.
pub enum Found {
    /// A string (its UTF-8 bytes).
    Str(String),
    /// JSON null.
    Null,
    /// Anything else, as JSON text (for error messages).
    Other(String),
}

/// A value's JSON text, for error messages (never on a hot path).
fn value_text(v: &mut pg_sys::JsonbValue) -> String {
    // SAFETY: `v` is a value PostgreSQL's accessors filled; JsonbValueToJsonb returns a
    // palloc'd varlena whose header gives its length.
    unsafe {
        let jb = pg_sys::JsonbValueToJsonb(v) as *const pg_sys::varlena;
        let len = pgrx::varsize_any_exhdr(jb);
        let data = pgrx::vardata_any(jb) as *const u8;
        // (The bytes JsonbValueToJsonb built: well-formed.)
        to_text(std::slice::from_raw_parts(data, len))
    }
}

impl JsonbArg {
    fn root(&self) -> *mut pg_sys::JsonbContainer {
        // SAFETY: self.0 is a detoasted jsonb (FromDatum), valid for the call.
        unsafe { &raw mut (*self.0).root }
    }

    /// The number of elements when the value is an array (not a raw scalar), else None.
    pub fn array_len(&self) -> Option<u32> {
        // SAFETY: the root container of a valid jsonb.
        let h = unsafe { (*self.root()).header };
        (h & pg_sys::JB_FARRAY != 0 && h & pg_sys::JB_FSCALAR == 0).then_some(h & pg_sys::JB_CMASK)
    }

    /// Element `i` of the top-level array when it is an object; else its JSON text.
    pub fn object_at(&self, i: u32) -> Result<JsonbObject, String> {
        // SAFETY: PostgreSQL's accessor on a valid container returns NULL or a palloc'd
        // value; a binary value's data points into the same container.
        unsafe {
            let v = pg_sys::getIthJsonbValueFromContainer(self.root(), i);
            if v.is_null() {
                return Err("nothing".into());
            }
            let v = &mut *v;
            if v.type_ == pg_sys::jbvType::jbvBinary && (*v.val.binary.data).header & pg_sys::JB_FOBJECT != 0 {
                Ok(JsonbObject(v.val.binary.data))
            } else {
                Err(value_text(v))
            }
        }
    }
}

/// An object inside a jsonb value.
pub struct JsonbObject(*mut pg_sys::JsonbContainer);

impl JsonbObject {
    /// Raises 22023 naming `argument` when the object has a key outside `allowed`.
    /// `present` is how many of the allowed keys the caller found: only when the object
    /// holds more keys than that is there one to name (the iterator is not free, so it
    /// stays off the common path).
    pub fn reject_unknown_keys(&self, allowed: &[&str], present: usize, argument: &str) {
        if self.key_count() > present {
            let k = self.unknown_key(allowed).unwrap_or_default();
            errors::invalid(argument, format_args!("unknown key {k:?} (allowed: {})", allowed.join(", ")));
        }
    }

    /// How many keys the object has.
    pub fn key_count(&self) -> usize {
        // SAFETY: self.0 points into a valid jsonb container (object_at).
        (unsafe { (*self.0).header } & pg_sys::JB_CMASK) as usize
    }

    fn get_value(&self, key: &str) -> Option<pg_sys::JsonbValue> {
        // SAFETY: a lookup by key (pointer and length) in a valid container into a zeroed
        // value that PostgreSQL fills.
        unsafe {
            let mut res: pg_sys::JsonbValue = std::mem::zeroed();
            let found = pg_sys::getKeyJsonValueFromContainer(
                self.0,
                key.as_ptr() as *const std::ffi::c_char,
                key.len() as i32,
                &mut res,
            );
            (!found.is_null()).then_some(res)
        }
    }

    /// The value at `key`: None when the key is absent. A string that is not UTF-8 (only
    /// a database of another encoding can hold one: an install older than queen's UTF8
    /// rule) is refused with 22021, not mended: two different ids must not read as one.
    pub fn get(&self, key: &str) -> Option<Found> {
        let mut v = self.get_value(key)?;
        Some(match v.type_ {
            pg_sys::jbvType::jbvString => {
                // SAFETY: a string value's pointer and length, inside the container.
                let s = unsafe { std::slice::from_raw_parts(v.val.string.val as *const u8, v.val.string.len as usize) };
                match std::str::from_utf8(s) {
                    Ok(s) => Found::Str(s.to_owned()),
                    Err(_) => errors::raise(
                        pgrx::PgSqlErrorCode::ERRCODE_CHARACTER_NOT_IN_REPERTOIRE,
                        format!("queen: the value of \"{key}\" is not valid UTF-8 (queen needs a UTF8 database)"),
                    ),
                }
            }
            pg_sys::jbvType::jbvNull => Found::Null,
            _ => Found::Other(value_text(&mut v)),
        })
    }

    /// The value at `key` as jsonb bytes (any JSON value, null included).
    pub fn get_jsonb(&self, key: &str) -> Option<Vec<u8>> {
        let mut v = self.get_value(key)?;
        // SAFETY: as value_text; the palloc'd copy is freed after the bytes are taken.
        unsafe {
            let jb = pg_sys::JsonbValueToJsonb(&mut v) as *const pg_sys::varlena;
            let len = pgrx::varsize_any_exhdr(jb);
            let data = pgrx::vardata_any(jb) as *const u8;
            let out = copy_fallibly(std::slice::from_raw_parts(data, len));
            pg_sys::pfree(jb as *mut std::ffi::c_void);
            Some(out)
        }
    }

    /// The first key not in `allowed`, if any (for error messages).
    fn unknown_key(&self, allowed: &[&str]) -> Option<String> {
        // SAFETY: PostgreSQL's iterator over a valid container; key values point into it.
        unsafe {
            let mut it = pg_sys::JsonbIteratorInit(self.0);
            let mut v: pg_sys::JsonbValue = std::mem::zeroed();
            loop {
                let tok = pg_sys::JsonbIteratorNext(&mut it, &mut v, true);
                match tok {
                    pg_sys::JsonbIteratorToken::WJB_DONE => return None,
                    pg_sys::JsonbIteratorToken::WJB_KEY => {
                        let s = std::slice::from_raw_parts(v.val.string.val as *const u8, v.val.string.len as usize);
                        let key = String::from_utf8_lossy(s).into_owned();
                        if !allowed.contains(&key.as_str()) {
                            return Some(key);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// The text of jsonb bytes, for error messages only (never on a hot path).
///
/// # Safety
/// `container` is a well-formed jsonb container: bytes PostgreSQL produced (an argument's,
/// or stored ones), never arbitrary input, which `jsonb_out` would read out of bounds.
pub unsafe fn to_text(container: &[u8]) -> String {
    // SAFETY: jsonb_out on a jsonb datum of well-formed container bytes (the caller's
    // promise), palloc'd by `jsonb_datum`.
    unsafe {
        let d = jsonb_datum(container);
        let c = pgrx::direct_function_call::<&std::ffi::CStr>(pg_sys::jsonb_out, &[Some(d)]);
        c.map(|c| c.to_string_lossy().into_owned()).unwrap_or_else(|| errors::internal("jsonb_out returned NULL"))
    }
}

/// The string at `key` of jsonb bytes that hold an object: None when they hold no object,
/// the key is absent or its value is not a string. A scan for the key's bytes comes
/// first, so objects without it (nearly all) cost no copy.
pub fn string_at(container: &[u8], key: &str) -> Option<String> {
    match value_at(container, key) {
        Some(Found::Str(s)) => Some(s),
        _ => None,
    }
}

/// The value at `key` of jsonb bytes that hold an object (None: no object, or no such
/// key), looked up as `string_at` does.
pub fn value_at(container: &[u8], key: &str) -> Option<Found> {
    if !is_object(container) || !container.windows(key.len()).any(|w| w == key.as_bytes()) {
        return None;
    }
    // SAFETY: `jsonb_datum` copies the bytes into a palloc'd (so aligned) jsonb whose
    // root is the object container; the lookup reads inside it and copies what it returns;
    // the copy is freed after.
    unsafe {
        let d = jsonb_datum(container);
        let jb = d.cast_mut_ptr::<pg_sys::Jsonb>();
        let found = JsonbObject(&raw mut (*jb).root).get(key);
        pg_sys::pfree(jb.cast());
        found
    }
}

/// Whether jsonb bytes hold an object (not an array or a scalar).
pub fn is_object(container: &[u8]) -> bool {
    // The container starts with its header word, in the server's byte order.
    container.get(..4).map(|h| u32::from_ne_bytes(h.try_into().unwrap()) & pg_sys::JB_FOBJECT != 0).unwrap_or(false)
}
