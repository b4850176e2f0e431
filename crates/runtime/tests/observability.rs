//! What an operator sees: the spans (with session id, thread id and outcome) and the metrics
//! the runtime records, for a start, a resume, a fallback, a busy session and their turns and
//! commits, against the in-process fake. A recording `tracing` layer and `metrics-util`'s
//! debugging recorder are installed for this thread only, with a single-threaded runtime, so
//! tests running in parallel do not see each other's.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use rethread_runtime::telemetry::{self, *};
use rethread_runtime::{BinderOptions, OpenOutcome, RuntimeError, SessionBinder, StatusRail};
use rethread_store::{BindingStore, TurnCommit};
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// A closed span: its name and every field recorded on it.
#[derive(Debug, Clone)]
struct ClosedSpan {
    name: String,
    fields: BTreeMap<String, String>,
}

/// A layer that keeps each span's fields and records the span when it closes.
#[derive(Clone, Default)]
struct Spans {
    open: Arc<Mutex<BTreeMap<u64, ClosedSpan>>>,
    closed: Arc<Mutex<Vec<ClosedSpan>>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut span = ClosedSpan {
            name: attrs.metadata().name().to_string(),
            fields: BTreeMap::new(),
        };
        attrs.record(&mut Fields(&mut span.fields));
        self.open.lock().unwrap().insert(id.into_u64(), span);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(span) = self.open.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut span.fields));
        }
    }
    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some(span) = self.open.lock().unwrap().remove(&id.into_u64()) {
            self.closed.lock().unwrap().push(span);
        }
    }
}

impl Spans {
    fn named(&self, name: &str) -> Vec<ClosedSpan> {
        self.closed
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }
}

fn options() -> BinderOptions {
    BinderOptions::default()
        .codex_home(Some("/home/codex".into()))
        .retry_backoff(Duration::from_millis(1))
}

/// The metrics as `name{label=value,...}` -> value.
fn metrics_of(recorder: &DebuggingRecorder) -> BTreeMap<String, DebugValue> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            (format!("{}{{{}}}", key.name(), labels.join(",")), value)
        })
        .collect()
}

fn count(metrics: &BTreeMap<String, DebugValue>, key: &str) -> u64 {
    match metrics.get(key) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{key}: {other:?} in {:?}", metrics.keys()),
    }
}

fn samples(metrics: &BTreeMap<String, DebugValue>, key: &str) -> usize {
    match metrics.get(key) {
        Some(DebugValue::Histogram(values)) => values.len(),
        other => panic!("{key}: {other:?} in {:?}", metrics.keys()),
    }
}

#[test]
fn spans_and_metrics_cover_open_resume_fallback_turn_commit_and_leases() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let recorder = DebuggingRecorder::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let threads = tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, || runtime.block_on(scenario()))
    });
    let (started, lost, replacement) = threads;

    // Spans: every open, resume, fallback, turn and commit names its session, thread and
    // outcome.
    let opens = spans.named(SPAN_OPEN);
    let described: Vec<(&str, &str, &str)> = opens
        .iter()
        .map(|s| {
            (
                s.fields["session_id"].as_str(),
                s.fields["outcome"].as_str(),
                s.fields["reason"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        described,
        [
            ("fresh", "started", "none"),
            ("fresh", "resumed", "none"),
            ("lost", "fell_back", "gone"),
            ("fresh", "failed", "session_busy"),
        ]
    );
    assert_eq!(opens[0].fields["thread_id"], started);
    assert_eq!(opens[1].fields["thread_id"], started);
    assert_eq!(opens[2].fields["thread_id"], replacement);
    assert!(!opens[3].fields.contains_key("thread_id"), "{:?}", opens[3]);

    let resumes = spans.named(SPAN_RESUME);
    assert_eq!(resumes.len(), 2, "{resumes:?}");
    assert_eq!(
        (
            resumes[0].fields["thread_id"].as_str(),
            resumes[0].fields["outcome"].as_str()
        ),
        (started.as_str(), "resumed")
    );
    assert_eq!(
        (
            resumes[1].fields["thread_id"].as_str(),
            resumes[1].fields["outcome"].as_str()
        ),
        (lost.as_str(), "lost")
    );

    let fallbacks = spans.named(SPAN_FALLBACK);
    assert_eq!(fallbacks.len(), 1);
    let fallback = &fallbacks[0].fields;
    assert_eq!(fallback["session_id"], "lost");
    assert_eq!(fallback["previous_thread_id"], lost);
    assert_eq!(fallback["thread_id"], replacement);
    assert_eq!(fallback["reason"], "gone");
    assert_eq!(fallback["outcome"], "started");

    let turns = spans.named(SPAN_TURN);
    assert_eq!(turns.len(), 3, "{turns:?}");
    for turn in &turns {
        assert_eq!(turn.fields["outcome"], "completed", "{turn:?}");
        assert!(!turn.fields["turn_id"].is_empty());
    }
    assert_eq!(
        turns
            .iter()
            .map(|t| (
                t.fields["session_id"].as_str(),
                t.fields["thread_id"].as_str()
            ))
            .collect::<Vec<_>>(),
        [
            ("fresh", started.as_str()),
            ("fresh", started.as_str()),
            ("lost", replacement.as_str())
        ]
    );
    let commits = spans.named(SPAN_COMMIT);
    assert_eq!(commits.len(), 3);
    for commit in &commits {
        assert_eq!(commit.fields["outcome"], "published");
        assert_eq!(commit.fields["rows"], "2");
    }
    assert_eq!(commits[2].fields["thread_id"], replacement);
    let leases: Vec<String> = spans
        .named(SPAN_LEASE)
        .iter()
        .map(|s| s.fields["outcome"].clone())
        .collect();
    assert_eq!(leases, ["acquired", "acquired", "acquired", "busy"]);

    // Metrics: by outcome and reason, never by id.
    let metrics = metrics_of(&recorder);
    assert_eq!(
        count(
            &metrics,
            "rethread_opens_total{outcome=started,reason=none}"
        ),
        1
    );
    assert_eq!(
        count(
            &metrics,
            "rethread_opens_total{outcome=resumed,reason=none}"
        ),
        1
    );
    assert_eq!(
        count(
            &metrics,
            "rethread_opens_total{outcome=fell_back,reason=gone}"
        ),
        1
    );
    assert_eq!(
        count(
            &metrics,
            "rethread_opens_total{outcome=failed,reason=session_busy}"
        ),
        1
    );
    assert_eq!(count(&metrics, "rethread_fallbacks_total{reason=gone}"), 1);
    assert_eq!(
        samples(&metrics, "rethread_resume_seconds{outcome=resumed}"),
        1
    );
    assert_eq!(
        samples(&metrics, "rethread_resume_seconds{outcome=lost}"),
        1
    );
    assert_eq!(
        samples(&metrics, "rethread_commit_seconds{outcome=published}"),
        3
    );
    assert_eq!(
        samples(&metrics, "rethread_lease_wait_seconds{outcome=acquired}"),
        3
    );
    assert_eq!(
        samples(&metrics, "rethread_lease_wait_seconds{outcome=busy}"),
        1
    );
    assert_eq!(
        count(&metrics, "rethread_turns_total{outcome=completed}"),
        3
    );
    assert_eq!(
        samples(&metrics, "rethread_turn_seconds{outcome=completed}"),
        3
    );
    assert!(
        metrics
            .keys()
            .all(|k| !k.contains(&started) && !k.contains("fresh")),
        "{:?}",
        metrics.keys()
    );
}

/// A start, a resume (a second binder of the same session), a fallback (a binding to a thread
/// codex never had) and a session busy under another binder. Returns the started thread, the
/// lost one and its replacement.
async fn scenario() -> (String, String, String) {
    let home = tempfile::tempdir().unwrap();
    let (stream, _fake) = rethread_fake_appserver::FakeAppServer::builder()
        .codex_home(home.path())
        .spawn_in_process()
        .unwrap();
    let client = support::client_on(stream).await;
    let store = BindingStore::memory();
    let lost = "019a0000-0000-7000-8000-000000000001".to_string();
    store
        .commit_turn(TurnCommit::new(
            "lost",
            lost.clone(),
            vec![json!({"role": "user", "text": "earlier"})],
        ))
        .await
        .unwrap();

    let mut first =
        SessionBinder::new("fresh", store.clone(), StatusRail::default()).with_options(options());
    let mut session = first.open(&client).await.unwrap();
    let started = session.thread_id().to_string();
    session.run_turn("one").await.unwrap();
    drop(session);
    first.close().await.unwrap();

    let mut second =
        SessionBinder::new("fresh", store.clone(), StatusRail::default()).with_options(options());
    let mut session = second.open(&client).await.unwrap();
    assert!(matches!(session.outcome(), OpenOutcome::Resumed { .. }));
    session.run_turn("two").await.unwrap();

    let mut third =
        SessionBinder::new("lost", store.clone(), StatusRail::default()).with_options(options());
    let mut replaced = third.open(&client).await.unwrap();
    assert!(matches!(replaced.outcome(), OpenOutcome::FellBack { .. }));
    let replacement = replaced.thread_id().to_string();
    replaced.run_turn("three").await.unwrap();

    // `second` still holds "fresh".
    let mut busy =
        SessionBinder::new("fresh", store.clone(), StatusRail::default()).with_options(options());
    assert!(matches!(
        busy.open(&client).await,
        Err(RuntimeError::SessionBusy { .. })
    ));
    drop(session);
    second.close().await.unwrap();
    (started, lost, replacement)
}

#[test]
fn every_metric_is_described_with_its_unit() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, telemetry::describe_metrics);
    // Describing alone registers no values; recording one shows its unit.
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!(OPENS_TOTAL, "outcome" => "started", "reason" => "none").increment(1);
        metrics::histogram!(COMMIT_SECONDS, "outcome" => "published").record(0.5);
    });
    let described: BTreeMap<String, Option<metrics::Unit>> = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, description, _)| {
            assert!(description.is_some(), "{key:?} has no description");
            (key.key().name().to_string(), unit)
        })
        .collect();
    assert_eq!(described[OPENS_TOTAL], Some(metrics::Unit::Count));
    assert_eq!(described[COMMIT_SECONDS], Some(metrics::Unit::Seconds));
}
