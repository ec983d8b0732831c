//! Name checks on SQL arguments: the rules of `queen_core::names`, raised as 22023 with the
//! argument's name.

use crate::pg::errors::{excerpt, invalid};

/// Checks a queue name, raising 22023 with the argument name.
pub fn check_queue_name(argument: &str, name: &str) {
    if let Err(e) = queen_core::names::queue_name(name) {
        invalid(argument, format_args!("{:?} {e}", excerpt(name)));
    }
}

/// Checks a partition or consumer-group name, raising 22023 with the argument name.
pub fn check_lane_name(argument: &str, name: &str) {
    if let Err(e) = queen_core::names::lane_name(name) {
        invalid(argument, format_args!("{:?} {e}", excerpt(name)));
    }
}
