//! Several OS processes run turns through the real runtime on overlapping sessions of one
//! SQLite file and of one PostgreSQL database (each process with its own in-process fake
//! app-server and codex home). Each child records, per turn, the interval during which it held
//! the session's lease (taken after `SessionBinder::open` returned, ended before the session closed:
//! inside the true holding interval, on the machine's realtime clock), the lease's fence, and
//! the rows it committed. The parent then checks that no two processes ever held one session's
//! lease at once, that no row was lost or duplicated, and that every binding is valid (I1: it
//! names the thread of the session's last committed turn; I2: never a retired thread).
//!
//! Two faults across processes, on both stores (issue 12): a holder SIGKILLed while it holds a
//! session's lease is taken over at once by the next process on this machine (no TTL to wait
//! out); and a holder SIGSTOPped past its TTL while another process takes the session over and
//! commits gets `LeaseLost` once continued, and writes nothing.
//!
//! PostgreSQL is keyed on `RETHREAD_TEST_POSTGRES_URL` (skipped outside CI when unset, required
//! under `CI=true` or `RETHREAD_REQUIRE_POSTGRES=1`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rethread_fake_appserver::faults::{Fault, FaultScript};
use rethread_fake_appserver::{FakeAppServer, FakeHandle};
use rethread_runtime::{
    AppServerClient, BinderOptions, ClientOptions, OpenOutcome, Publication, RuntimeError,
    SessionBinder, StatusRail,
};
use rethread_store::{open_url, BindingStore, OpenOptions};
use serde::{Deserialize, Serialize};
use serde_json::Value;

const CHILDREN: usize = 4;
const TURNS: usize = 6;
const SESSIONS: usize = 3;

#[derive(Debug, Serialize, Deserialize)]
struct TurnRecord {
    child: usize,
    session: String,
    start_us: u128,
    end_us: u128,
    fence: u64,
    thread_id: String,
    published: bool,
    rows: Vec<Value>,
    busy_retries: u32,
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// Whether this process is a child a test below started (a copy of this test binary run with
/// `--exact` that test's own name and the child's variables): the child's body has then run in
/// place of the test. A plain run sets none of the variables, so every test is a parent.
fn ran_as_child() -> bool {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let var = |name| std::env::var(name).ok();
    if let (Some(url), Some(out), Some(id)) = (
        var("RETHREAD_MP_STORE"),
        var("RETHREAD_MP_OUT"),
        var("RETHREAD_MP_CHILD"),
    ) {
        runtime().block_on(multi_process_child(&url, &out, id.parse().unwrap()));
        return true;
    }
    if let (Some(url), Some(mode), Some(out)) = (
        var("RETHREAD_FAULT_STORE"),
        var("RETHREAD_FAULT_MODE"),
        var("RETHREAD_FAULT_OUT"),
    ) {
        runtime().block_on(fault_child(&url, &mode, &out));
        return true;
    }
    false
}

/// This test binary, to run `test` alone (which runs a child's body: [`ran_as_child`]).
fn child_of(test: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .stdout(std::process::Stdio::null());
    command
}

/// The body of a child of the multi-process tests: its turns, recorded in `out`.
async fn multi_process_child(url: &str, out: &str, child: usize) {
    let store = open_url(url, OpenOptions::new()).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let (stream, _fake) = FakeAppServer::builder()
        .codex_home(home.path())
        .spawn_in_process()
        .unwrap();
    let (reader, writer) = tokio::io::split(stream);
    let client = AppServerClient::builder()
        .options(ClientOptions::default().request_timeout(Duration::from_secs(20)))
        .connect(reader, writer)
        .await
        .unwrap();
    let mut records = Vec::new();
    for turn in 0..TURNS {
        let session = format!("mp-{}", (child + turn) % SESSIONS);
        let record = run_one(&store, &client, home.path(), child, turn, &session).await;
        records.push(record);
    }
    let mut file = std::fs::File::create(out).unwrap();
    for r in &records {
        writeln!(file, "{}", serde_json::to_string(r).unwrap()).unwrap();
    }
}

async fn run_one(
    store: &BindingStore,
    client: &AppServerClient,
    home: &std::path::Path,
    child: usize,
    turn: usize,
    session: &str,
) -> TurnRecord {
    let mut busy_retries = 0;
    loop {
        let mut agent = SessionBinder::new(session, store.clone(), StatusRail::default())
            .with_options(
                BinderOptions::default()
                    .codex_home(Some(home.display().to_string()))
                    .retry_backoff(Duration::from_millis(1))
                    .turn_timeout(Duration::from_secs(20))
                    .lease_ttl(Some(Duration::from_secs(10))),
            );
        let mut codex = match agent.open(client).await {
            Ok(codex) => codex,
            Err(RuntimeError::SessionBusy { .. }) => {
                busy_retries += 1;
                tokio::time::sleep(Duration::from_millis(
                    3 + (child as u64 * 7 + busy_retries as u64) % 11,
                ))
                .await;
                continue;
            }
            Err(other) => panic!("child {child}: open {session}: {other}"),
        };
        let start_us = now_us();
        let fence = codex.lease().unwrap().fence;
        let report = codex
            .run_turn(&format!("child {child} turn {turn}"))
            .await
            .unwrap_or_else(|e| panic!("child {child}: turn on {session}: {e}"));
        let end_us = now_us();
        drop(codex);
        agent.close().await.unwrap();
        return TurnRecord {
            child,
            session: session.to_string(),
            start_us,
            end_us,
            fence,
            thread_id: report.thread_id,
            published: report.publication == Publication::Published,
            rows: report.rows,
            busy_retries,
        };
    }
}

/// A client on an in-process fake with its own codex home (kept alive by the returned guard).
async fn fake_client(faults: FaultScript) -> (AppServerClient, (tempfile::TempDir, FakeHandle)) {
    let home = tempfile::tempdir().unwrap();
    let (stream, fake) = FakeAppServer::builder()
        .codex_home(home.path())
        .faults(faults)
        .spawn_in_process()
        .unwrap();
    let (reader, writer) = tokio::io::split(stream);
    let client = AppServerClient::builder()
        .options(ClientOptions::default().request_timeout(Duration::from_secs(30)))
        .connect(reader, writer)
        .await
        .unwrap();
    (client, (home, fake))
}

/// The body of a child of the fault tests.
///
/// `hold`: takes session `x`'s lease (TTL 60 s) through a binder, says so, and waits to be
/// killed. `stall`: opens `x` (TTL 1 s), says so, runs one slow turn (the parent stops and
/// continues it meanwhile) and writes how the turn ended.
async fn fault_child(url: &str, mode: &str, out: &str) {
    let store = open_url(url, OpenOptions::new()).await.unwrap();
    let slow = FaultScript::of([Fault::SlowTurn { millis: 3_000 }]);
    let (client, _guard) = fake_client(slow).await;
    let ttl = if mode == "hold" { 60 } else { 1 };
    let mut binder = SessionBinder::new("x", store.clone(), StatusRail::default()).with_options(
        BinderOptions::default()
            .lease_ttl(Some(Duration::from_secs(ttl)))
            .turn_timeout(Duration::from_secs(60)),
    );
    let mut session = binder.open(&client).await.unwrap();
    std::fs::write(format!("{out}.opened"), std::process::id().to_string()).unwrap();
    if mode == "hold" {
        std::future::pending::<()>().await;
    }
    let ended = match session.run_turn("from the stalled holder").await {
        Ok(report) => format!("committed {:?}", report.publication),
        Err(error) => error.kind().to_string(),
    };
    std::fs::write(out, ended).unwrap();
}

/// Starts [`fault_child`] in `mode` on `url` as a child of `test`; returns the process and the
/// path of its report once it has opened the session.
fn spawn_fault_child(
    test: &str,
    url: &str,
    mode: &str,
    dir: &std::path::Path,
) -> (std::process::Child, String) {
    let out = dir.join(format!("{mode}.out")).display().to_string();
    let child = child_of(test)
        .env("RETHREAD_FAULT_STORE", url)
        .env("RETHREAD_FAULT_MODE", mode)
        .env("RETHREAD_FAULT_OUT", &out)
        .spawn()
        .unwrap();
    let opened = format!("{out}.opened");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !std::path::Path::new(&opened).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the child never opened the session"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, out)
}

fn signal(child: &std::process::Child, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal}");
}

/// A holder SIGKILLed with the lease in hand: the next process on this machine opens the
/// session at once (its lease TTL is 60 s).
fn a_killed_holder_is_taken_over_at_once(test: &str, url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _) = spawn_fault_child(test, url, "hold", dir.path());
    signal(&child, "KILL");
    child.wait().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = open_url(url, OpenOptions::new()).await.unwrap();
        let (client, _guard) = fake_client(FaultScript::none()).await;
        let mut binder = SessionBinder::new("x", store, StatusRail::default());
        let started = std::time::Instant::now();
        let session = binder
            .open(&client)
            .await
            .unwrap_or_else(|e| panic!("the dead holder's lease was not taken over: {e}"));
        assert!(matches!(session.outcome(), OpenOutcome::Started { .. }));
        assert!(started.elapsed() < Duration::from_secs(10));
        drop(session);
        binder.close().await.unwrap();
    });
}

/// A holder SIGSTOPped mid-turn past its TTL while this process takes the session over and
/// commits: continued, the holder gets `LeaseLost` and writes nothing.
fn a_stalled_holder_writes_nothing_after_a_takeover(test: &str, url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, out) = spawn_fault_child(test, url, "stall", dir.path());
    signal(&child, "STOP");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ours = runtime.block_on(async {
        let store = open_url(url, OpenOptions::new()).await.unwrap();
        let (client, _guard) = fake_client(FaultScript::none()).await;
        // Waits out the stalled holder's TTL (1 s): the lease is taken once it has expired.
        let mut binder = SessionBinder::new("x", store, StatusRail::default())
            .with_options(BinderOptions::default().lease_wait(Duration::from_secs(30)));
        let mut session = binder
            .open(&client)
            .await
            .expect("taken over after the TTL");
        let report = session.run_turn("from the new holder").await.unwrap();
        assert_eq!(report.publication, Publication::Published);
        drop(session);
        binder.close().await.unwrap();
        report
    });
    signal(&child, "CONT");
    assert!(child.wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "lease_lost");
    runtime.block_on(async {
        let store = open_url(url, OpenOptions::new()).await.unwrap();
        let record = store.session("x").await.unwrap().unwrap();
        assert_eq!(record.thread_id(), Some(ours.thread_id.as_str()));
        let rows: Vec<Value> = store
            .rows("x", 0..u64::MAX)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.body)
            .collect();
        assert_eq!(rows, ours.rows, "only the new holder's rows");
    });
}

fn postgres_url(name: &str) -> Option<String> {
    rethread_testkit::postgres::fresh_url(name)
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    let url = format!("sqlite:{}", dir.path().join("shared.sqlite").display());
    // Create the file before any child opens it.
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async { open_url(&url, OpenOptions::new()).await.unwrap() });
    url
}

fn postgres_ready(name: &str) -> Option<String> {
    let url = postgres_url(name)?;
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async { open_url(&url, OpenOptions::new()).await.unwrap() });
    Some(url)
}

#[test]
fn a_killed_holder_is_taken_over_at_once_on_sqlite() {
    if ran_as_child() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    a_killed_holder_is_taken_over_at_once(
        "a_killed_holder_is_taken_over_at_once_on_sqlite",
        &sqlite_url(&dir),
    );
}

#[test]
fn a_killed_holder_is_taken_over_at_once_on_postgres() {
    if ran_as_child() {
        return;
    }
    if let Some(url) = postgres_ready("killed") {
        a_killed_holder_is_taken_over_at_once(
            "a_killed_holder_is_taken_over_at_once_on_postgres",
            &url,
        );
    }
}

#[test]
fn a_stalled_holder_writes_nothing_after_a_takeover_on_sqlite() {
    if ran_as_child() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    a_stalled_holder_writes_nothing_after_a_takeover(
        "a_stalled_holder_writes_nothing_after_a_takeover_on_sqlite",
        &sqlite_url(&dir),
    );
}

#[test]
fn a_stalled_holder_writes_nothing_after_a_takeover_on_postgres() {
    if ran_as_child() {
        return;
    }
    if let Some(url) = postgres_ready("stalled") {
        a_stalled_holder_writes_nothing_after_a_takeover(
            "a_stalled_holder_writes_nothing_after_a_takeover_on_postgres",
            &url,
        );
    }
}

/// Runs [`CHILDREN`] children of `test` on `url`; returns their records.
fn run_children(test: &str, url: &str) -> Vec<TurnRecord> {
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..CHILDREN)
        .map(|child| {
            let out = dir.path().join(format!("child-{child}.jsonl"));
            let process = child_of(test)
                .env("RETHREAD_MP_STORE", url)
                .env("RETHREAD_MP_OUT", &out)
                .env("RETHREAD_MP_CHILD", child.to_string())
                .spawn()
                .unwrap();
            (process, out)
        })
        .collect();
    let mut records = Vec::new();
    for (mut process, out) in children {
        assert!(process.wait().unwrap().success(), "a child failed");
        let text = std::fs::read_to_string(&out).unwrap();
        records.extend(
            text.lines()
                .map(|l| serde_json::from_str::<TurnRecord>(l).unwrap()),
        );
    }
    assert_eq!(records.len(), CHILDREN * TURNS);
    records
}

async fn check(url: &str, records: Vec<TurnRecord>) {
    let store = open_url(url, OpenOptions::new()).await.unwrap();
    let mut by_session: BTreeMap<String, Vec<TurnRecord>> = BTreeMap::new();
    for r in records {
        by_session.entry(r.session.clone()).or_default().push(r);
    }
    let mut contended = 0;
    for (session, mut turns) in by_session {
        // Leases: ordered by start, each holder's interval ends before the next begins, and
        // the store's fences grow in the same order.
        turns.sort_by_key(|t| t.start_us);
        for pair in turns.windows(2) {
            assert!(
                pair[0].end_us <= pair[1].start_us,
                "{session}: child {} held the lease {}..{} while child {} held it from {}",
                pair[0].child,
                pair[0].start_us,
                pair[0].end_us,
                pair[1].child,
                pair[1].start_us
            );
            assert!(
                pair[0].fence < pair[1].fence,
                "{session}: fences out of order"
            );
        }
        contended += turns.iter().map(|t| t.busy_retries).sum::<u32>();
        // Rows: exactly the rows the turns committed, each turn's rows contiguous, in the
        // order the leases were held.
        let stored = store.rows(&session, 0..u64::MAX).await.unwrap();
        let expected: Vec<Value> = turns.iter().flat_map(|t| t.rows.clone()).collect();
        assert_eq!(
            stored.len(),
            expected.len(),
            "{session}: rows lost or duplicated"
        );
        for (i, row) in stored.iter().enumerate() {
            assert_eq!(row.seq, i as u64);
            assert_eq!(row.body, expected[i], "{session}: row {i}");
        }
        // Bindings: I1 (the last committed turn's thread) and I2 (never retired).
        let record = store.session(&session).await.unwrap().unwrap();
        let last = turns.last().unwrap();
        assert!(
            last.published,
            "{session}: the last turn's thread was retired?"
        );
        assert_eq!(
            record.thread_id(),
            Some(last.thread_id.as_str()),
            "{session}: I1"
        );
        assert!(!record.is_retired(&last.thread_id), "{session}: I2");
        assert_eq!(record.row_count, expected.len() as u64);
    }
    eprintln!("multi-process: {contended} busy retries across sessions");
}

#[test]
fn processes_share_sessions_on_one_sqlite_file() {
    if ran_as_child() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let records = run_children("processes_share_sessions_on_one_sqlite_file", &url);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(check(&url, records));
}

#[test]
fn processes_share_sessions_on_one_postgres_database() {
    if ran_as_child() {
        return;
    }
    let Some(url) = postgres_ready("mp") else {
        return;
    };
    let records = run_children("processes_share_sessions_on_one_postgres_database", &url);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(check(&url, records));
}
