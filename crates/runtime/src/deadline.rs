//! Deadlines from the limits a host sets.

use std::time::Duration;

/// What the longest timeout or wait stands for: a century. "No limit" (`Duration::MAX`) is a
/// value hosts pass, and an `Instant` moved by it would overflow (a panic).
const NO_LIMIT: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// `now + wait`, `wait` capped at a century, so that a limit of `Duration::MAX` means no
/// limit instead of a panic.
pub(crate) fn after<I: std::ops::Add<Duration, Output = I>>(now: I, wait: Duration) -> I {
    now + wait.min(NO_LIMIT)
}
