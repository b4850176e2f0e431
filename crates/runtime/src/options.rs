use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rethread_protocol::messages::ThreadStartParams;
use rethread_store::DEFAULT_MIRROR_CAP;

use crate::machine::{MachineOptions, SeedOptions};
use crate::mirror::RolloutMirror;

/// The environment variable that turns the rollout mirror off (`off`) for every host that
/// builds its options from the defaults.
pub const MIRROR_ENV: &str = "RETHREAD_MIRROR";

/// Reads a [`MIRROR_ENV`] value: unset, empty, `on`, `1` or `true` mirror; `off`, `0` or
/// `false` do not; anything else is an error naming the value (the CLI refuses it, exit 2).
pub fn mirror_setting(value: Option<&std::ffi::OsStr>) -> Result<bool, String> {
    let Some(value) = value else {
        return Ok(true);
    };
    match value.to_str().map(str::to_ascii_lowercase).as_deref() {
        Some("" | "on" | "1" | "true") => Ok(true),
        Some("off" | "0" | "false") => Ok(false),
        _ => Err(format!("{MIRROR_ENV} must be `on` or `off`, not {value:?}")),
    }
}

/// The environment variable that sets the per-session cap of mirrored bytes
/// ([`BinderOptions::mirror_cap`]) for every host that builds its options from the defaults.
pub const MIRROR_CAP_ENV: &str = "RETHREAD_MIRROR_CAP";

/// Reads a [`MIRROR_CAP_ENV`] value: unset or empty is the default cap
/// ([`DEFAULT_MIRROR_CAP`], 1 GiB of rollout bytes); else as [`parse_mirror_cap`] reads it; anything else is
/// an error naming the variable and the value (the CLI refuses it, exit 2).
pub fn mirror_cap_setting(value: Option<&std::ffi::OsStr>) -> Result<u64, String> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(DEFAULT_MIRROR_CAP);
    };
    let refused = |why: String| format!("{MIRROR_CAP_ENV}: {why}");
    match value.to_str() {
        Some(text) => parse_mirror_cap(text).map_err(refused),
        None => Err(refused(format!("{value:?} is not UTF-8"))),
    }
}

/// Reads a cap of mirrored bytes as given (`--mirror-cap` and [`MIRROR_CAP_ENV`] alike, one
/// verdict): decimal digits only, nothing around them, at least 1.
pub fn parse_mirror_cap(text: &str) -> Result<u64, String> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    match text.parse::<u64>() {
        Ok(cap) if digits && cap > 0 => Ok(cap),
        _ => Err(format!(
            "`{text}` is not a number of bytes (decimal digits, at least 1)"
        )),
    }
}

/// How a [`SessionBinder`](crate::SessionBinder) behaves. Set with the builder methods:
///
/// ```
/// use std::time::Duration;
/// use rethread_runtime::BinderOptions;
/// let options = BinderOptions::default()
///     .codex_home(Some("/srv/codex".into()))
///     .lease_wait(Duration::from_secs(5));
/// assert_eq!(options.lease_wait, Duration::from_secs(5));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BinderOptions {
    /// The `CODEX_HOME` codex runs with: recorded with each binding, and where the mirror
    /// reads and restores the thread's files. Defaults to the environment's `CODEX_HOME`,
    /// else (unset or empty, as codex reads it) codex's own default `$HOME/.codex`.
    pub codex_home: Option<String>,
    /// Ask for `excludeTurns: true` on resume (the host keeps its own transcript); resent
    /// without it when the server wants a capability for it.
    pub exclude_turns: bool,
    /// Extra attempts after a temporary resume failure; past them the open fails with a
    /// retryable error and the binding kept.
    pub transient_retries: u32,
    /// The wait before the first retry; doubled on each further one.
    pub retry_backoff: Duration,
    /// Seed a thread that replaces a lost one; `None` disables seeding.
    pub seed: Option<SeedOptions>,
    /// How long one turn may run before it is interrupted and reported as failed.
    pub turn_timeout: Duration,
    /// Template of the `thread/start` params (cwd, model, ...).
    pub thread_start: ThreadStartParams,
    /// The TTL of the session lease taken before a thread is resumed or started. `None` takes
    /// no lease: only for a host that serialises its sessions by other means (its writes are
    /// then unfenced), or a test that observes codex's own single-writer guard.
    pub lease_ttl: Option<Duration>,
    /// How long [`SessionBinder::open`](crate::SessionBinder::open) waits for a lease another
    /// holder has before [`RuntimeError::SessionBusy`](crate::RuntimeError::SessionBusy).
    /// Zero (the default) fails at once.
    pub lease_wait: Duration,
    /// Mirror the thread's rollout into the store with every commit and restore it before a
    /// resume. On by default; off when [`MIRROR_ENV`] is `off` when the options are built (a
    /// value it cannot read leaves it on), and without a `codex_home`.
    pub mirror: bool,
    /// The session's cap of mirrored bytes: past it mirroring stops for the session's thread
    /// (its successor is mirrored again). It counts rollout bytes, as codex wrote them (the
    /// store keeps them compressed). Default 1 GiB, or [`MIRROR_CAP_ENV`] when the
    /// options are built (a value it cannot read leaves the default).
    pub mirror_cap: u64,
}

impl Default for BinderOptions {
    fn default() -> Self {
        BinderOptions {
            codex_home: effective_codex_home(),
            exclude_turns: true,
            transient_retries: 3,
            retry_backoff: Duration::from_millis(200),
            seed: Some(SeedOptions::default()),
            turn_timeout: Duration::from_secs(15 * 60),
            thread_start: ThreadStartParams::default(),
            lease_ttl: Some(Duration::from_secs(30)),
            lease_wait: Duration::ZERO,
            mirror: mirror_setting(std::env::var_os(MIRROR_ENV).as_deref()).unwrap_or(true),
            mirror_cap: mirror_cap_setting(std::env::var_os(MIRROR_CAP_ENV).as_deref())
                .unwrap_or(DEFAULT_MIRROR_CAP),
        }
    }
}

setters!(BinderOptions {
    codex_home: Option<String>,
    exclude_turns: bool,
    transient_retries: u32,
    retry_backoff: Duration,
    seed: Option<SeedOptions>,
    turn_timeout: Duration,
    thread_start: ThreadStartParams,
    lease_ttl: Option<Duration>,
    lease_wait: Duration,
    mirror: bool,
    mirror_cap: u64,
});

impl BinderOptions {
    /// The rules' settings these options ask for.
    pub fn machine_options(&self) -> MachineOptions {
        MachineOptions {
            exclude_turns: self.exclude_turns,
            transient_retries: self.transient_retries,
            retry_backoff: self.retry_backoff,
            seed: self.seed.clone(),
            mirror: self.mirror && self.codex_home.is_some(),
        }
    }

    /// The rollout mirror these options ask for, if any.
    pub fn rollout_mirror(&self) -> Option<RolloutMirror> {
        let home = self.codex_home.as_ref().filter(|_| self.mirror)?;
        Some(RolloutMirror::with_cap(home, self.mirror_cap))
    }
}

/// The `CODEX_HOME` a spawned codex will use: the variable, else codex's default `~/.codex`.
fn effective_codex_home() -> Option<String> {
    codex_home_from(std::env::var_os("CODEX_HOME"), std::env::var_os("HOME"))
}

/// [`effective_codex_home`] from the variables' values. Empty is unset, as codex reads
/// `CODEX_HOME` (and as every rethread variable is read): an empty home is never taken for
/// the working directory. Without `HOME` there is none (no mirror).
fn codex_home_from(codex_home: Option<OsString>, home: Option<OsString>) -> Option<String> {
    let set = |value: Option<OsString>| value.filter(|value| !value.is_empty());
    let home = match set(codex_home) {
        Some(home) => PathBuf::from(home),
        None => Path::new(&set(home)?).join(".codex"),
    };
    Some(home.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty variable is an unset one, as codex reads it: never the working directory.
    #[test]
    fn an_empty_codex_home_is_codex_default_never_the_working_directory() {
        let home = |codex_home: &str, home: &str| {
            codex_home_from(Some(codex_home.into()), Some(home.into()))
        };
        assert_eq!(
            home("/srv/codex", "/home/me").as_deref(),
            Some("/srv/codex")
        );
        assert_eq!(home("", "/home/me").as_deref(), Some("/home/me/.codex"));
        assert_eq!(
            codex_home_from(None, Some("/home/me".into())).as_deref(),
            Some("/home/me/.codex")
        );
        // No home to find it in: no mirror, rather than `.codex` in the working directory.
        assert_eq!(home("", ""), None);
        assert_eq!(codex_home_from(None, None), None);
    }
}
