//! The fleet story, against the real current codex: several machines (each its own
//! `CODEX_HOME`) on one store, one session whose every turn lands on a seeded random machine,
//! through `rethread chat` and through `rethread app-server`, on SQLite and on PostgreSQL.
//! Every turn after the first resumes the same thread (restored from the store's mirror where
//! that machine lacks or holds an older copy of its rollout), says no notice, and the model's
//! request holds every earlier turn as conversation: the user messages themselves, never a
//! seed (its markers are checked absent).
//!
//! `RETHREAD_FLEET_SEED` picks the machines (default 2112); the run's table (turns, hops,
//! resumed, notices) is printed on stderr (`docs/reliability.md`). PostgreSQL is keyed on
//! `RETHREAD_TEST_POSTGRES_URL` (skipped outside CI when unset, required under CI).

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rethread_testkit::real::{codex_or_skip, thread_id, AppServerProcess, CodexHome};
use rethread_testkit::responses::{ConversationMessage, ResponsesStandIn};
use rethread_testkit::CURRENT;
use serde_json::{json, Value};
use support::rethread;

const NOTICE: &str = "Codex thread could not be resumed; starting a new one.";
const SESSION: &str = "fleet";
const MACHINES: usize = 3;
const TURNS: usize = 9;
/// What a seed of the transcript carries (`render_seed`): never in a fleet's model request.
const SEED_MARKERS: [&str; 2] = ["<transcript>", "could not be restored in this thread"];

/// splitmix64: a seeded, dependency-free choice of machines.
struct Machines(u64);

impl Machines {
    fn next(&mut self) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % MACHINES as u64) as usize
    }
}

fn seed() -> u64 {
    std::env::var("RETHREAD_FLEET_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2112)
}

/// A fresh schema of the test PostgreSQL database, or `None` (skip) outside CI.
fn postgres_url(test: &str) -> Option<String> {
    let Ok(base) = std::env::var("RETHREAD_TEST_POSTGRES_URL") else {
        let required = std::env::var("CI").is_ok_and(|v| v == "true")
            || std::env::var("RETHREAD_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
        assert!(!required, "RETHREAD_TEST_POSTGRES_URL is required under CI");
        eprintln!("skipping {test}: RETHREAD_TEST_POSTGRES_URL is not set");
        return None;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let sep = if base.contains('?') { '&' } else { '?' };
    Some(format!(
        "{base}{sep}schema=fleet_{test}_{}_{nanos}",
        std::process::id()
    ))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Surface {
    Chat,
    AppServer,
}

/// What one fleet run saw.
#[derive(Debug, Default)]
struct Tally {
    turns: usize,
    hops: usize,
    resumed: usize,
    notices: usize,
}

/// One turn of the session on `home` through `surface`: the thread it ran on, `chat`'s outcome
/// (`app-server` answers the client's `thread/start` with the session's thread either way),
/// and the rethread notices said (the fallback notice, or any warning of rethread's own).
async fn turn(
    surface: Surface,
    codex: &Path,
    store: &str,
    home: &Path,
    text: &str,
) -> (String, Option<String>, Vec<String>) {
    let env = [
        ("RETHREAD_STORE", store),
        ("RETHREAD_CODEX_BIN", codex.to_str().unwrap()),
        ("RETHREAD_SESSION", SESSION),
        // The default, whatever the environment of the test says.
        ("RETHREAD_MIRROR", "on"),
    ];
    match surface {
        Surface::Chat => {
            let out = Command::new(rethread())
                .args(["chat", "--session", SESSION, "--json", text])
                .env("CODEX_HOME", home)
                .env("RUST_LOG", "error")
                .envs(env)
                .output()
                .unwrap();
            let report: Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
            assert!(out.status.success(), "{report}");
            let notices = report["notices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap().to_string())
                .collect();
            let outcome = report["outcome"].as_str().map(str::to_string);
            (
                report["thread_id"].as_str().unwrap().to_string(),
                outcome,
                notices,
            )
        }
        Surface::AppServer => {
            let mut process = AppServerProcess::spawn_with(&rethread(), home, &[], &env)
                .await
                .unwrap();
            process.peer.initialize(false).await.unwrap();
            let started = process
                .peer
                .request("thread/start", Some(json!({"cwd": "/tmp"})))
                .await
                .unwrap();
            let thread = thread_id(&started);
            let run = process.peer.run_turn(&thread, text, None).await.unwrap();
            assert_eq!(run.status().as_deref(), Some("completed"), "{started}");
            // codex warns of its own (the stand-in model's missing metadata); rethread's are
            // the fallback notice and its own sentences.
            let notices = process
                .peer
                .log
                .iter()
                .filter(|m| m["method"] == "warning")
                .filter_map(|m| m["params"]["message"].as_str())
                .filter(|m| *m == NOTICE || m.starts_with("rethread"))
                .map(str::to_string)
                .collect();
            process.shutdown(Duration::from_secs(15)).await.unwrap();
            (thread, None, notices)
        }
    }
}

/// The session's turns on machines chosen by `seed`, through `surface`, on `store`.
async fn fleet(surface: Surface, codex: &Path, store: &str, seed: u64) -> Tally {
    let model = ResponsesStandIn::start().unwrap();
    let homes: Vec<CodexHome> = (0..MACHINES)
        .map(|_| CodexHome::new(&model).unwrap())
        .collect();
    let mut machines = Machines(seed);
    let mut tally = Tally::default();
    let mut thread = None;
    let mut previous = None;
    let mut said: Vec<String> = Vec::new();
    for i in 0..TURNS {
        let machine = machines.next();
        tally.hops += usize::from(previous.is_some_and(|p| p != machine));
        previous = Some(machine);
        let text = format!("remember the word FLEET{i}");
        let (ran_on, outcome, notices) =
            turn(surface, codex, store, homes[machine].path(), &text).await;
        tally.turns += 1;
        tally.notices += notices.len();
        assert!(
            notices.is_empty(),
            "turn {i} on machine {machine}: {notices:?}"
        );
        match &thread {
            None => thread = Some(ran_on),
            Some(first) => {
                assert_eq!(
                    &ran_on, first,
                    "turn {i} on machine {machine}: the same thread"
                );
                if let Some(outcome) = outcome {
                    assert_eq!(outcome, "resumed", "turn {i}");
                }
                tally.resumed += 1;
            }
        }
        // The model's request holds every earlier turn as conversation, not as a seed.
        let conversation: Vec<ConversationMessage> =
            model.model_requests().last().unwrap().conversation();
        for earlier in &said {
            assert!(
                conversation
                    .iter()
                    .any(|m| m.role == "user" && m.text == *earlier),
                "turn {i} on machine {machine}: the model lost {earlier:?}"
            );
        }
        for marker in SEED_MARKERS {
            assert!(
                !conversation.iter().any(|m| m.text.contains(marker)),
                "turn {i}: a seed reached the model"
            );
        }
        said.push(text);
    }
    eprintln!(
        "fleet | {surface:?} | {} | seed {seed} | turns {} | hops {} | resumed {} | notices {}",
        store.split(':').next().unwrap_or_default(),
        tally.turns,
        tally.hops,
        tally.resumed,
        tally.notices
    );
    tally
}

async fn run(surface: Surface, store: &str) {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let tally = fleet(surface, &codex, store, seed()).await;
    assert_eq!(tally.resumed, TURNS - 1);
    assert!(tally.hops > 0, "the seed moved the session at least once");
    assert_eq!(tally.notices, 0);
}

fn sqlite_store(dir: &tempfile::TempDir) -> String {
    format!("sqlite:{}", dir.path().join("fleet.sqlite").display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_keeps_one_thread_through_chat_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    run(Surface::Chat, &sqlite_store(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_keeps_one_thread_through_app_server_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    run(Surface::AppServer, &sqlite_store(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_keeps_one_thread_on_postgres_through_chat_and_app_server() {
    for (surface, name) in [(Surface::Chat, "chat"), (Surface::AppServer, "app_server")] {
        let Some(url) = postgres_url(name) else {
            return;
        };
        run(surface, &url).await;
    }
}
