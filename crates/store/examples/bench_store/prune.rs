//! What a prune of idle sessions costs: the time `prune_sessions` takes to remove N idle
//! sessions (each one turn of two rows and a 2 KB mirror), and the p99 latency of one
//! session's commits while it runs beside their p99 alone, and the longest of them. The store runs on a manual clock,
//! moved past the idle span instead of waiting.

use std::time::{Duration, Instant};

use rethread_store::{BindingStore, Clock, MirrorAppend, MirrorUpdate, Prune, TurnCommit};
use serde_json::json;

/// One backend's figures.
pub(crate) struct Figures {
    pub(crate) name: String,
    pub(crate) sessions: usize,
    pub(crate) prune: Duration,
    pub(crate) p99_alone: Duration,
    pub(crate) p99_during: Duration,
    /// The longest commit during the prune (one that waited for a whole compaction, say).
    pub(crate) max_during: Duration,
    pub(crate) commits_during: usize,
}

fn idle_turn(i: usize) -> TurnCommit {
    let mut mirror = vec![b'x'; 2047];
    mirror.push(b'\n');
    let path = format!("sessions/2026/12/01/rollout-2026-12-01T10-00-00-{i}.jsonl");
    let update = MirrorUpdate::new(vec![MirrorAppend::whole(path, mirror)]);
    let rows = vec![
        json!({"role": "user", "text": "hello"}),
        json!({"role": "assistant", "text": "hi"}),
    ];
    TurnCommit::new(format!("idle-{i:06}"), format!("t-{i}"), rows).mirror(Some(update))
}

fn live_turn(n: usize) -> TurnCommit {
    let rows = vec![
        json!({"role": "user", "n": n}),
        json!({"role": "assistant", "n": n}),
    ];
    TurnCommit::new("live", "t-live", rows)
}

fn p99(mut latencies: Vec<Duration>) -> Duration {
    latencies.sort();
    latencies
        .get(((latencies.len() as f64 - 1.0) * 0.99).round() as usize)
        .copied()
        .unwrap_or_default()
}

/// Fills `store` (opened on `clock`) with `sessions` idle sessions, then measures.
pub(crate) async fn measure(
    name: &str,
    store: BindingStore,
    clock: &Clock,
    sessions: usize,
) -> Figures {
    let writers = 64;
    let fill: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in (w..sessions).step_by(writers) {
                    store.commit_turn(idle_turn(i)).await.unwrap();
                }
            })
        })
        .collect();
    for task in fill {
        task.await.unwrap();
    }
    clock.advance(Duration::from_secs(2 * 3600));
    let mut alone = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        let t = Instant::now();
        store.commit_turn(live_turn(alone.len())).await.unwrap();
        alone.push(t.elapsed());
    }
    let pruning = {
        let store = store.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let report = store
                .prune_sessions(Prune::idle(Duration::from_secs(3600)))
                .await
                .unwrap();
            (start.elapsed(), report.sessions.len())
        })
    };
    let mut during = Vec::new();
    while !pruning.is_finished() {
        let t = Instant::now();
        store.commit_turn(live_turn(during.len())).await.unwrap();
        during.push(t.elapsed());
    }
    let (prune, removed) = pruning.await.unwrap();
    assert_eq!(removed, sessions, "{name}: every idle session pruned");
    Figures {
        name: name.to_string(),
        sessions,
        prune,
        p99_alone: p99(alone),
        commits_during: during.len(),
        max_during: during.iter().max().copied().unwrap_or_default(),
        p99_during: p99(during),
    }
}
