//! The clock leases are judged by, and its conversion to `timestamptz`.

/// Current wall-clock time in microseconds since 2000-01-01, the clock of
/// `clock_timestamp()`. Leases use it, not `now()`: a pop or ack inside a long
/// transaction must judge expiry by the real time.
pub fn clock_now() -> i64 {
    // SAFETY: a plain clock read.
    unsafe { pgrx::pg_sys::GetCurrentTimestamp() }
}

pub fn timestamptz(micros: i64) -> pgrx::datum::TimestampWithTimeZone {
    pgrx::datum::TimestampWithTimeZone::try_from(micros)
        .unwrap_or_else(|_| crate::pg::errors::invalid("timestamp", micros))
}

/// Microseconds in an interval argument, refusing months (their length is not fixed),
/// negative intervals, and intervals whose microseconds do not fit in 64 bits (22023,
/// naming `argument`). Days and time are summed exactly: a saturated sum could come back
/// into range (`2147483647 days` minus nearly as many hours read as one hour) and be
/// stored as given, which the SQL readers of the stored interval then fail to convert.
pub fn interval_micros(argument: &str, v: pgrx::datum::Interval) -> i64 {
    if v.months() != 0 {
        crate::pg::errors::invalid(argument, format_args!("{v} (months have no fixed length; use days or less)"));
    }
    let exact = i128::from(v.days()) * i128::from(86_400 * queen_core::lease::MICROS) + i128::from(v.micros());
    let m = i64::try_from(exact)
        .unwrap_or_else(|_| crate::pg::errors::invalid(argument, format_args!("{v} (out of range)")));
    if m < 0 {
        crate::pg::errors::invalid(argument, format_args!("{v} (must not be negative)"));
    }
    m
}
