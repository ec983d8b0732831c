//! Errors with the SQLSTATEs the spec names. Every function raises through these, so a
//! message always names the argument and the bad value.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

/// 22023 invalid_parameter_value: `argument` got a value it cannot take.
pub fn invalid(argument: &str, detail: impl std::fmt::Display) -> ! {
    raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, format!("queen: invalid {argument}: {detail}"))
}

/// 22004 null_value_not_allowed.
/// An argument past one of queen's documented limits (54000, program_limit_exceeded).
pub fn too_big(argument: &str, detail: impl std::fmt::Display) -> ! {
    raise(PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED, format!("queen: {argument} is too large: {detail}"))
}

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

/// Checks a queue name (spec §1), raising 22023 with the argument name.
pub fn check_queue_name(argument: &str, name: &str) {
    if let Err(e) = queen_core::names::queue_name(name) {
        invalid(argument, format_args!("{name:?} {e}"));
    }
}

/// Checks a partition or consumer-group name, raising 22023 with the argument name.
pub fn check_lane_name(argument: &str, name: &str) {
    if let Err(e) = queen_core::names::lane_name(name) {
        invalid(argument, format_args!("{name:?} {e}"));
    }
}
