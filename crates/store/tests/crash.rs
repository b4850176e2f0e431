//! Crash test: a child process (this test binary, re-executed) commits turns in a loop and is
//! SIGKILLed at random moments. After every kill the store must open and hold:
//! - every binding names a thread whose turn rows are all present, and never a retired thread;
//! - no partial turn is visible (each turn's rows are all there, contiguous, in order);
//! - rows are contiguous `0..row_count`, no turn appears twice;
//! - nothing the child saw acknowledged before the kill is missing;
//! - the host's own `model_config` key is never lost.
//!
//! Kills per backend: `RETHREAD_CRASH_KILLS` (default 200); seed: `RETHREAD_CRASH_SEED`.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rethread_store::{open_url, BindingStore, OpenOptions, Retirement, TurnCommit};
use serde_json::json;

const CHILD_ENV: &str = "RETHREAD_CRASH_CHILD_URL";
const SESSIONS: usize = 6;

fn session_name(i: usize) -> String {
    format!("crash-{i}")
}

/// Whether this process is a child a test below started (this test binary run with `--exact`
/// that test's name and `CHILD_ENV`): [`crash_child`] has then run in place of the test (it
/// runs until killed). A plain run does not set `CHILD_ENV`, so every test is a parent.
fn ran_as_child() -> bool {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return false;
    };
    crash_child(&url);
    true
}

/// The child's body: commits on `url` until it is killed, acknowledging each commit.
fn crash_child(url: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let store = open_url(url, OpenOptions::new()).await.expect("child open");
        emit("READY".to_string());
        let pid = std::process::id();
        let tasks: Vec<_> = (0..SESSIONS)
            .map(|s| {
                let store = store.clone();
                tokio::spawn(async move {
                    let session = session_name(s);
                    let mut k = 0u64;
                    let mut last_thread = String::new();
                    loop {
                        let turn_id = format!("{pid}-{s}-{k}");
                        // Every fifth turn: retire the bound thread, then commit on it anyway
                        // (a late commit); its rows must land, its binding must not.
                        let thread = if k % 5 == 4 && !last_thread.is_empty() {
                            store
                                .retire_thread(
                                    &session,
                                    &last_thread,
                                    Retirement::Lost {
                                        reason: "gone".to_string(),
                                        message: "crash test".to_string(),
                                    },
                                    None,
                                )
                                .await
                                .expect("retire");
                            emit(format!("RETIRED {session} {last_thread}"));
                            last_thread.clone()
                        } else {
                            format!("th-{turn_id}")
                        };
                        let n = 1 + (k % 4);
                        let rows = (0..n)
                            .map(|i| json!({"turn": turn_id, "thread": thread, "i": i, "n": n}))
                            .collect();
                        let out = store
                            .commit_turn(TurnCommit::new(session.clone(), thread.clone(), rows))
                            .await
                            .expect("commit");
                        emit(format!("ACK {session} {turn_id} {} {n}", out.first_seq()));
                        last_thread = thread;
                        k += 1;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// One line per acknowledgement, flushed before the next write is even queued.
fn emit(line: String) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Default)]
struct Acked {
    /// turn id -> (session, first_seq, n)
    turns: HashMap<String, (String, u64, u64)>,
    /// (session, thread) retirements
    retired: Vec<(String, String)>,
}

/// `kills` children of `test` (which run [`crash_child`]) on a `scheme` store named `file`,
/// killed at random moments, the store checked after each.
fn crash_loop(test: &str, scheme: &str, file: &str) {
    let kills: u64 = std::env::var("RETHREAD_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seed: u64 = std::env::var("RETHREAD_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("crash test {scheme}: {kills} kills, RETHREAD_CRASH_SEED={seed}");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file);
    let url = format!("{scheme}:{}", path.display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // The host's own key, set before any child runs; it must survive everything.
    rt.block_on(async {
        let (scheme, path) = url.split_once(':').unwrap();
        if scheme == "redb" {
            let store = BindingStore::redb(path, OpenOptions::new()).await.unwrap();
            set_host_keys(&store).await;
            store.close().await;
        } else {
            let store = BindingStore::sqlite(path, OpenOptions::new())
                .await
                .unwrap();
            set_host_keys(&store).await;
            store.close().await;
        }
    });
    let mut acked = Acked::default();
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let mut total_acks = 0usize;
    for kill in 0..kills {
        let mut child = Command::new(&exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1", "-q"])
            .env(CHILD_ENV, &url)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<String>>()
        });
        // Mostly kill while commits are in flight; sometimes while the child is still opening
        // (and recovering) the store.
        let delay = if rng.below(8) == 0 {
            rng.below(15)
        } else {
            15 + rng.below(60)
        };
        std::thread::sleep(Duration::from_millis(delay));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let lines = reader.join().unwrap();
        for line in &lines {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                ["ACK", session, turn, first_seq, n] => {
                    total_acks += 1;
                    acked.turns.insert(
                        turn.to_string(),
                        (
                            session.to_string(),
                            first_seq.parse().unwrap(),
                            n.parse().unwrap(),
                        ),
                    );
                }
                ["RETIRED", session, thread] => acked
                    .retired
                    .push((session.to_string(), thread.to_string())),
                _ => {}
            }
        }
        rt.block_on(verify(&url, &acked))
            .unwrap_or_else(|e| panic!("after kill {kill} (seed {seed}): {e}"));
    }
    eprintln!(
        "crash test {scheme}: {kills} kills, {total_acks} acknowledged turns verified in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert!(total_acks > 0, "the child never committed anything");
}

async fn set_host_keys(store: &BindingStore) {
    for s in 0..SESSIONS {
        store
            .set_config_key(&session_name(s), "host_key", Some(json!({"kept": s})))
            .await
            .unwrap();
    }
}

async fn verify(url: &str, acked: &Acked) -> Result<(), String> {
    let (scheme, path) = url.split_once(':').unwrap();
    // Open with the concrete type so the file can be closed before the next child starts.
    match scheme {
        "redb" => {
            let store = BindingStore::redb(path, OpenOptions::new().create(false))
                .await
                .map_err(|e| format!("open: {e}"))?;
            let r = check(&store, acked).await;
            store.close().await;
            r
        }
        _ => {
            let store = BindingStore::sqlite(path, OpenOptions::new().create(false))
                .await
                .map_err(|e| format!("open: {e}"))?;
            let r = check(&store, acked).await;
            store.close().await;
            r
        }
    }
}

async fn check(store: &BindingStore, acked: &Acked) -> Result<(), String> {
    // turn id -> (session, first_seq, n) as found in the store
    let mut found: HashMap<String, (String, u64, u64)> = HashMap::new();
    for s in 0..SESSIONS {
        let session = session_name(s);
        let rec = store
            .require_session(&session)
            .await
            .map_err(|e| e.to_string())?;
        if rec.model_config.get("host_key") != Some(&json!({"kept": s})) {
            return Err(format!("{session}: host key lost: {:?}", rec.model_config));
        }
        let rows = store.all_rows(&session).await.map_err(|e| e.to_string())?;
        if rows.len() as u64 != rec.row_count {
            return Err(format!(
                "{session}: {} rows, record says {}",
                rows.len(),
                rec.row_count
            ));
        }
        // Group consecutive rows by turn; every group must be whole.
        let mut groups: Vec<(String, String, u64, u64)> = Vec::new(); // (turn, thread, first, n)
        let mut i = 0usize;
        while i < rows.len() {
            let row = &rows[i];
            if row.seq != i as u64 {
                return Err(format!("{session}: row {i} has seq {}", row.seq));
            }
            let body = &row.body;
            let turn = body["turn"].as_str().ok_or("row without turn")?.to_string();
            let thread = body["thread"]
                .as_str()
                .ok_or("row without thread")?
                .to_string();
            let n = body["n"].as_u64().ok_or("row without n")?;
            for j in 0..n {
                let Some(r) = rows.get(i + j as usize) else {
                    return Err(format!("{session}: partial turn {turn}: {j} of {n} rows"));
                };
                if r.body["turn"].as_str() != Some(turn.as_str()) || r.body["i"] != json!(j) {
                    return Err(format!(
                        "{session}: turn {turn} broken at row {}: {}",
                        i + j as usize,
                        r.body
                    ));
                }
            }
            if found
                .insert(turn.clone(), (session.clone(), i as u64, n))
                .is_some()
            {
                return Err(format!("{session}: turn {turn} duplicated"));
            }
            groups.push((turn, thread, i as u64, n));
            i += n as usize;
        }
        // The binding names the last turn's thread, unless that thread is retired.
        let expected = groups
            .last()
            .map(|g| g.1.clone())
            .filter(|t| !rec.is_retired(t));
        if rec.thread_id().map(str::to_string) != expected {
            return Err(format!(
                "{session}: binding {:?}, expected {expected:?} (retired {:?})",
                rec.thread_id(),
                rec.retired_threads
            ));
        }
        if let Some(t) = rec.thread_id() {
            if rec.is_retired(t) {
                return Err(format!("{session}: bound to retired {t}"));
            }
        }
    }
    for (turn, want) in &acked.turns {
        match found.get(turn) {
            Some(got) if got == want => {}
            other => return Err(format!("acknowledged turn {turn} {want:?} is {other:?}")),
        }
    }
    let mut retired: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (s, t) in &acked.retired {
        retired.entry(s.as_str()).or_default().push(t.clone());
    }
    for (s, threads) in retired {
        let rec = store.require_session(s).await.map_err(|e| e.to_string())?;
        for t in threads {
            if !rec.is_retired(&t) {
                return Err(format!("{s}: acknowledged retirement of {t} lost"));
            }
        }
    }
    Ok(())
}

#[test]
fn redb_survives_sigkill() {
    if ran_as_child() {
        return;
    }
    crash_loop("redb_survives_sigkill", "redb", "crash.redb");
}

#[test]
fn sqlite_survives_sigkill() {
    if ran_as_child() {
        return;
    }
    crash_loop("sqlite_survives_sigkill", "sqlite", "crash.db");
}
