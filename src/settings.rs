//! Settings that bound what callers may ask for. (The others still live beside the code
//! that reads them; see docs/concepts.md, "Settings", for the full list.)

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use queen_core::policy::limits::MAX_LEASE_DEFAULT;

/// `queen.max_lease`: the longest lease a pop may take and an extension may ask for, in
/// seconds (default 12 hours, as SQS's longest visibility timeout). Only a superuser sets
/// it (or `ALTER SYSTEM`): a consumer must not be able to pin lease slots for ever.
static MAX_LEASE: GucSetting<i32> = GucSetting::<i32>::new(MAX_LEASE_DEFAULT);

/// Called from `_PG_init`.
pub fn init() {
    GucRegistry::define_int_guc(
        c"queen.max_lease",
        c"The longest lease a pop may take, and an extend_lease may ask for (seconds).",
        c"Longer lease_seconds, extend_lease seconds or configure lease_time are refused (22023); \
          a queue's lease_time or a group's budget beyond it is cut to it.",
        &MAX_LEASE,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
}

/// `queen.max_lease`, in seconds.
pub fn max_lease() -> i32 {
    MAX_LEASE.get()
}
