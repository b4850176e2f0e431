//! End-to-end against the real codex app-server (current and previous release, and the floor;
//! see `rethread_testkit::releases`), offline,
//! with the model played by the Responses-API stand-in. The proof that memory survives is
//! the model's own request: after a restart it must contain the word from turn 1.
//!
//! Binaries come from `cargo xtask codex` (see `rethread_testkit::real`); without them
//! these tests skip with a message, except under CI where they fail.

use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rethread_protocol::ResumeFailure;
use rethread_runtime::{
    AppServerClient, BinderOptions, OpenOutcome, RecordedEvents, RuntimeError, SessionBinder,
    StatusKind, StatusRail, RESUME_FALLBACK_NOTICE,
};
use rethread_store::{BindingStore, OpenOptions};
use rethread_testkit::real::{codex_or_skip, rollout_files, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::{recent_releases, FLOOR};
use tokio::io::AsyncWrite;
use tokio::process::{Child, Command};

/// Records every byte the client writes, to assert the exact method sequence on the wire.
struct Tee<W> {
    inner: W,
    log: Arc<Mutex<Vec<u8>>>,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Tee<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            this.log.lock().unwrap().extend_from_slice(&buf[..n]);
        }
        polled
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One spawned real app-server and the client connected to it.
struct Server {
    client: AppServerClient,
    child: Child,
    sent: Arc<Mutex<Vec<u8>>>,
}

impl Server {
    async fn spawn(binary: &Path, home: &Path, rail: StatusRail) -> Server {
        let mut child = Command::new(binary)
            .arg("app-server")
            .env("CODEX_HOME", home)
            .env("RUST_LOG", "error")
            .current_dir(home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn codex");
        let sent = Arc::new(Mutex::new(Vec::new()));
        let writer = Tee {
            inner: child.stdin.take().unwrap(),
            log: sent.clone(),
        };
        let client = AppServerClient::builder()
            .rail(rail)
            .connect(child.stdout.take().unwrap(), writer)
            .await
            .expect("initialize the real codex");
        Server {
            client,
            child,
            sent,
        }
    }

    /// Methods the client sent after the handshake.
    fn methods(&self) -> Vec<String> {
        let sent = self.sent.lock().unwrap();
        String::from_utf8_lossy(&sent)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v.get("method").and_then(|m| m.as_str()).map(str::to_string))
            .filter(|m| m != "initialize" && m != "initialized")
            .collect()
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

struct World {
    model: ResponsesStandIn,
    home: CodexHome,
    store: BindingStore,
    /// The rollout mirror is on (`tests/real_mirror.rs` covers it; the fallbacks here are
    /// those of a thread codex has lost and the store has not mirrored).
    mirror: bool,
    _dir: tempfile::TempDir,
}

impl World {
    /// A world without the rollout mirror: a lost rollout stays lost.
    async fn without_mirror() -> World {
        World {
            mirror: false,
            ..World::new().await
        }
    }

    async fn new() -> World {
        let model = ResponsesStandIn::start().unwrap();
        let home = CodexHome::new(&model).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = BindingStore::redb(dir.path().join("rethread.redb"), OpenOptions::default())
            .await
            .unwrap();
        World {
            model,
            home,
            store,
            mirror: true,
            _dir: dir,
        }
    }

    fn agent(&self, rail: StatusRail, home: &Path) -> SessionBinder {
        let options = BinderOptions::default()
            .codex_home(Some(home.display().to_string()))
            .mirror(self.mirror)
            .retry_backoff(Duration::from_millis(50))
            .transient_retries(1);
        SessionBinder::new("session-1", self.store.clone(), rail).with_options(options)
    }

    /// An agent that takes no session lease, to observe codex's own single-writer guard (a
    /// leased agent would be stopped by rethread's lease before codex is asked).
    fn unleased_agent(&self, rail: StatusRail, home: &Path) -> SessionBinder {
        let agent = self.agent(rail, home);
        let options = BinderOptions::default()
            .codex_home(Some(home.display().to_string()))
            .mirror(self.mirror)
            .retry_backoff(Duration::from_millis(50))
            .transient_retries(1)
            .lease_ttl(None);
        agent.with_options(options)
    }

    /// Turn 1 on a fresh agent and server; returns the bound thread id.
    async fn first_turn(&self, binary: &Path) -> String {
        let (rail, _) = StatusRail::recording();
        let server = Server::spawn(binary, self.home.path(), rail.clone()).await;
        let mut agent = self.agent(rail, self.home.path());
        let mut session = agent.open(&server.client).await.unwrap();
        assert!(matches!(session.outcome(), OpenOutcome::Started { .. }));
        let report = session
            .run_turn("Please remember the word PAPAYA.")
            .await
            .unwrap();
        assert_eq!(report.reply, "echo: Please remember the word PAPAYA.");
        let thread = session.thread_id().to_string();
        assert_eq!(
            self.store
                .session("session-1")
                .await
                .unwrap()
                .unwrap()
                .thread_id(),
            Some(thread.as_str())
        );
        server.stop().await;
        thread
    }

    /// A rebuilt agent on a new server runs turn 2; returns its outcome, wire methods, notices.
    async fn second_turn(
        &self,
        binary: &Path,
        home: &Path,
    ) -> (OpenOutcome, Vec<String>, RecordedEvents) {
        let (rail, recorded) = StatusRail::recording();
        let server = Server::spawn(binary, home, rail.clone()).await;
        let mut agent = self.agent(rail, home);
        let mut session = agent.open(&server.client).await.unwrap();
        session.run_turn("What was the word?").await.unwrap();
        let outcome = session.outcome().clone();
        let methods = server.methods();
        server.stop().await;
        (outcome, methods, recorded)
    }

    fn last_model_request_mentions(&self, word: &str) -> bool {
        let requests = self.model.model_requests();
        let last = requests.last().expect("a model request");
        String::from_utf8_lossy(&last.body).contains(word)
    }
}

async fn memory_survives_a_restart(version: &str) {
    let Some(codex) = codex_or_skip(version) else {
        return;
    };
    let world = World::new().await;
    let thread = world.first_turn(&codex).await;
    let (outcome, methods, recorded) = world.second_turn(&codex, world.home.path()).await;
    assert_eq!(
        outcome,
        OpenOutcome::Resumed {
            thread_id: thread.clone()
        }
    );
    assert_eq!(
        methods,
        ["thread/resume", "turn/start"],
        "I3: resume then turn, no thread/start"
    );
    assert!(
        recorded.messages(StatusKind::Lifecycle).is_empty(),
        "I6: no notice on a resume"
    );
    assert!(
        world.last_model_request_mentions("PAPAYA"),
        "the resumed thread kept its memory"
    );
    let record = world.store.session("session-1").await.unwrap().unwrap();
    assert_eq!(record.thread_id(), Some(thread.as_str()));
    assert_eq!(record.row_count, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_survives_a_restart_on_current_codex() {
    for version in recent_releases() {
        memory_survives_a_restart(&version).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_survives_a_restart_on_the_compatibility_floor() {
    memory_survives_a_restart(FLOOR).await;
}

async fn assert_fell_back_once(
    world: &World,
    lost: &str,
    (outcome, methods, recorded): (OpenOutcome, Vec<String>, RecordedEvents),
    expected_reason: ResumeFailure,
) {
    let OpenOutcome::FellBack {
        thread_id,
        previous_thread_id,
        reason,
        seeded,
        ..
    } = outcome
    else {
        panic!("expected a fallback, got {outcome:?}")
    };
    assert_eq!(previous_thread_id, lost);
    assert_eq!(reason, expected_reason);
    assert!(seeded);
    assert_eq!(
        methods,
        ["thread/resume", "thread/start", "turn/start"],
        "I4"
    );
    assert_eq!(
        recorded.messages(StatusKind::Lifecycle),
        [RESUME_FALLBACK_NOTICE]
    );
    let record = world.store.session("session-1").await.unwrap().unwrap();
    assert_eq!(
        record.thread_id(),
        Some(thread_id.as_str()),
        "binding rotated once the turn committed"
    );
    assert!(record.is_retired(lost));
    assert_eq!(record.row_count, 4, "I5: no row lost or duplicated");
    // Seeding: the fresh thread's model request carries the old transcript.
    assert!(
        world.last_model_request_mentions("PAPAYA"),
        "seeded from the host transcript"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_rollout_falls_back_with_one_notice() {
    for version in recent_releases() {
        let Some(codex) = codex_or_skip(&version) else {
            continue;
        };
        let world = World::without_mirror().await;
        let thread = world.first_turn(&codex).await;
        let files = rollout_files(world.home.path());
        assert_eq!(files.len(), 1, "{files:?}");
        std::fs::remove_file(&files[0]).unwrap();
        let second = world.second_turn(&codex, world.home.path()).await;
        assert_fell_back_once(&world, &thread, second, ResumeFailure::Gone).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_codex_home_falls_back_with_one_notice() {
    for version in recent_releases() {
        let Some(codex) = codex_or_skip(&version) else {
            continue;
        };
        let world = World::without_mirror().await;
        let thread = world.first_turn(&codex).await;
        let other_home = CodexHome::new(&world.model).unwrap();
        let second = world.second_turn(&codex, other_home.path()).await;
        assert_fell_back_once(&world, &thread, second, ResumeFailure::Gone).await;
        let binding = world
            .store
            .session("session-1")
            .await
            .unwrap()
            .unwrap()
            .binding()
            .cloned()
            .unwrap();
        assert_eq!(
            binding.codex_home.as_deref(),
            Some(other_home.path().display().to_string().as_str())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paginated_thread_under_the_older_codex_falls_back_with_one_notice() {
    for version in recent_releases() {
        let (Some(current), Some(older)) = (codex_or_skip(&version), codex_or_skip(FLOOR)) else {
            continue;
        };
        let world = World::new().await;
        let thread = world.first_turn(&current).await;
        let second = world.second_turn(&older, world.home.path()).await;
        assert_fell_back_once(&world, &thread, second, ResumeFailure::Incompatible).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_thread_from_the_older_codex_resumes_under_current_with_its_memory() {
    for version in recent_releases() {
        let (Some(current), Some(older)) = (codex_or_skip(&version), codex_or_skip(FLOOR)) else {
            continue;
        };
        let world = World::new().await;
        let thread = world.first_turn(&older).await;
        let (outcome, methods, recorded) = world.second_turn(&current, world.home.path()).await;
        assert_eq!(outcome, OpenOutcome::Resumed { thread_id: thread });
        assert_eq!(methods, ["thread/resume", "turn/start"]);
        assert!(recorded.messages(StatusKind::Lifecycle).is_empty());
        assert!(world.last_model_request_mentions("PAPAYA"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_live_in_another_process_is_busy_and_the_store_is_unharmed() {
    for version in recent_releases() {
        busy_elsewhere(&version).await;
    }
}

/// Observed: 0.144.6 has no single-writer guard, so a second process resumes a live thread.
/// Pinned here because it is why rethread needs its own per-session lease across hosts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_lets_a_second_process_resume_a_live_thread() {
    let Some(codex) = codex_or_skip(FLOOR) else {
        return;
    };
    let world = World::new().await;
    let thread = world.first_turn(&codex).await;
    let (rail, _) = StatusRail::recording();
    let holder = Server::spawn(&codex, world.home.path(), rail.clone()).await;
    let live = world
        .agent(rail.clone(), world.home.path())
        .open(&holder.client)
        .await
        .unwrap();
    assert_eq!(
        live.outcome(),
        &OpenOutcome::Resumed {
            thread_id: thread.clone()
        }
    );
    let contender = Server::spawn(&codex, world.home.path(), rail.clone()).await;
    let second = world
        .unleased_agent(rail.clone(), world.home.path())
        .open(&contender.client)
        .await
        .unwrap();
    assert_eq!(
        second.outcome(),
        &OpenOutcome::Resumed { thread_id: thread }
    );
    // rethread's lease is what stops a second host: a leased agent is refused before codex
    // is asked anything.
    let before = contender.methods().len();
    match world
        .agent(rail, world.home.path())
        .open(&contender.client)
        .await
    {
        Err(RuntimeError::SessionBusy { holder, .. }) => {
            assert_eq!(holder.pid, std::process::id());
        }
        other => panic!(
            "expected SessionBusy, got {:?}",
            other.map(|s| s.outcome().clone())
        ),
    }
    assert_eq!(contender.methods().len(), before, "no request sent");
    contender.stop().await;
    holder.stop().await;
}

async fn busy_elsewhere(version: &str) {
    let Some(codex) = codex_or_skip(version) else {
        return;
    };
    let world = World::new().await;
    let thread = world.first_turn(&codex).await;
    // Process A resumes the thread and keeps it live.
    let (rail_a, _) = StatusRail::recording();
    let holder = Server::spawn(&codex, world.home.path(), rail_a.clone()).await;
    let mut agent_a = world.agent(rail_a, world.home.path());
    let live = agent_a.open(&holder.client).await.unwrap();
    assert_eq!(
        live.outcome(),
        &OpenOutcome::Resumed {
            thread_id: thread.clone()
        }
    );
    let before = world.store.export_session("session-1").await.unwrap();
    // Process B, same home, cannot take it.
    let (rail_b, recorded_b) = StatusRail::recording();
    let contender = Server::spawn(&codex, world.home.path(), rail_b.clone()).await;
    let mut agent_b = world.unleased_agent(rail_b, world.home.path());
    match agent_b.open(&contender.client).await {
        Err(RuntimeError::ThreadBusy { thread_id, message }) => {
            assert_eq!(thread_id, thread);
            assert!(message.contains("active writer"), "{message}");
        }
        other => panic!(
            "expected busy, got {:?}",
            other.map(|s| s.outcome().clone())
        ),
    }
    assert_eq!(
        world.store.export_session("session-1").await.unwrap(),
        before,
        "nothing in the store harmed"
    );
    assert!(recorded_b.messages(StatusKind::Lifecycle).is_empty());
    assert_eq!(contender.methods(), ["thread/resume", "thread/resume"]);
    contender.stop().await;
    holder.stop().await;
}
