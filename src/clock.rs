//! The clock leases are judged by, and its conversion to `timestamptz`.

/// Current wall-clock time in microseconds since 2000-01-01, the clock of
/// `clock_timestamp()`. Leases use it, not `now()`: a pop or ack inside a long
/// transaction must judge expiry by the real time.
pub fn clock_now() -> i64 {
    // SAFETY: a plain clock read.
    unsafe { pgrx::pg_sys::GetCurrentTimestamp() }
}

pub fn timestamptz(micros: i64) -> pgrx::datum::TimestampWithTimeZone {
    pgrx::datum::TimestampWithTimeZone::try_from(micros).unwrap_or_else(|_| crate::errors::invalid("timestamp", micros))
}
