//! Small helpers: codex-like ids, timestamps (jiff) and id validation, a temporary home.

use std::time::{SystemTime, UNIX_EPOCH};

use uuid::Uuid;

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A fresh UUIDv7 (time-ordered, like codex's thread and turn ids).
pub(crate) fn new_id() -> String {
    Uuid::now_v7().to_string()
}

/// Validates a thread id the way codex's UUID parser does, returning its error text
/// (e.g. ``invalid character: expected an optional prefix of `urn:uuid:` followed by
/// [0-9a-fA-F-], found `n` at 1``). Written out rather than delegated to the `uuid` crate:
/// the release of `uuid` this workspace builds with words its errors differently
/// (``invalid character: found `n` at 0``), and codex's wording is what clients see.
pub(crate) fn check_uuid(id: &str) -> Result<(), String> {
    let body = id.strip_prefix("urn:uuid:").unwrap_or(id);
    let offset = id.len() - body.len();
    let body_trimmed = body
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .unwrap_or(body);
    for (index, c) in body_trimmed.chars().enumerate() {
        if !(c.is_ascii_hexdigit() || c == '-') {
            return Err(format!(
                "invalid character: expected an optional prefix of `urn:uuid:` followed by \
                 [0-9a-fA-F-], found `{c}` at {}",
                offset + index + 1
            ));
        }
    }
    let groups: Vec<&str> = body_trimmed.split('-').collect();
    if groups.len() == 1 {
        if body_trimmed.len() == 32 {
            return Ok(());
        }
        return Err(format!(
            "invalid length: expected length 32 for simple format, found {}",
            body_trimmed.len()
        ));
    }
    if groups.len() != 5 {
        return Err(format!(
            "invalid group count: expected 5, found {}",
            groups.len()
        ));
    }
    for (index, (group, expected)) in groups.iter().zip([8, 4, 4, 4, 12]).enumerate() {
        if group.len() != expected {
            return Err(format!(
                "invalid group length in group {index}: expected {expected}, found {}",
                group.len()
            ));
        }
    }
    Ok(())
}

/// A `CODEX_HOME` of the fake's own under the system's temporary directory, removed with
/// everything in it on drop (the builder's default when no home is given).
#[derive(Debug)]
pub(crate) struct TempHome {
    path: std::path::PathBuf,
}

impl TempHome {
    /// Creates a new, empty, private directory (`fake-codex-home-<unique>`).
    pub(crate) fn new() -> std::io::Result<TempHome> {
        let base = std::env::temp_dir();
        loop {
            let path = base.join(format!("fake-codex-home-{}", new_id()));
            let mut builder = std::fs::DirBuilder::new();
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            match builder.create(&path) {
                Ok(()) => return Ok(TempHome { path }),
                // Another process picked the same name: draw again.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The directory.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for TempHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A UTC calendar time split into fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Utc {
    pub(crate) year: i64,
    pub(crate) month: u32,
    pub(crate) day: u32,
    pub(crate) hour: u32,
    pub(crate) minute: u32,
    pub(crate) second: u32,
    pub(crate) millis: u32,
}

impl Utc {
    /// Converts milliseconds since the epoch (UTC, jiff's calendar). Times past jiff's range
    /// (year 9999) are clamped to its end.
    pub(crate) fn from_ms(ms: u64) -> Utc {
        let at = i64::try_from(ms)
            .ok()
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
            .unwrap_or(jiff::Timestamp::MAX);
        let t = jiff::tz::Offset::UTC.to_datetime(at);
        Utc {
            year: i64::from(t.year()),
            month: t.month() as u32,
            day: t.day() as u32,
            hour: t.hour() as u32,
            minute: t.minute() as u32,
            second: t.second() as u32,
            millis: t.millisecond() as u32,
        }
    }

    /// `2026-11-30T00:12:20.274Z`.
    pub(crate) fn rfc3339(&self) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            self.year, self.month, self.day, self.hour, self.minute, self.second, self.millis
        )
    }

    /// `2026-11-30T00-12-20`, as in rollout file names.
    pub(crate) fn file_stamp(&self) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}-{:02}-{:02}",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

/// Parses a UTC RFC 3339 time as codex writes it (`2026-11-30T00:12:20.274Z`, fraction
/// optional) into milliseconds since the epoch; `None` for anything else.
pub(crate) fn parse_rfc3339_ms(text: &str) -> Option<u64> {
    // Codex writes UTC with a `Z`; an offset or a date without a time is not its format.
    if !text.ends_with('Z') || !text.contains('T') {
        return None;
    }
    let at: jiff::Timestamp = text.parse().ok()?;
    u64::try_from(at.as_millisecond()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_valid_uuids_and_unique() {
        let a = new_id();
        let b = new_id();
        assert_ne!(a, b);
        assert_eq!(check_uuid(&a), Ok(()));
        assert_eq!(&a[14..15], "7");
    }

    #[test]
    fn malformed_ids_get_codex_messages() {
        assert_eq!(
            check_uuid("not-a-uuid").unwrap_err(),
            "invalid character: expected an optional prefix of `urn:uuid:` followed by \
             [0-9a-fA-F-], found `n` at 1"
        );
        assert!(check_uuid("abc").unwrap_err().starts_with("invalid length"));
    }

    #[test]
    fn rfc3339_parses_back_what_it_formats() {
        for ms in [0, 951_782_400_000, 1_795_997_540_274, 4_102_444_799_999] {
            assert_eq!(parse_rfc3339_ms(&Utc::from_ms(ms).rfc3339()), Some(ms));
        }
        assert_eq!(
            parse_rfc3339_ms("2026-11-30T00:12:20Z"),
            Some(1_795_997_540_000)
        );
        assert_eq!(parse_rfc3339_ms("2026-11-30 00:12:20"), None);
        assert_eq!(parse_rfc3339_ms("2026-13-30T00:12:20Z"), None);
    }

    #[test]
    fn calendar_conversion() {
        let t = Utc::from_ms(1_795_997_540_274);
        assert_eq!(t.rfc3339(), "2026-11-30T00:12:20.274Z");
        assert_eq!(t.file_stamp(), "2026-11-30T00-12-20");
        assert_eq!(Utc::from_ms(0).rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            Utc::from_ms(951_782_400_000).rfc3339(),
            "2000-02-29T00:00:00.000Z"
        );
    }
}
