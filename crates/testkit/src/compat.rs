//! The compatibility probe: drives one codex binary offline through the behaviours rethread
//! depends on and summarises them as one row of the README's compatibility table
//! (`cargo xtask codex-check --version V` prints it).
//!
//! | column | what is done |
//! |---|---|
//! | default `historyMode` | `thread/start` without asking for a mode |
//! | paginated threads | a thread started `paginated` (with `experimentalApi`) is resumed by a new process |
//! | `excludeTurns` | `thread/resume {excludeTurns: true}` without `experimentalApi` |
//! | single-writer guard | a second process resumes a thread a first one holds |
//! | error wordings | each refusal above, plus an unknown id, a malformed id and a deleted rollout, is classified by `rethread_protocol::classify_resume_error` as rethread needs |

use std::fmt;
use std::io;
use std::path::Path;
use std::time::Duration;

use rethread_protocol::{classify_resume_error, ErrorCode, ResumeFailure, RpcError};
use serde_json::{json, Value};

use crate::real::{error_of, rollout_files, AppServerProcess, CodexHome};
use crate::responses::ResponsesStandIn;

/// What the probe found for one release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompatRow {
    /// `codex --version` without the `codex-cli ` prefix.
    pub version: String,
    /// The `historyMode` of a thread started without one (`<absent>` when the field is missing).
    pub default_history_mode: String,
    /// Whether a paginated thread can be started and resumed by a new process; otherwise the
    /// refusal and its classification.
    pub paginated_resume: Outcome,
    /// `excludeTurns` without `experimentalApi`: served, or refused (and how that classifies).
    pub exclude_turns: Outcome,
    /// A second process resuming a held thread: refused (the guard) or served (no guard).
    pub second_writer: Outcome,
    /// Each observed refusal whose classification differs from what rethread relies on.
    pub wording_mismatches: Vec<String>,
    /// How many refusals were classified.
    pub wordings_checked: usize,
}

/// How one request was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It succeeded.
    Served,
    /// It was refused with this error, classified so.
    Refused {
        /// The JSON-RPC code.
        code: i64,
        /// The message.
        message: String,
        /// What rethread makes of it.
        class: ResumeFailure,
    },
}

impl Outcome {
    fn of(response: &Value) -> Outcome {
        match error_of(response) {
            None => Outcome::Served,
            Some((code, message)) => {
                let class =
                    classify_resume_error(&RpcError::new(ErrorCode::from(code), message.clone()));
                Outcome::Refused {
                    code,
                    message,
                    class,
                }
            }
        }
    }
}

impl CompatRow {
    /// The table's header (two lines of markdown).
    pub fn header() -> &'static str {
        "| codex | default `historyMode` | paginated thread resumes | `excludeTurns` without `experimentalApi` | single-writer guard | error wordings |\n\
         |---|---|---|---|---|---|"
    }

    /// The row as markdown.
    pub fn markdown(&self) -> String {
        let paginated = match &self.paginated_resume {
            Outcome::Served => "yes".to_string(),
            Outcome::Refused {
                code,
                message,
                class,
            } => format!("no: `{code} {message}` ({})", class.as_str()),
        };
        let exclude = match &self.exclude_turns {
            Outcome::Served => "served".to_string(),
            Outcome::Refused { class, .. } => format!("needs it ({})", class.as_str()),
        };
        let guard = match &self.second_writer {
            Outcome::Served => "none: a second process resumes it".to_string(),
            Outcome::Refused { class, .. } => format!("yes ({})", class.as_str()),
        };
        let wordings = if self.wording_mismatches.is_empty() {
            format!("ok ({} classified)", self.wordings_checked)
        } else {
            format!("MISMATCH: {}", self.wording_mismatches.join("; "))
        };
        format!(
            "| {} | {} | {paginated} | {exclude} | {guard} | {wordings} |",
            self.version, self.default_history_mode
        )
    }
}

impl fmt::Display for CompatRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.markdown())
    }
}

/// Probes the codex binary at `codex` (offline, in temporary homes).
pub async fn probe(codex: &Path) -> io::Result<CompatRow> {
    let version = std::process::Command::new(codex)
        .arg("--version")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())?;
    let version = version
        .strip_prefix("codex-cli ")
        .unwrap_or(&version)
        .to_string();
    let model = ResponsesStandIn::start()?;
    let home = CodexHome::new(&model)?;
    let mut checks = Checks::default();

    // A thread started without a mode, with one turn so that it has a rollout.
    let mut first = spawn(codex, home.path(), false).await?;
    let started = first
        .peer
        .request("thread/start", Some(json!({"cwd": home.path()})))
        .await?;
    let thread = started["result"]["thread"].clone();
    let id = thread["id"].as_str().unwrap_or_default().to_string();
    let default_history_mode = thread
        .get("historyMode")
        .and_then(Value::as_str)
        .unwrap_or("<absent>")
        .to_string();
    first.peer.run_turn(&id, "remember PAPAYA", None).await?;
    let unknown = first
        .peer
        .request(
            "thread/resume",
            Some(json!({"threadId": "00000000-0000-7000-8000-000000000000"})),
        )
        .await?;
    checks.expect("unknown id", &unknown, ResumeFailure::Gone);
    let malformed = first
        .peer
        .request("thread/resume", Some(json!({"threadId": "not-a-uuid"})))
        .await?;
    checks.expect("malformed id", &malformed, ResumeFailure::Gone);
    first.shutdown(Duration::from_secs(10)).await?;

    // A new process: excludeTurns without the capability, then a plain resume it keeps.
    let mut holder = spawn(codex, home.path(), false).await?;
    let excluded = holder
        .peer
        .request(
            "thread/resume",
            Some(json!({"threadId": id, "excludeTurns": true})),
        )
        .await?;
    let exclude_turns = Outcome::of(&excluded);
    checks.expect_if_refused("excludeTurns", &excluded, ResumeFailure::CapabilityRequired);
    if exclude_turns != Outcome::Served {
        let resumed = holder
            .peer
            .request("thread/resume", Some(json!({"threadId": id})))
            .await?;
        checks.expect_served("resume after a restart", &resumed);
    }
    // A second process while the first holds the thread.
    let mut contender = spawn(codex, home.path(), false).await?;
    let second = contender
        .peer
        .request("thread/resume", Some(json!({"threadId": id})))
        .await?;
    let second_writer = Outcome::of(&second);
    checks.expect_if_refused("second writer", &second, ResumeFailure::Busy);
    contender.shutdown(Duration::from_secs(10)).await?;
    holder.shutdown(Duration::from_secs(10)).await?;

    let paginated_resume = paginated(codex, &model, &mut checks).await?;

    // A deleted rollout.
    for file in rollout_files(home.path()) {
        std::fs::remove_file(file)?;
    }
    let mut last = spawn(codex, home.path(), false).await?;
    let gone = last
        .peer
        .request("thread/resume", Some(json!({"threadId": id})))
        .await?;
    checks.expect("deleted rollout", &gone, ResumeFailure::Gone);
    last.shutdown(Duration::from_secs(10)).await?;

    Ok(CompatRow {
        version,
        default_history_mode,
        paginated_resume,
        exclude_turns,
        second_writer,
        wording_mismatches: checks.mismatches,
        wordings_checked: checks.checked,
    })
}

/// Starts a paginated thread (asking for it with `experimentalApi`), runs a turn, and resumes
/// it from a new process; the first refusal met is the outcome.
async fn paginated(
    codex: &Path,
    model: &ResponsesStandIn,
    checks: &mut Checks,
) -> io::Result<Outcome> {
    let home = CodexHome::new(model)?;
    let mut writer = spawn(codex, home.path(), true).await?;
    let started = writer
        .peer
        .request(
            "thread/start",
            Some(json!({"cwd": home.path(), "historyMode": "paginated"})),
        )
        .await?;
    if error_of(&started).is_some() {
        checks.expect(
            "paginated thread/start",
            &started,
            ResumeFailure::Incompatible,
        );
        writer.shutdown(Duration::from_secs(10)).await?;
        return Ok(Outcome::of(&started));
    }
    let id = started["result"]["thread"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    writer.peer.run_turn(&id, "remember PAPAYA", None).await?;
    writer.shutdown(Duration::from_secs(10)).await?;
    let mut reader = spawn(codex, home.path(), true).await?;
    let resumed = reader
        .peer
        .request("thread/resume", Some(json!({"threadId": id})))
        .await?;
    checks.expect_if_refused("paginated resume", &resumed, ResumeFailure::Incompatible);
    reader.shutdown(Duration::from_secs(10)).await?;
    Ok(Outcome::of(&resumed))
}

async fn spawn(codex: &Path, home: &Path, experimental: bool) -> io::Result<AppServerProcess> {
    let mut server = AppServerProcess::spawn(codex, home).await?;
    let init = server.peer.initialize(experimental).await?;
    if init.get("result").is_none() {
        return Err(io::Error::other(format!(
            "codex did not start in {}: {init}",
            home.display()
        )));
    }
    Ok(server)
}

/// The classification checks made so far.
#[derive(Debug, Default)]
struct Checks {
    checked: usize,
    mismatches: Vec<String>,
}

impl Checks {
    /// `response` must be a refusal classified as `expected`.
    fn expect(&mut self, what: &str, response: &Value, expected: ResumeFailure) {
        self.checked += 1;
        match Outcome::of(response) {
            Outcome::Refused { class, .. } if class == expected => {}
            Outcome::Refused {
                code,
                message,
                class,
            } => self.mismatches.push(format!(
                "{what}: `{code} {message}` is {}, not {}",
                class.as_str(),
                expected.as_str()
            )),
            Outcome::Served => self.mismatches.push(format!(
                "{what}: served, expected a refusal ({})",
                expected.as_str()
            )),
        }
    }

    /// A refusal, if any, must classify as `expected`.
    fn expect_if_refused(&mut self, what: &str, response: &Value, expected: ResumeFailure) {
        if error_of(response).is_some() {
            self.expect(what, response, expected);
        }
    }

    /// `response` must have succeeded.
    fn expect_served(&mut self, what: &str, response: &Value) {
        if let Some((code, message)) = error_of(response) {
            self.mismatches
                .push(format!("{what}: refused `{code} {message}`"));
        }
    }
}
