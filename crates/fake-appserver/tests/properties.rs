//! Property test: random operation sequences against the in-process fake and a plain reference
//! model of codex's thread store, compared after every step.

use std::time::Duration;

use proptest::prelude::*;
use rethread_fake_appserver::{Corruption, FakeAppServer, FakeHandle, Profile};
use rethread_testkit::real::{error_of, thread_id, WirePeer};
use rethread_testkit::strategies::{ops, profile, Op};
use serde_json::{json, Value};
use tokio::io::{DuplexStream, ReadHalf, WriteHalf};

type Peer = WirePeer<ReadHalf<DuplexStream>, WriteHalf<DuplexStream>>;

#[derive(Debug, Clone)]
struct ModelThread {
    id: String,
    turns: Vec<String>,
    loaded: bool,
    materialized: bool,
    damage: Option<Corruption>,
}

impl ModelThread {
    fn readable(&self) -> bool {
        self.materialized && matches!(self.damage, None | Some(Corruption::TornTail))
    }
}

async fn connect(handle: &FakeHandle, stream: DuplexStream) -> Peer {
    let _ = handle;
    let (read, write) = tokio::io::split(stream);
    let mut peer = WirePeer::new(read, write);
    peer.timeout = Duration::from_secs(5);
    peer.initialize(true).await.unwrap();
    peer
}

fn turns_of(response: &Value) -> usize {
    response["result"]["thread"]["turns"]
        .as_array()
        .map_or(0, Vec::len)
}

async fn run(profile: Profile, steps: Vec<Op>) -> Result<(), TestCaseError> {
    let (stream, handle) = FakeAppServer::builder()
        .profile(profile)
        .spawn_in_process()
        .unwrap();
    let mut peer = connect(&handle, stream).await;
    let mut threads: Vec<ModelThread> = Vec::new();
    for step in steps {
        match step {
            Op::Start => {
                let r = peer.start_thread().await.unwrap();
                let id = thread_id(&r);
                threads.push(ModelThread {
                    id,
                    turns: vec![],
                    loaded: true,
                    materialized: false,
                    damage: None,
                });
            }
            Op::Turn { thread, word } => {
                let Some(i) = thread.resolve(threads.len()) else {
                    continue;
                };
                let text = format!("word{word}");
                let run = peer.run_turn(&threads[i].id, &text, None).await.unwrap();
                if !threads[i].loaded {
                    prop_assert_eq!(error_of(&run.response).map(|e| e.0), Some(-32600));
                    continue;
                }
                let status = run.status();
                prop_assert_eq!(status.as_deref(), Some("completed"));
                let seen: Vec<String> = handle
                    .model_requests()
                    .last()
                    .unwrap()
                    .conversation
                    .iter()
                    .filter(|m| m.role == "user")
                    .map(|m| m.text.clone())
                    .collect();
                let mut expected = threads[i].turns.clone();
                expected.push(text.clone());
                prop_assert_eq!(seen, expected, "the model must see the whole thread");
                threads[i].turns.push(text);
                threads[i].materialized = true;
            }
            Op::Resume {
                thread,
                exclude_turns,
            } => {
                let Some(i) = thread.resolve(threads.len()) else {
                    continue;
                };
                let t = &mut threads[i];
                let r = peer
                    .request(
                        "thread/resume",
                        Some(json!({"threadId": t.id, "excludeTurns": exclude_turns})),
                    )
                    .await
                    .unwrap();
                let code = error_of(&r).map(|e| e.0);
                let expected = if !t.materialized {
                    Some(-32600)
                } else if t.loaded {
                    None
                } else {
                    match t.damage {
                        None | Some(Corruption::TornTail) => None,
                        Some(Corruption::Empty | Corruption::Garbage) => Some(-32603),
                        Some(Corruption::Delete) => Some(-32600),
                    }
                };
                prop_assert_eq!(code, expected, "resume {:?}: {}", t, r);
                if code.is_none() {
                    t.loaded = true;
                    let want = if exclude_turns { 0 } else { t.turns.len() };
                    prop_assert_eq!(turns_of(&r), want);
                }
            }
            Op::Read {
                thread,
                include_turns,
            } => {
                let Some(i) = thread.resolve(threads.len()) else {
                    continue;
                };
                let t = &threads[i];
                let r = peer
                    .request(
                        "thread/read",
                        Some(json!({"threadId": t.id, "includeTurns": include_turns})),
                    )
                    .await
                    .unwrap();
                if t.loaded && t.materialized {
                    prop_assert!(r.get("result").is_some(), "read {:?}: {}", t, r);
                    if include_turns {
                        prop_assert_eq!(turns_of(&r), t.turns.len());
                    }
                }
            }
            Op::List => {
                let r = peer.request("thread/list", Some(json!({}))).await.unwrap();
                let mut listed: Vec<String> = r["result"]["data"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["id"].as_str().unwrap().to_string())
                    .collect();
                listed.sort();
                let mut expected: Vec<String> = threads
                    .iter()
                    .filter(|t| t.readable())
                    .map(|t| t.id.clone())
                    .collect();
                expected.sort();
                prop_assert_eq!(listed, expected);
            }
            Op::Restart | Op::RestartCorrupting { .. } => {
                handle.kill().await;
                for t in &mut threads {
                    t.loaded = false;
                }
                if let Op::RestartCorrupting { thread, corruption } = step {
                    if let Some(i) = thread.resolve(threads.len()) {
                        let t = &mut threads[i];
                        let fatal = matches!(
                            t.damage,
                            Some(Corruption::Empty | Corruption::Garbage | Corruption::Delete)
                        );
                        if t.materialized && !fatal {
                            handle.corrupt_rollout(&t.id, corruption).unwrap();
                            t.damage = Some(corruption);
                        }
                    }
                }
                let stream = handle.restart().await.unwrap();
                peer = connect(&handle, stream).await;
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn fake_matches_the_reference_model(profile in profile(), steps in ops(14)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(run(profile, steps))?;
    }
}
