//! Parity rows of `fake-codex exec` against the real `codex exec --experimental-json` (the
//! current and the previous release): each scenario runs `exec` processes against the fake
//! binary and against each real release, and the observation logs must be identical: the
//! events printed (types, item types and texts; thread ids as `T1`, `T2`, ...), exit codes,
//! codex's report of a failed resume on stderr as [`exec_resume_error`] reads it, and what the
//! model saw (the earlier turns after a resume, the developer instructions a `-c` gives).
//!
//! The offline model warns once per thread that `mock-model` has no metadata (an `error`
//! item); that item is left out of the real codex's events.
//!
//! Without the real binaries only the fake side runs; with `RETHREAD_REQUIRE_REAL_CODEX=1` or
//! `CI=true` a missing binary fails the test.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use rethread_protocol::{classify_resume_error, exec_resume_error};
use rethread_testkit::real::{codex_or_skip, rollout_files, CodexHome};
use rethread_testkit::recent_releases;
use rethread_testkit::responses::ResponsesStandIn;
use serde_json::Value;

/// What an exec process is run as.
#[derive(Debug, Clone)]
enum Target {
    /// The `fake-codex` binary.
    Fake,
    /// A real codex binary.
    Real(PathBuf),
}

/// One scenario's world: the model, a home, a working directory, the log.
struct Lab {
    target: Target,
    model: ResponsesStandIn,
    home: CodexHome,
    work: tempfile::TempDir,
    log: Vec<String>,
    /// Thread ids seen, in order: `T1`, `T2`, ...
    threads: HashMap<String, String>,
}

/// One finished exec process.
struct Run {
    code: Option<i32>,
    events: Vec<Value>,
    stderr: String,
}

impl Run {
    fn thread_id(&self) -> String {
        self.events
            .iter()
            .find(|e| e["type"] == "thread.started")
            .and_then(|e| e["thread_id"].as_str())
            .expect("a thread.started event")
            .to_string()
    }
}

impl Lab {
    fn new(target: Target) -> Lab {
        let model = ResponsesStandIn::start().unwrap();
        let home = CodexHome::new(&model).unwrap();
        Lab {
            target,
            model,
            home,
            work: tempfile::tempdir().unwrap(),
            log: Vec::new(),
            threads: HashMap::new(),
        }
    }

    /// `exec --experimental-json --skip-git-repo-check --cd WORK ARGS...` with `stdin`.
    fn exec(&mut self, args: &[&str], stdin: &str) -> Run {
        let program = match &self.target {
            Target::Fake => PathBuf::from(env!("CARGO_BIN_EXE_fake-codex")),
            Target::Real(binary) => binary.clone(),
        };
        let mut child = Command::new(program)
            .args([
                "exec",
                "--experimental-json",
                "--skip-git-repo-check",
                "--cd",
            ])
            .arg(self.work.path())
            .args(args)
            .env("CODEX_HOME", self.home.path())
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn exec");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        let events = String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON event"))
            .collect();
        Run {
            code: output.status.code(),
            events,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Logs a run: its exit code, its events, and a resume error it reported.
    fn observe(&mut self, label: &str, run: &Run) {
        self.observe_as(label, run, true);
    }

    /// [`Lab::observe`], item texts left out when `texts` is false.
    fn observe_as(&mut self, label: &str, run: &Run, texts: bool) {
        self.log.push(format!("{label}: exit {:?}", run.code));
        for event in &run.events {
            let line = match event["type"].as_str() {
                Some("thread.started") => {
                    format!(
                        "thread.started {}",
                        self.name(event["thread_id"].as_str().unwrap())
                    )
                }
                Some(kind @ ("item.started" | "item.completed")) => {
                    let item = &event["item"];
                    if item["type"] == "error"
                        && item["message"]
                            .as_str()
                            .is_some_and(|m| m.starts_with("Model metadata for"))
                    {
                        continue;
                    }
                    let text = if texts {
                        item["text"].to_string()
                    } else {
                        "...".into()
                    };
                    format!("{kind} {} {text}", item["type"])
                }
                Some("turn.failed") => format!("turn.failed {}", event["error"]["message"]),
                Some(other) => other.to_string(),
                None => format!("not an event: {event}"),
            };
            self.log.push(format!("  {line}"));
        }
        if let Some(error) = exec_resume_error(&run.stderr) {
            let message = self.normalized(&error.message);
            self.log.push(format!(
                "  stderr: resume error {} {} ({})",
                error.code.code(),
                message,
                classify_resume_error(&error)
            ));
        }
    }

    fn name(&mut self, thread_id: &str) -> String {
        let next = format!("T{}", self.threads.len() + 1);
        self.threads
            .entry(thread_id.to_string())
            .or_insert(next)
            .clone()
    }

    /// `text` with known thread ids as their names, and the home's path as `<home>`.
    fn normalized(&self, text: &str) -> String {
        let mut text = text.replace(&self.home.path().display().to_string(), "<home>");
        for (id, name) in &self.threads {
            text = text.replace(id, name);
        }
        text
    }

    /// The conversation of the model's last request: its user and assistant messages (the
    /// context codex adds in angle brackets left out), and whether a developer message holds
    /// `marker`.
    fn last_model_request(&mut self, marker: &str) {
        let conversation: Vec<(String, String)> = match &self.target {
            Target::Real(_) => self
                .model
                .model_requests()
                .last()
                .map(|r| r.conversation())
                .unwrap_or_default()
                .into_iter()
                .map(|m| (m.role, m.text))
                .collect(),
            Target::Fake => {
                let log =
                    std::fs::read_to_string(self.home.path().join("fake-model-requests.jsonl"))
                        .unwrap_or_default();
                let last: Value = log
                    .lines()
                    .last()
                    .map(|line| serde_json::from_str(line).unwrap())
                    .unwrap_or(Value::Null);
                last["conversation"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|m| {
                        let text = |key: &str| m[key].as_str().unwrap_or_default().to_string();
                        (text("role"), text("text"))
                    })
                    .collect()
            }
        };
        let said: Vec<String> = conversation
            .iter()
            .filter(|(role, text)| {
                (role == "user" || role == "assistant") && !text.starts_with('<')
            })
            .map(|(role, text)| format!("{role}: {text:?}"))
            .collect();
        let marked = conversation
            .iter()
            .any(|(role, text)| role == "developer" && text.contains(marker));
        self.log.push(format!(
            "  model saw [{}]; developer {marker}: {marked}",
            said.join(", ")
        ));
    }
}

/// A new thread, its resume in a second process (the model sees the first turn), a resume of
/// a thread the home never had, one whose rollout was deleted, and a greedy `--image` list
/// that swallows `resume <id>` (a new thread).
fn resume_and_lost_threads(target: Target) -> Vec<String> {
    let mut lab = Lab::new(target);
    let first = lab.exec(&[], "remember zebra\n");
    lab.observe("new thread", &first);
    lab.last_model_request("SEED");
    let thread = first.thread_id();
    let resumed = lab.exec(&["resume", &thread], "what did I say?");
    lab.observe("resume", &resumed);
    lab.last_model_request("SEED");
    assert_eq!(resumed.thread_id(), thread);

    let unknown = "01a232b0-a4c0-7c63-a05d-5204e9c86099";
    lab.threads.insert(unknown.to_string(), "UNKNOWN".into());
    let never = lab.exec(&["resume", unknown], "hello");
    lab.observe("resume of a thread the home never had", &never);

    for rollout in rollout_files(lab.home.path()) {
        std::fs::remove_file(rollout).unwrap();
    }
    let deleted = lab.exec(&["resume", &thread], "still there?");
    lab.observe("resume after the rollout was deleted", &deleted);

    let image = lab.work.path().join("a.png");
    std::fs::write(&image, b"\x89PNG\r\n\x1a\n").unwrap();
    let image = image.display().to_string();
    let greedy = lab.exec(&["--image", &image, "resume", &thread], "which thread?");
    // What the model is told about the images differs; the thread is what matters here.
    lab.observe_as("--image before resume", &greedy, false);
    lab.log
}

/// The prompt: an argument with a piped stdin appended, an empty stdin, and the developer
/// instructions a `-c` gives a new thread.
fn prompts_and_instructions(target: Target) -> Vec<String> {
    let mut lab = Lab::new(target);
    let both = lab.exec(&["positional part"], "piped part\n");
    lab.observe("argument and stdin", &both);
    lab.last_model_request("SEED");
    let empty = lab.exec(&[], "");
    lab.observe("empty stdin", &empty);
    lab.log.push(format!(
        "  stderr ends: {:?}",
        empty.stderr.lines().last().unwrap_or_default()
    ));
    let seeded = lab.exec(
        &[
            "-c",
            "developer_instructions=\"SEED-MARKER <transcript>\\nline two\"",
        ],
        "seeded?",
    );
    lab.observe("developer instructions by -c", &seeded);
    lab.last_model_request("SEED-MARKER <transcript>\nline two");
    lab.log
}

fn compare(scenario: &str, fake: &[String], real: &[String], real_name: &str) {
    eprintln!("{scenario} against {real_name}:\n  {}", real.join("\n  "));
    if fake == real {
        return;
    }
    let mut report = format!("parity broken in `{scenario}` (fake vs real {real_name}):\n");
    for i in 0..fake.len().max(real.len()) {
        let f = fake.get(i).map_or("<none>", String::as_str);
        let r = real.get(i).map_or("<none>", String::as_str);
        if f != r {
            report.push_str(&format!("  fake: {f}\n  real: {r}\n"));
        }
    }
    panic!("{report}");
}

fn against_the_recent_releases(scenario: &str, run: fn(Target) -> Vec<String>) {
    let fake = run(Target::Fake);
    eprintln!("{scenario} on fake-codex:\n  {}", fake.join("\n  "));
    for version in recent_releases() {
        let Some(binary) = codex_or_skip(&version) else {
            continue;
        };
        let real = run(Target::Real(binary));
        compare(scenario, &fake, &real, &version);
    }
}

#[test]
fn exec_resume_and_lost_threads_match_codex() {
    against_the_recent_releases("resume and lost threads", resume_and_lost_threads);
}

#[test]
fn exec_prompts_and_instructions_match_codex() {
    against_the_recent_releases("prompts and instructions", prompts_and_instructions);
}

/// The fake on its own: what the rows above rely on, held even without a real codex.
#[test]
fn the_fake_exec_resumes_with_memory_and_reports_a_lost_thread_as_codex_does() {
    let log = resume_and_lost_threads(Target::Fake);
    let text = log.join("\n");
    assert!(text.contains("model saw [user: \"remember zebra\\n\", assistant: \"echo: remember zebra\\n\", user: \"what did I say?\"]"), "{text}");
    assert!(
        text.contains("stderr: resume error -32600 no rollout found for thread id UNKNOWN (gone)"),
        "{text}"
    );
    assert!(
        text.contains("stderr: resume error -32600 no rollout found for thread id T1 (gone)"),
        "{text}"
    );
    assert!(log.iter().any(|l| l == "  thread.started T3"), "{text}");
}
