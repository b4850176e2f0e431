//! Model-based property test: random sequences of turns, agent rebuilds,
//! app-server restarts and kills, damaged rollouts, a changed `CODEX_HOME`, retires, a codex
//! downgrade to the compatibility floor (paginated threads become unresumable), overloaded and
//! busy answers, run against the in-process fake and a plain model of what must hold.
//! I1-I7 are asserted after every step. Each history runs with the rollout mirror on or off:
//! with it, the bound thread survives a damaged or deleted rollout and a move to the other
//! `CODEX_HOME` (restored from the store), never the compatibility floor.
//!
//! `RETHREAD_MODEL_CASES` sets the number of cases (default 256; `cargo xtask ci` runs 2000).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use proptest::prelude::*;
use rethread_fake_appserver::faults::{Corruption, Fault, FaultScript};
use rethread_fake_appserver::{FakeAppServer, FakeHandle, Profile};
use rethread_protocol::messages::{ThreadResume, ThreadResumeParams};
use rethread_runtime::{
    AppServerClient, BinderOptions, ClientOptions, CodexSession, OpenOutcome, RecordedEvents,
    RuntimeError, SessionBinder, StatusKind, StatusRail, RESUME_FALLBACK_NOTICE,
};
use rethread_store::BindingStore;
use serde_json::{json, Map};

const SESSION: &str = "s";
const RETRIES: u32 = 2;

#[derive(Debug, Clone)]
enum Op {
    /// A turn; opens a codex session first when none is open.
    Turn(u8),
    /// The host rebuilds its agent (every open reads the store and resumes).
    RebuildAgent,
    /// The app-server process restarts; the host rebuilds client and agent.
    Restart,
    /// The app-server dies; a turn attempted meanwhile fails typed and writes nothing.
    Kill,
    /// The bound thread's rollout is damaged while the server is down.
    Damage(Corruption),
    /// The host moves to the other `CODEX_HOME`.
    SwitchHome,
    /// The open session's thread is retired.
    Retire,
    /// The binary changes to `profile` (a downgrade to the floor, or back).
    SwitchProfile(Profile),
    /// The next resumes are answered overloaded `n` times.
    Overloaded(u32),
    /// Another process holds the bound thread while a rebuilt agent tries to resume it.
    Contended,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => any::<u8>().prop_map(Op::Turn),
        3 => Just(Op::RebuildAgent),
        2 => Just(Op::Restart),
        1 => Just(Op::Kill),
        2 => prop_oneof![
            Just(Corruption::Delete),
            Just(Corruption::Empty),
            Just(Corruption::Garbage),
            Just(Corruption::TornTail)
        ]
        .prop_map(Op::Damage),
        1 => Just(Op::SwitchHome),
        1 => Just(Op::Retire),
        1 => prop_oneof![Just(Profile::Current), Just(Profile::ReleaseN)].prop_map(Op::SwitchProfile),
        1 => (1u32..=4).prop_map(Op::Overloaded),
        1 => Just(Op::Contended),
    ]
}

/// What the model knows of a thread.
#[derive(Debug, Clone)]
struct ThreadFacts {
    home: usize,
    paginated: bool,
    /// Materialized with at least one completed turn, rollout intact.
    resumable: bool,
    /// The user texts of its completed turns.
    said: Vec<String>,
}

/// The reference model.
#[derive(Debug, Default)]
struct Model {
    binding: Option<String>,
    /// The thread given up (its notice delivered: the rail took it), with no binding
    /// published since.
    given_up: Option<String>,
    retired: BTreeSet<String>,
    /// `(thread, role, text)` of every committed row, in order.
    rows: Vec<(String, String, String)>,
    threads: HashMap<String, ThreadFacts>,
}

struct Home {
    fake: FakeHandle,
    profile: Profile,
    _dir: tempfile::TempDir,
}

struct World {
    store: BindingStore,
    homes: Vec<Home>,
    current: usize,
    client: AppServerClient,
    agent: SessionBinder,
    session: Option<CodexSession>,
    rail: StatusRail,
    recorded: RecordedEvents,
    model: Model,
    overloaded_pending: u32,
    /// Overloaded answers each home's fake has given so far.
    overloaded_used: [u32; 2],
    /// The rollout mirror is on.
    mirror: bool,
}

fn agent_options(home: &Home, mirror: bool) -> BinderOptions {
    BinderOptions::default()
        .mirror(mirror)
        .codex_home(Some(home.fake.codex_home().display().to_string()))
        .transient_retries(RETRIES)
        .retry_backoff(Duration::from_millis(0))
        .turn_timeout(Duration::from_secs(10))
}

async fn connect(stream: tokio::io::DuplexStream, rail: &StatusRail) -> AppServerClient {
    let (reader, writer) = tokio::io::split(stream);
    let options = ClientOptions::default().request_timeout(Duration::from_secs(10));
    AppServerClient::builder()
        .options(options)
        .rail(rail.clone())
        .connect(reader, writer)
        .await
        .unwrap()
}

impl World {
    async fn new(mirror: bool) -> World {
        let store = BindingStore::memory();
        // A host key that must survive everything (I5).
        let mut patch = Map::new();
        patch.insert("host_key".into(), json!("keep"));
        store.patch_config(SESSION, patch, None).await.unwrap();
        let mut homes = Vec::new();
        let mut first_stream = None;
        for _ in 0..2 {
            let dir = tempfile::tempdir().unwrap();
            let (stream, fake) = FakeAppServer::builder()
                .codex_home(dir.path())
                .spawn_in_process()
                .unwrap();
            if first_stream.is_none() {
                first_stream = Some(stream);
            } else {
                fake.kill().await;
            }
            homes.push(Home {
                fake,
                profile: Profile::Current,
                _dir: dir,
            });
        }
        let (rail, recorded) = StatusRail::recording();
        let client = connect(first_stream.unwrap(), &rail).await;
        let agent = SessionBinder::new(SESSION, store.clone(), rail.clone())
            .with_options(agent_options(&homes[0], mirror));
        World {
            store,
            homes,
            current: 0,
            client,
            agent,
            session: None,
            rail,
            recorded,
            model: Model::default(),
            overloaded_pending: 0,
            overloaded_used: [0; 2],
            mirror,
        }
    }

    fn home(&self) -> &Home {
        &self.homes[self.current]
    }

    fn rebuild_agent(&mut self) {
        self.session = None;
        self.agent = SessionBinder::new(SESSION, self.store.clone(), self.rail.clone())
            .with_options(agent_options(self.home(), self.mirror));
    }

    async fn restart(&mut self) {
        self.session = None;
        self.client.shutdown().await;
        let stream = self.home().fake.restart().await.unwrap();
        self.client = connect(stream, &self.rail).await;
        self.rebuild_agent();
    }

    /// Whether the bound thread can be resumed by the current server, per the model: its
    /// rollout is intact in this home, or (mirror on) the store's mirror restores it here;
    /// either way not a paginated thread under the floor.
    fn resumable(&self, thread: &str) -> bool {
        let restored = self.mirror && self.model.binding.as_deref() == Some(thread);
        (restored || self.on_this_home(thread)) && self.served(thread)
    }

    /// Whether this home holds the thread's rollout intact (without any restore).
    fn on_this_home(&self, thread: &str) -> bool {
        self.model
            .threads
            .get(thread)
            .is_some_and(|facts| facts.resumable && facts.home == self.current)
    }

    /// Whether the current binary serves the thread's history mode.
    fn served(&self, thread: &str) -> bool {
        self.model
            .threads
            .get(thread)
            .is_some_and(|facts| !(facts.paginated && self.home().profile == Profile::ReleaseN))
    }

    async fn open(&mut self) -> Result<(), TestCaseError> {
        let methods_before = self.home().fake.methods().len();
        let notices_before = self.recorded.messages(StatusKind::Lifecycle).len();
        let bound = self.model.binding.clone();
        let overloaded = std::mem::take(&mut self.overloaded_pending);
        if bound.is_some() && overloaded > RETRIES {
            // Overload past the retries is temporary: a retryable error, the binding kept,
            // nothing written, no notice, no new thread (whether or not the thread is lost).
            let before = self.store.export_session(SESSION).await.unwrap();
            let attempt = self.agent.open(&self.client).await;
            prop_assert!(
                matches!(
                    attempt,
                    Err(RuntimeError::ResumeUnavailable {
                        failure: rethread_protocol::ResumeFailure::Overloaded,
                        ..
                    })
                ),
                "{:?}",
                attempt.map(|s| s.outcome().clone())
            );
            let methods: Vec<String> = self.home().fake.methods()[methods_before..].to_vec();
            prop_assert_eq!(
                methods,
                vec!["thread/resume".to_string(); RETRIES as usize + 1]
            );
            prop_assert_eq!(self.store.export_session(SESSION).await.unwrap(), before);
            prop_assert_eq!(
                self.recorded.messages(StatusKind::Lifecycle).len(),
                notices_before
            );
            self.home().fake.set_faults(FaultScript::none());
            return Ok(());
        }
        let session = self
            .agent
            .open(&self.client)
            .await
            .map_err(|e| TestCaseError::fail(format!("open: {e}")))?;
        let methods: Vec<String> = self.home().fake.methods()[methods_before..]
            .iter()
            .filter(|m| *m != "initialize")
            .cloned()
            .collect();
        let notices = self.recorded.messages(StatusKind::Lifecycle)[notices_before..].to_vec();
        let new_thread = session.thread_id().to_string();
        match (&bound, session.outcome()) {
            // A fresh session, the host's own retire, or a delivered give-up whose replacement
            // never committed: a new thread, nothing said (again).
            (None, OpenOutcome::Started { .. }) => {
                prop_assert_eq!(methods, vec!["thread/start".to_string()]);
                prop_assert!(notices.is_empty(), "I6, 19.7: no notice for a fresh start");
            }
            (Some(thread), OpenOutcome::Resumed { thread_id }) => {
                prop_assert_eq!(thread, thread_id);
                prop_assert!(
                    self.resumable(thread),
                    "resumed a thread the model says is lost"
                );
                let resumes = vec!["thread/resume".to_string(); overloaded as usize + 1];
                prop_assert_eq!(methods, resumes, "I3: only thread/resume before the turn");
                prop_assert!(notices.is_empty(), "I6: no notice on a successful resume");
                if self.mirror {
                    // Restored here whole: this home now holds the thread.
                    let current = self.current;
                    let facts = self.model.threads.get_mut(thread).unwrap();
                    facts.resumable = true;
                    facts.home = current;
                }
            }
            (
                Some(thread),
                OpenOutcome::FellBack {
                    previous_thread_id, ..
                },
            ) => {
                prop_assert_eq!(thread, previous_thread_id);
                prop_assert!(!self.resumable(thread), "fell back from a resumable thread");
                prop_assert_eq!(
                    methods.last().map(String::as_str),
                    Some("thread/start"),
                    "I4: a fresh thread on the same client"
                );
                prop_assert!(methods[..methods.len() - 1]
                    .iter()
                    .all(|m| m == "thread/resume"));
                prop_assert_eq!(
                    notices,
                    vec![RESUME_FALLBACK_NOTICE.to_string()],
                    "I4: exactly one notice"
                );
                self.model.binding = None;
                self.model.given_up = Some(thread.clone());
                self.model.retired.insert(thread.clone());
            }
            (bound, outcome) => {
                prop_assert!(false, "unexpected {outcome:?} with binding {bound:?}")
            }
        }
        if overloaded > 0 {
            self.home().fake.set_faults(FaultScript::none());
        }
        let paginated = self.home().profile == Profile::Current;
        self.model.threads.entry(new_thread).or_insert(ThreadFacts {
            home: self.current,
            paginated,
            resumable: false,
            said: Vec::new(),
        });
        self.session = Some(session);
        Ok(())
    }

    async fn turn(&mut self, word: u8) -> Result<(), TestCaseError> {
        if self.session.is_none() {
            self.open().await?;
        }
        let text = format!("word-{word}");
        let session = self.session.as_mut().unwrap();
        let thread = session.thread_id().to_string();
        let model_before = self.homes[self.current].fake.model_requests().len();
        let report = session
            .run_turn(&text)
            .await
            .map_err(|e| TestCaseError::fail(format!("turn: {e}")))?;
        prop_assert_eq!(&report.reply, &format!("echo: {text}"));
        // Memory: the model saw every earlier turn of this thread.
        let facts = self.model.threads.get_mut(&thread).unwrap();
        let seen = &self.homes[self.current].fake.model_requests()[model_before..];
        prop_assert_eq!(seen.len(), 1);
        for earlier in &facts.said {
            prop_assert!(
                seen[0].saw(earlier),
                "the model forgot {earlier} on {thread}"
            );
        }
        facts.said.push(text.clone());
        facts.resumable = true;
        self.model
            .rows
            .push((thread.clone(), "user".into(), text.clone()));
        self.model
            .rows
            .push((thread.clone(), "assistant".into(), format!("echo: {text}")));
        if self.model.retired.contains(&thread) {
            prop_assert_eq!(
                report.publication,
                rethread_runtime::Publication::RetiredNotPublished
            );
        } else {
            prop_assert_eq!(report.publication, rethread_runtime::Publication::Published);
            self.model.binding = Some(thread);
            self.model.given_up = None;
        }
        Ok(())
    }

    async fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Turn(word) => self.turn(*word).await?,
            Op::RebuildAgent => self.rebuild_agent(),
            Op::Restart => self.restart().await,
            Op::Kill => {
                self.home().fake.kill().await;
                let before = self.store.export_session(SESSION).await.unwrap();
                let attempt = match self.session.as_mut() {
                    Some(session) => session.run_turn("lost").await.map(drop),
                    None => self.agent.open(&self.client).await.map(drop),
                };
                prop_assert!(
                    matches!(attempt, Err(RuntimeError::Client(_))),
                    "I7: a dead server is a typed error: {attempt:?}"
                );
                prop_assert_eq!(
                    self.store.export_session(SESSION).await.unwrap(),
                    before,
                    "nothing written"
                );
                self.restart().await;
            }
            Op::Damage(corruption) => {
                // A rollout already damaged beyond resuming is left as it is.
                let bound = self
                    .model
                    .binding
                    .clone()
                    .filter(|t| self.model.threads[t].resumable);
                if let Some(thread) = bound {
                    let facts = &self.model.threads[&thread];
                    let home = facts.home;
                    self.session = None;
                    self.homes[home].fake.kill().await;
                    self.homes[home]
                        .fake
                        .corrupt_rollout(&thread, *corruption)
                        .unwrap();
                    if *corruption != Corruption::TornTail {
                        self.model.threads.get_mut(&thread).unwrap().resumable = false;
                    }
                    self.restart().await;
                }
            }
            Op::SwitchHome => {
                self.session = None;
                self.client.shutdown().await;
                self.home().fake.kill().await;
                self.current = 1 - self.current;
                self.restart().await;
            }
            Op::Retire => {
                if let Some(session) = self.session.take() {
                    let thread = session.thread_id().to_string();
                    session.retire().await.unwrap();
                    self.model.retired.insert(thread.clone());
                    if self.model.binding.as_deref() == Some(&thread) {
                        self.model.binding = None;
                    }
                    // A host's own retire (`Retirement::Ended`) gives nothing up; an earlier
                    // give-up stays recorded.
                }
            }
            Op::SwitchProfile(profile) => {
                self.home().fake.set_profile(*profile);
                self.homes[self.current].profile = *profile;
                self.restart().await;
            }
            Op::Overloaded(n) => {
                // The fake counts a fault's attempts over its whole life (by its place in the
                // script): fail the next `n`.
                let used = self.overloaded_used[self.current];
                let fault = Fault::Overloaded {
                    method: Some("thread/resume".into()),
                    attempts: used + n,
                };
                self.home().fake.set_faults(FaultScript::of([fault]));
                self.rebuild_agent();
                if self.model.binding.is_some() {
                    self.overloaded_pending = *n;
                    self.overloaded_used[self.current] += (*n).min(RETRIES + 1);
                    self.open().await?;
                } else {
                    self.home().fake.set_faults(FaultScript::none());
                }
            }
            Op::Contended => {
                let Some(thread) = self
                    .model
                    .binding
                    .clone()
                    .filter(|t| self.on_this_home(t) && self.served(t))
                else {
                    return Ok(());
                };
                // Another process on the same home resumes the thread and keeps it.
                self.session = None;
                self.restart().await;
                let home_dir: PathBuf = self.home().fake.codex_home().to_path_buf();
                let (stream, holder) = FakeAppServer::builder()
                    .codex_home(&home_dir)
                    .profile(self.home().profile)
                    .spawn_in_process()
                    .unwrap();
                let holder_client = connect(stream, &StatusRail::recording().0).await;
                holder_client
                    .request::<ThreadResume>(&ThreadResumeParams::new(thread.clone()))
                    .await
                    .unwrap();
                let before = self.store.export_session(SESSION).await.unwrap();
                let notices_before = self.recorded.messages(StatusKind::Lifecycle).len();
                let attempt = self.agent.open(&self.client).await;
                if self.home().profile == Profile::ReleaseN {
                    // Like the real 0.144.6, the floor has no single-writer guard.
                    let outcome = attempt
                        .map(|s| s.outcome().clone())
                        .map_err(|e| e.to_string());
                    prop_assert_eq!(outcome, Ok(OpenOutcome::Resumed { thread_id: thread }));
                    holder.kill().await;
                    self.rebuild_agent();
                    return Ok(());
                }
                prop_assert!(
                    matches!(attempt, Err(RuntimeError::ThreadBusy { .. })),
                    "{:?}",
                    attempt.map(|s| s.outcome().clone())
                );
                prop_assert_eq!(
                    self.store.export_session(SESSION).await.unwrap(),
                    before,
                    "busy harms nothing"
                );
                prop_assert_eq!(
                    self.recorded.messages(StatusKind::Lifecycle).len(),
                    notices_before
                );
                holder.kill().await;
                self.rebuild_agent();
            }
        }
        Ok(())
    }

    /// I1, I2, I5 against the store.
    async fn check(&self) -> Result<(), TestCaseError> {
        let record = self.store.require_session(SESSION).await.unwrap();
        prop_assert_eq!(record.thread_id(), self.model.binding.as_deref(), "binding");
        prop_assert_eq!(
            record.model_config.get("host_key"),
            Some(&json!("keep")),
            "I5: host keys survive"
        );
        prop_assert_eq!(
            record.given_up().map(|g| g.thread_id.clone()),
            self.model.given_up.clone(),
            "the given-up thread"
        );
        prop_assert!(
            record.pending_notice().is_none(),
            "19.7: the rail took every notice, so none is pending"
        );
        let retired: BTreeSet<String> = record.retired_threads.iter().cloned().collect();
        prop_assert_eq!(&retired, &self.model.retired);
        if let Some(bound) = record.thread_id() {
            prop_assert!(!retired.contains(bound), "I2: never a retired thread");
            prop_assert!(
                self.model.rows.iter().any(|(thread, _, _)| thread == bound),
                "I1: the bound thread has a committed turn"
            );
        }
        if let (true, Some(bound)) = (self.mirror, record.thread_id()) {
            prop_assert!(
                record.mirror.has_thread(bound),
                "I1: the bound thread's rollout is in the store with its last turn"
            );
        }
        let rows = self.store.all_rows(SESSION).await.unwrap();
        let got: Vec<(String, String, String)> = rows
            .iter()
            .map(|row| {
                let field = |k: &str| row.body[k].as_str().unwrap_or_default().to_string();
                (field("thread_id"), field("role"), field("text"))
            })
            .collect();
        prop_assert_eq!(&got, &self.model.rows, "I5: rows never lost or duplicated");
        prop_assert!(rows.iter().enumerate().all(|(i, r)| r.seq == i as u64));
        Ok(())
    }
}

fn run_case(ops: Vec<Op>, mirror: bool) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut world = World::new(mirror).await;
        for op in &ops {
            world.apply(op).await?;
            world.check().await?;
        }
        for home in &world.homes {
            home.fake.kill().await;
        }
        Ok(())
    })
}

fn cases() -> u32 {
    std::env::var("RETHREAD_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn invariants_hold_over_random_histories(
        ops in proptest::collection::vec(op(), 1..14),
        mirror in any::<bool>(),
    ) {
        run_case(ops, mirror)?;
    }
}

/// A fixed history that touches every operation, so a regression shows without shrinking.
#[test]
fn a_history_through_every_operation() {
    use Op::*;
    let history = vec![
        Turn(1),
        RebuildAgent,
        Turn(2),
        Restart,
        Turn(3),
        Overloaded(1),
        Turn(4),
        Contended,
        Turn(5),
        SwitchProfile(Profile::ReleaseN),
        Turn(6),
        Damage(Corruption::TornTail),
        Turn(7),
        Damage(Corruption::Delete),
        Turn(8),
        Kill,
        Turn(9),
        SwitchHome,
        Turn(10),
        Retire,
        Turn(11),
        Overloaded(4),
        Turn(12),
        SwitchProfile(Profile::Current),
        Turn(13),
    ];
    for mirror in [false, true] {
        run_case(history.clone(), mirror).unwrap();
    }
}
