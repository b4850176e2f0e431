//! The codex releases the project is tested against, defined once for the whole repository
//! in `codex-releases.txt` at the workspace root (`cargo xtask ci` reads the same file).
//!
//! A test about "the current release" loops over [`recent_releases`] (current and previous);
//! one about every supported release over [`supported_releases`]; a test that needs one
//! particular role (a thread written by the current release and opened by the floor) names
//! [`CURRENT`], [`PREVIOUS`] or [`FLOOR`].
//!
//! `RETHREAD_CODEX_RELEASES=V[,V...]` replaces the releases [`recent_releases`] and
//! [`supported_releases`] return, so the same suites judge any release
//! (`cargo xtask codex-check --version V` sets it).

/// The text of `codex-releases.txt`.
const RELEASES_FILE: &str = include_str!("../../../codex-releases.txt");

/// The newest release the project is proven against.
pub const CURRENT: &str = role_version(RELEASES_FILE, "current");
/// The release before [`CURRENT`]: a host may still run it, and threads cross between the two.
pub const PREVIOUS: &str = role_version(RELEASES_FILE, "previous");
/// The compatibility floor: the oldest release supported, older than paginated-by-default
/// threads (it lists them but refuses to resume them).
pub const FLOOR: &str = role_version(RELEASES_FILE, "floor");
/// Every supported release, newest first.
pub const SUPPORTED: [&str; 3] = [CURRENT, PREVIOUS, FLOOR];

/// The environment variable that replaces the releases under test (comma-separated).
pub const RELEASES_VAR: &str = "RETHREAD_CODEX_RELEASES";

/// The releases a test about "the current release" runs against: [`CURRENT`] and
/// [`PREVIOUS`], or those named by [`RELEASES_VAR`].
pub fn recent_releases() -> Vec<String> {
    releases_or_override(&[CURRENT, PREVIOUS])
}

/// The releases a test about every supported release runs against: [`SUPPORTED`], or those
/// named by [`RELEASES_VAR`].
pub fn supported_releases() -> Vec<String> {
    releases_or_override(&SUPPORTED)
}

fn releases_or_override(default: &[&str]) -> Vec<String> {
    match std::env::var(RELEASES_VAR) {
        Ok(list) if !list.trim().is_empty() => list
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .collect(),
        _ => default.iter().map(|v| v.to_string()).collect(),
    }
}

/// The version on the line `<role> <version>` of `text`, at compile time: a missing or
/// malformed line stops the build instead of testing against a guessed release.
const fn role_version(text: &'static str, role: &str) -> &'static str {
    let bytes = text.as_bytes();
    let key = role.as_bytes();
    let mut start = 0;
    while start < bytes.len() {
        let mut end = start;
        while end < bytes.len() && bytes[end] != b'\n' {
            end += 1;
        }
        if line_has_key(bytes, start, end, key) {
            let mut from = start + key.len();
            while from < end && bytes[from] == b' ' {
                from += 1;
            }
            let mut to = end;
            while to > from && (bytes[to - 1] == b' ' || bytes[to - 1] == b'\r') {
                to -= 1;
            }
            if to == from {
                panic!("codex-releases.txt: a role without a version");
            }
            let (_, tail) = bytes.split_at(from);
            let (version, _) = tail.split_at(to - from);
            return match core::str::from_utf8(version) {
                Ok(version) => version,
                Err(_) => panic!("codex-releases.txt is not UTF-8"),
            };
        }
        start = end + 1;
    }
    panic!("codex-releases.txt lacks a role (current, previous, floor)")
}

/// Whether the line `bytes[start..end]` starts with `key` followed by a space.
const fn line_has_key(bytes: &[u8], start: usize, end: usize, key: &[u8]) -> bool {
    if end - start <= key.len() || bytes[start + key.len()] != b' ' {
        return false;
    }
    let mut i = 0;
    while i < key.len() {
        if bytes[start + i] != key[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_names_three_distinct_releases_newest_first() {
        let parse = |v: &str| -> Vec<u32> { v.split('.').map(|n| n.parse().unwrap()).collect() };
        assert!(parse(CURRENT) > parse(PREVIOUS), "{CURRENT} vs {PREVIOUS}");
        assert!(parse(PREVIOUS) > parse(FLOOR), "{PREVIOUS} vs {FLOOR}");
    }

    #[test]
    fn the_fake_profiles_report_the_releases_they_imitate() {
        use rethread_fake_appserver::Profile;
        assert_eq!(Profile::Current.cli_version(), CURRENT);
        assert_eq!(Profile::ReleaseN.cli_version(), FLOOR);
    }

    #[test]
    fn roles_are_matched_whole_and_trimmed() {
        const TEXT: &str = "# comment\ncurrently 9.9.9\ncurrent  1.2.3 \r\nfloor 0.1.0";
        assert_eq!(role_version(TEXT, "current"), "1.2.3");
        assert_eq!(role_version(TEXT, "floor"), "0.1.0");
    }
}
