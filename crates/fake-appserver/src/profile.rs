//! Which codex release the fake behaves like.

use std::fmt;
use std::str::FromStr;

use rethread_protocol::HistoryMode;
use serde::{Deserialize, Serialize};

/// The codex release the fake imitates.
///
/// | profile | like | new threads | `excludeTurns` | paginated threads | writer lock | `historyMode` field |
/// |---|---|---|---|---|---|---|
/// | [`Profile::Current`] | 0.171.0 (and 0.169.0) | paginated | served | served | yes | yes |
/// | [`Profile::ReleaseN`] | 0.144.6 | legacy | needs `experimentalApi` | listed and readable without turns; resume and reads with turns fail `-32601` | no | yes |
/// | [`Profile::PreHistoryMode`] | older | legacy | needs `experimentalApi` | as `release-n` | no | absent |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// Like codex 0.171.0, the current release. The parity suite finds no difference between
    /// 0.171.0 and 0.169.0 in anything it observes, so this profile stands for both (there is no
    /// separate profile for 0.169.0).
    #[default]
    Current,
    /// Like codex 0.144.6, the compatibility floor.
    ReleaseN,
    /// A release older than the `historyMode` field: threads carry no `historyMode` at all.
    PreHistoryMode,
}

impl Profile {
    /// Every profile.
    pub const ALL: [Profile; 3] = [Profile::Current, Profile::ReleaseN, Profile::PreHistoryMode];

    /// The kebab-case name (`current`, `release-n`, `pre-history-mode`).
    pub fn name(self) -> &'static str {
        match self {
            Profile::Current => "current",
            Profile::ReleaseN => "release-n",
            Profile::PreHistoryMode => "pre-history-mode",
        }
    }

    /// The codex version it reports (`cliVersion`, user agent).
    pub fn cli_version(self) -> &'static str {
        match self {
            Profile::Current => "0.171.0",
            Profile::ReleaseN => "0.144.6",
            Profile::PreHistoryMode => "0.120.0",
        }
    }

    /// The history mode of a thread started without asking for one.
    pub fn default_history_mode(self) -> HistoryMode {
        match self {
            Profile::Current => HistoryMode::Paginated,
            _ => HistoryMode::Legacy,
        }
    }

    /// Whether paginated threads can be resumed and fully read.
    pub fn serves_paginated(self) -> bool {
        self == Profile::Current
    }

    /// Whether `thread/resume.excludeTurns` needs the `experimentalApi` capability.
    pub fn exclude_turns_is_experimental(self) -> bool {
        self != Profile::Current
    }

    /// Whether `thread/turns/list` needs the `experimentalApi` capability.
    pub fn turns_list_is_experimental(self) -> bool {
        self != Profile::Current
    }

    /// Whether one process holding a thread locks other processes out of resuming it.
    pub fn has_writer_lock(self) -> bool {
        self == Profile::Current
    }

    /// Whether threads carry `historyMode` (on the wire and in `session_meta`).
    pub fn has_history_mode(self) -> bool {
        self != Profile::PreHistoryMode
    }

    /// Whether notifications carry a top-level `emittedAtMs`.
    pub fn emits_timestamps(self) -> bool {
        self == Profile::Current
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Profile {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown profile `{s}` (current, release-n, pre-history-mode)"))
    }
}
