//! Name rules for queues, partitions and consumer groups (docs/concepts.md, "Names").

/// Longest name accepted for a queue, partition or consumer group.
pub const MAX_NAME: usize = 200;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    Empty,
    TooLong(usize),
    BadChar(char),
}

impl std::fmt::Display for NameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameError::Empty => write!(f, "must not be empty"),
            NameError::TooLong(n) => write!(f, "is {n} characters long (at most {MAX_NAME})"),
            NameError::BadChar(c) => write!(f, "contains the character {c:?}"),
        }
    }
}

fn check(name: &str, ok: impl Fn(char) -> bool) -> Result<(), NameError> {
    let n = name.chars().count();
    if n == 0 {
        return Err(NameError::Empty);
    }
    if n > MAX_NAME {
        return Err(NameError::TooLong(n));
    }
    match name.chars().find(|&c| !ok(c)) {
        Some(c) => Err(NameError::BadChar(c)),
        None => Ok(()),
    }
}

/// Queue names: 1–200 characters of `[A-Za-z0-9._:-]` (letters, digits, `.`, `_`, `:`, `-`).
pub fn queue_name(name: &str) -> Result<(), NameError> {
    check(name, |c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
}

/// Partition and consumer-group names: 1–200 characters of `[A-Za-z0-9._:@/+=#-]` plus `_`
/// (the default group is `__QUEUE_MODE__`, and partition keys are often ids like `user_42`).
pub fn lane_name(name: &str) -> Result<(), NameError> {
    check(name, |c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-' | '@' | '/' | '+' | '=' | '#'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names() {
        assert!(queue_name("orders").is_ok());
        assert!(queue_name("a.b:c-D9").is_ok());
        assert_eq!(queue_name(""), Err(NameError::Empty));
        assert_eq!(queue_name("a b"), Err(NameError::BadChar(' ')));
        assert!(queue_name("order_events.v1").is_ok());
        assert_eq!(queue_name("a/b"), Err(NameError::BadChar('/')));
        assert_eq!(queue_name("x'; drop"), Err(NameError::BadChar('\'')));
        assert!(queue_name(&"a".repeat(200)).is_ok());
        assert_eq!(queue_name(&"a".repeat(201)), Err(NameError::TooLong(201)));
    }

    #[test]
    fn lane_names() {
        assert!(lane_name("__QUEUE_MODE__").is_ok());
        assert!(lane_name("Default").is_ok());
        assert!(lane_name("user_42/eu+1").is_ok());
        assert_eq!(lane_name("é"), Err(NameError::BadChar('é')));
        assert_eq!(lane_name("a\0"), Err(NameError::BadChar('\0')));
    }
}
