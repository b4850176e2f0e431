//! [`ThreadId`]: a codex thread id in its one canonical form.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// A codex thread id, spelled one way. codex reads a thread id with `uuid::Uuid::parse_str`, so
/// one thread has many spellings (upper case, 32 hex digits without hyphens, in braces,
/// `urn:uuid:...`) and it always writes the lower-case hyphenated one. `ThreadId` reads every
/// spelling codex reads as that one; text that is not a UUID is kept as given (codex refuses
/// it as an id: `invalid session id`, and `codex exec resume` looks it up as a thread name).
///
/// ```
/// use rethread_protocol::ThreadId;
///
/// let id = ThreadId::new("0199A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B");
/// assert_eq!(id.as_str(), "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b");
/// assert_eq!(ThreadId::new("urn:uuid:0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"), id);
/// assert_eq!(ThreadId::new("0199a1b2c3d47e5f8a9b0c1d2e3f4a5b"), id);
/// assert!(id.is_uuid() && !ThreadId::new("thr_1").is_uuid());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ThreadId(String);

impl ThreadId {
    /// `id` in its canonical form (see the type's docs).
    pub fn new(id: &str) -> ThreadId {
        match uuid::Uuid::parse_str(id) {
            Ok(uuid) => ThreadId(uuid.hyphenated().to_string()),
            Err(_) => ThreadId(id.to_string()),
        }
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether it is a UUID (codex's ids are; any other text names no thread to codex's
    /// app-server).
    pub fn is_uuid(&self) -> bool {
        uuid::Uuid::try_parse(&self.0).is_ok()
    }
}

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<ThreadId> for String {
    fn from(id: ThreadId) -> String {
        id.0
    }
}

impl PartialEq<str> for ThreadId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl<'de> Deserialize<'de> for ThreadId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(ThreadId::new(&String::deserialize(deserializer)?))
    }
}

/// Reads a thread id member as its canonical text (`#[serde(deserialize_with = ...)]` on the
/// `String` members of the typed messages): every id that enters is spelled one way.
pub(crate) fn canonical<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    ThreadId::deserialize(deserializer).map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_codex_reads_is_one_id() {
        let canonical = "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
        for spelling in [
            canonical,
            "0199A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B",
            "0199a1b2c3d47e5f8a9b0c1d2e3f4a5b",
            "0199A1B2C3D47E5F8A9B0C1D2E3F4A5B",
            "{0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b}",
            "urn:uuid:0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
            "URN:UUID:0199A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B",
        ] {
            let id = ThreadId::new(spelling);
            assert_eq!(id.as_str(), canonical, "{spelling}");
            let read: ThreadId = serde_json::from_value(serde_json::json!(spelling)).unwrap();
            assert_eq!(read, id);
        }
        for other in [
            "thr_1",
            "",
            "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5",
            " {canonical} ",
        ] {
            assert_eq!(ThreadId::new(other).as_str(), other);
            assert!(!ThreadId::new(other).is_uuid());
        }
    }
}
