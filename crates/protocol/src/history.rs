//! Codex's thread history contract.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The persisted history contract of a codex thread (`historyMode` on the wire). A `Thread`
/// without the field is [`HistoryMode::Legacy`]; a value this crate does not know is kept as
/// [`HistoryMode::Unknown`] and **never** read as legacy (codex refuses to resume it).
///
/// ```
/// use rethread_protocol::HistoryMode;
/// let mode: HistoryMode = serde_json::from_str(r#""segmented""#).unwrap();
/// assert_eq!(mode, HistoryMode::Unknown("segmented".into()));
/// assert!(!mode.is_legacy());
/// assert_eq!(serde_json::to_string(&mode).unwrap(), r#""segmented""#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum HistoryMode {
    /// The whole history lives in one rollout; every codex release can serve it.
    #[default]
    Legacy,
    /// Paginated history (the default since 0.169.0); older releases refuse to resume it.
    Paginated,
    /// A mode this crate does not know, kept verbatim.
    Unknown(String),
}

impl HistoryMode {
    /// The wire spelling.
    pub fn as_str(&self) -> &str {
        match self {
            HistoryMode::Legacy => "legacy",
            HistoryMode::Paginated => "paginated",
            HistoryMode::Unknown(other) => other,
        }
    }

    /// Parses the wire spelling; anything unrecognised is [`HistoryMode::Unknown`].
    pub fn parse(value: &str) -> Self {
        match value {
            "legacy" => HistoryMode::Legacy,
            "paginated" => HistoryMode::Paginated,
            other => HistoryMode::Unknown(other.to_string()),
        }
    }

    /// True only for [`HistoryMode::Legacy`]; an unknown mode is not legacy.
    pub fn is_legacy(&self) -> bool {
        matches!(self, HistoryMode::Legacy)
    }
}

impl fmt::Display for HistoryMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for HistoryMode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for HistoryMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(HistoryMode::parse(&String::deserialize(deserializer)?))
    }
}
