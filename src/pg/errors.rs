//! Errors with the SQLSTATEs of docs/errors.md. Every function raises through these, so a
//! message always names the argument and the bad value.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

/// 22023 invalid_parameter_value: `argument` got a value it cannot take.
pub fn invalid(argument: &str, detail: impl std::fmt::Display) -> ! {
    raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, format!("queen: invalid {argument}: {detail}"))
}

/// Raises a policy violation: 22023 for a value an argument cannot take, 54000 for one past
/// a documented limit; the text is the policy's.
pub fn violation(v: queen_core::policy::Violation) -> ! {
    let code = match v.kind {
        queen_core::policy::ViolationKind::Invalid => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        queen_core::policy::ViolationKind::TooBig => PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
    };
    raise(code, v.message())
}

/// 22004 null_value_not_allowed.
pub fn null_arg(argument: &str) -> ! {
    raise(PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, format!("queen: {argument} must not be NULL"))
}

/// XX001 data_corrupted: stored bytes that the codec refuses.
pub fn corrupted(detail: impl std::fmt::Display) -> ! {
    raise(PgSqlErrorCode::ERRCODE_DATA_CORRUPTED, format!("queen: corrupt segment: {detail}"))
}

/// XX000 internal_error: an SPI call failed in a way PostgreSQL did not report itself.
pub fn internal(detail: impl std::fmt::Display) -> ! {
    raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("queen: internal error: {detail}"))
}

/// At most the first 100 characters of a value quoted in an error message (a bad value
/// may be megabytes long), with `…` when cut.
pub fn excerpt(text: &str) -> String {
    match text.char_indices().nth(100) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

pub fn raise(code: PgSqlErrorCode, message: String) -> ! {
    ErrorReport::new(code, message, "queen").report(PgLogLevel::ERROR);
    unreachable!()
}

/// Unwraps an SPI result, turning a pgrx-level SPI failure into an internal ERROR.
pub trait SpiExt<T> {
    fn or_raise(self) -> T;
}

impl<T> SpiExt<T> for Result<T, pgrx::spi::SpiError> {
    fn or_raise(self) -> T {
        match self {
            Ok(v) => v,
            Err(e) => internal(e),
        }
    }
}

/// Refuses (`0A000`) a call that needs READ COMMITTED: one whose statements must each see
/// what committed up to then (`why`), which a REPEATABLE READ or SERIALIZABLE snapshot
/// does not.
pub fn read_committed_only(call: &str, why: &str) {
    if fixed_snapshot() {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("queen: {call} needs READ COMMITTED: under REPEATABLE READ or SERIALIZABLE {why}"),
        );
    }
}

/// Whether the transaction reads every statement with one snapshot (REPEATABLE READ or
/// SERIALIZABLE), which may predate commits it must act on.
pub fn fixed_snapshot() -> bool {
    // SAFETY: a plain read of the transaction's isolation level.
    unsafe { pgrx::pg_sys::XactIsoLevel >= pgrx::pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// Raises `40001`: under a fixed snapshot, the call must act on a commit its snapshot
/// does not see (`what`); the transaction is to be retried.
pub fn serialization_failure(what: &str) -> ! {
    raise(PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE, format!("queen: could not serialize access: {what}"))
}

/// Refuses, with `25006` as PostgreSQL refuses a write there, a call that changes queen's
/// state in a read-only transaction: on a server in recovery (a hot standby: `queen: {call}
/// {does}, which a server in recovery (a standby) cannot do; {call} on the primary`), or
/// in a transaction declared READ ONLY. A standby's shared memory is its own, not the
/// primary's: a lease claimed, an offset reserved or a cursor moved there would hold nothing
/// back on the primary. And queen writes its hottest rows directly (`heap`), past the
/// executor's read-only check. Call it before anything is touched.
pub fn refuse_read_only(call: &str, does: &str) {
    if crate::pg::shmem::in_recovery() {
        raise(
            PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
            format!("queen: {call} {does}, which a server in recovery (a standby) cannot do; {call} on the primary"),
        );
    }
    // SAFETY: a plain read of the current transaction's read-only flag.
    if unsafe { pgrx::pg_sys::XactReadOnly } {
        raise(
            PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
            format!("queen: {call} {does}, which a read-only transaction cannot do"),
        );
    }
}

/// Raises 55000 from a C symbol that an older release's SQL still names: the database has
/// not run `ALTER EXTENSION queen UPDATE` since the library was upgraded.
pub fn older_sql() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "queen: this database has the SQL of an older queen than the library installed; run ALTER EXTENSION queen UPDATE"
            .to_string(),
    )
}
