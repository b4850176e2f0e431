//! Every fault of the script, in-process, plus the handle's storage edits.

use std::time::Duration;

use rethread_fake_appserver::{Corruption, FakeAppServer, FakeHandle, Fault, FaultScript, Profile};
use rethread_testkit::real::{error_of, thread_id, WirePeer};
use rethread_testkit::responses::Reply;
use serde_json::{json, Value};
use tokio::io::{DuplexStream, ReadHalf, WriteHalf};

type Peer = WirePeer<ReadHalf<DuplexStream>, WriteHalf<DuplexStream>>;

fn peer(stream: DuplexStream) -> Peer {
    let (read, write) = tokio::io::split(stream);
    let mut peer = WirePeer::new(read, write);
    peer.timeout = Duration::from_secs(5);
    peer
}

async fn fake(faults: FaultScript) -> (Peer, FakeHandle) {
    let (stream, handle) = FakeAppServer::builder()
        .faults(faults)
        .spawn_in_process()
        .unwrap();
    let mut peer = peer(stream);
    peer.initialize(true).await.unwrap();
    (peer, handle)
}

async fn start(peer: &mut Peer) -> String {
    let started = peer.start_thread().await.unwrap();
    thread_id(&started)
}

async fn restart(handle: &FakeHandle) -> Peer {
    let mut peer = peer(handle.restart().await.unwrap());
    peer.initialize(true).await.unwrap();
    peer
}

fn code(response: &Value) -> Option<i64> {
    error_of(response).map(|(code, _)| code)
}

#[tokio::test]
async fn fail_resume_for_listed_ids() {
    let (mut p, handle) = fake(FaultScript::none()).await;
    let id = start(&mut p).await;
    p.run_turn(&id, "hi", None).await.unwrap();
    handle.set_faults(FaultScript::of([Fault::FailResume {
        thread_ids: vec![id.clone()],
        code: -32603,
        message: Some("boom <id>".into()),
    }]));
    let mut p = restart(&handle).await;
    let resumed = p
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert_eq!(error_of(&resumed), Some((-32603, format!("boom {id}"))));
}

#[tokio::test]
async fn exit_at_request_ends_the_stream_unanswered_and_fires_once() {
    let (mut p, handle) = fake(FaultScript::of([Fault::ExitAtRequest { n: 2 }])).await;
    let err = p.request("thread/list", Some(json!({}))).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    for _ in 0..100 {
        if !handle.is_running() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!handle.is_running());
    // The counter survives the restart: request 2 is gone, so the fault does not fire again.
    let mut p = restart(&handle).await;
    let listed = p.request("thread/list", Some(json!({}))).await.unwrap();
    assert!(listed.get("result").is_some());
}

#[tokio::test]
async fn exit_mid_turn_leaves_a_rollout_without_the_turn() {
    let (mut p, handle) = fake(FaultScript::of([Fault::ExitMidTurn { turn: 2 }])).await;
    let id = start(&mut p).await;
    p.run_turn(&id, "first", None).await.unwrap();
    let err = p.run_turn(&id, "second", None).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    let mut p = restart(&handle).await;
    let resumed = p
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert_eq!(
        resumed["result"]["thread"]["turns"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // The model never saw the second turn.
    assert_eq!(handle.model_requests().len(), 1);
}

#[tokio::test]
async fn exit_in_the_first_turn_leaves_an_empty_thread() {
    let (mut p, handle) = fake(FaultScript::of([Fault::ExitMidTurn { turn: 1 }])).await;
    let id = start(&mut p).await;
    assert!(p.run_turn(&id, "first", None).await.is_err());
    let mut p = restart(&handle).await;
    let resumed = p
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert_eq!(resumed["result"]["thread"]["turns"], json!([]));
}

#[tokio::test]
async fn corrupted_rollouts_fail_like_codex() {
    for (corruption, expected) in [
        (Corruption::Empty, Some(-32603)),
        (Corruption::Garbage, Some(-32603)),
        (Corruption::TornTail, None),
        (Corruption::Delete, Some(-32600)),
    ] {
        let script = FaultScript::of([Fault::CorruptRollout {
            after_turn: 1,
            corruption,
        }]);
        let (mut p, handle) = fake(script).await;
        let id = start(&mut p).await;
        p.run_turn(&id, "hi", None).await.unwrap();
        let mut p = restart(&handle).await;
        let resumed = p
            .request("thread/resume", Some(json!({"threadId": id})))
            .await
            .unwrap();
        assert_eq!(code(&resumed), expected, "{corruption:?}: {resumed}");
        if expected.is_none() {
            assert_eq!(
                resumed["result"]["thread"]["turns"]
                    .as_array()
                    .unwrap()
                    .len(),
                1
            );
        }
    }
}

#[tokio::test]
async fn unknown_history_mode_in_storage_is_never_legacy() {
    let (mut p, handle) = fake(FaultScript::none()).await;
    let id = start(&mut p).await;
    p.run_turn(&id, "hi", None).await.unwrap();
    handle.set_rollout_history_mode(&id, "segmented").unwrap();
    let mut p = restart(&handle).await;
    let listed = p.request("thread/list", Some(json!({}))).await.unwrap();
    assert_eq!(listed["result"]["data"], json!([]));
    for method in ["thread/read", "thread/resume"] {
        let response = p
            .request(method, Some(json!({"threadId": id})))
            .await
            .unwrap();
        let (code, message) = error_of(&response).unwrap();
        assert_eq!(code, -32603);
        assert!(message.contains("unknown variant `segmented`"), "{message}");
    }
    // The index alone saying so is corrected from the rollout, as codex does.
    handle.set_rollout_history_mode(&id, "paginated").unwrap();
    handle.set_indexed_history_mode(&id, "segmented").unwrap();
    let listed = p.request("thread/list", Some(json!({}))).await.unwrap();
    assert_eq!(listed["result"]["data"][0]["historyMode"], "paginated");
}

#[tokio::test]
async fn handle_corrupts_rollouts_directly() {
    let (mut p, handle) = fake(FaultScript::none()).await;
    let id = start(&mut p).await;
    assert!(
        handle.rollout_path(&id).is_none(),
        "no rollout before the first turn"
    );
    p.run_turn(&id, "hi", None).await.unwrap();
    let path = handle.rollout_path(&id).unwrap();
    assert!(path.starts_with(handle.codex_home().join("sessions")));
    let first: Value = serde_json::from_str(
        std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["type"], "session_meta");
    assert_eq!(first["payload"]["history_mode"], "paginated");
    handle.corrupt_rollout(&id, Corruption::Empty).unwrap();
    let mut p = restart(&handle).await;
    let resumed = p
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert_eq!(code(&resumed), Some(-32603));
}

#[tokio::test]
async fn overloaded_for_n_attempts_then_served() {
    let script = FaultScript::of([Fault::Overloaded {
        method: Some("thread/list".into()),
        attempts: 2,
    }]);
    let (mut p, _handle) = fake(script).await;
    for _ in 0..2 {
        let r = p.request("thread/list", Some(json!({}))).await.unwrap();
        assert_eq!(
            error_of(&r),
            Some((-32001, "Server overloaded; retry later.".into()))
        );
    }
    assert!(p
        .request("thread/list", Some(json!({})))
        .await
        .unwrap()
        .get("result")
        .is_some());
}

#[tokio::test]
async fn garbage_oversized_and_wrong_id_lines() {
    let script = FaultScript::of([
        Fault::GarbageLine { at_request: 2 },
        Fault::OversizedLine {
            at_request: 3,
            bytes: 2 << 20,
        },
        Fault::WrongId { at_request: 4 },
    ]);
    let (mut p, _handle) = fake(script).await;
    p.request("thread/list", Some(json!({}))).await.unwrap();
    assert!(p
        .log
        .iter()
        .any(|m| m.as_str() == Some("this line is not json {")));
    p.request("thread/list", Some(json!({}))).await.unwrap();
    assert!(p.log.iter().any(|m| m.to_string().len() > 2 << 20));
    p.send(&json!({"id": 77, "method": "thread/list", "params": {}}))
        .await
        .unwrap();
    let answer = loop {
        let next = p.next_message().await.unwrap().unwrap();
        if next.get("id").is_some() {
            break next;
        }
    };
    assert_eq!(answer["id"], 1077);
}

#[tokio::test]
async fn delays_and_notifications_for_other_threads() {
    let script = FaultScript::of([
        Fault::Delay {
            method: Some("thread/list".into()),
            millis: 50,
        },
        Fault::ForeignNotifications { turn: 1 },
    ]);
    let (mut p, _handle) = fake(script).await;
    let started = tokio::time::Instant::now();
    p.request("thread/list", Some(json!({}))).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(50));
    let id = start(&mut p).await;
    let run = p.run_turn(&id, "hi", None).await.unwrap();
    // A foreign `turn/completed` arrived first; `run_turn` stops at the first one it sees, so
    // it is the foreign thread's.
    assert_ne!(run.completed.unwrap()["params"]["threadId"], json!(id));
}

// On a paused clock: see the wait below.
#[tokio::test(start_paused = true)]
async fn approval_request_mid_turn_waits_for_the_answer() {
    let (mut p, handle) = fake(FaultScript::of([Fault::Approval { turn: 1 }])).await;
    let id = start(&mut p).await;
    let response = p
        .request(
            "turn/start",
            Some(json!({"threadId": id, "input": [{"type": "text", "text": "run it"}]})),
        )
        .await
        .unwrap();
    assert!(response.get("result").is_some());
    let seen = p
        .wait_for("item/commandExecution/requestApproval")
        .await
        .unwrap();
    let request = seen.last().unwrap().clone();
    assert_eq!(request["params"]["threadId"], json!(id));
    // The turn waits: no model request until the answer. Tokio moves a paused clock on, and
    // so ends this sleep, only once every task waits: the fake's turn has gone as far as it
    // can without the answer.
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(handle.model_requests().is_empty());
    p.send(&json!({"id": request["id"], "result": {"decision": "accept"}}))
        .await
        .unwrap();
    let rest = p.wait_for("turn/completed").await.unwrap();
    assert_eq!(
        rest.last().unwrap()["params"]["turn"]["status"],
        "completed"
    );
    assert_eq!(handle.model_requests().len(), 1);
}

#[tokio::test]
async fn interrupt_a_slow_turn() {
    let (mut p, handle) = fake(FaultScript::of([Fault::SlowTurn { millis: 10_000 }])).await;
    let id = start(&mut p).await;
    let response = p
        .request(
            "turn/start",
            Some(json!({"threadId": id, "input": [{"type": "text", "text": "slow"}]})),
        )
        .await
        .unwrap();
    let turn_id = response["result"]["turn"]["id"].clone();
    p.wait_for("turn/started").await.unwrap();
    let interrupted = p
        .request(
            "turn/interrupt",
            Some(json!({"threadId": id, "turnId": turn_id})),
        )
        .await
        .unwrap();
    assert_eq!(interrupted["result"], json!({}));
    let rest = p.wait_for("turn/completed").await.unwrap();
    assert_eq!(
        rest.last().unwrap()["params"]["turn"]["status"],
        "interrupted"
    );
    assert!(handle.model_requests().is_empty());
}

#[tokio::test]
async fn scripted_replies_and_request_log() {
    let (stream, handle) = FakeAppServer::builder()
        .profile(Profile::ReleaseN)
        .reply(Reply::Script(["one".to_string(), "two".to_string()].into()))
        .spawn_in_process()
        .unwrap();
    let mut p = peer(stream);
    p.initialize(false).await.unwrap();
    let id = start(&mut p).await;
    assert_eq!(
        p.run_turn(&id, "a", None).await.unwrap().agent_text(),
        ["one"]
    );
    assert_eq!(
        p.run_turn(&id, "b", None).await.unwrap().agent_text(),
        ["two"]
    );
    assert_eq!(
        p.run_turn(&id, "c", None).await.unwrap().agent_text(),
        ["echo: c"]
    );
    assert_eq!(
        handle.methods(),
        [
            "initialize",
            "thread/start",
            "turn/start",
            "turn/start",
            "turn/start"
        ]
    );
    let last = handle.model_requests().pop().unwrap();
    let texts: Vec<&str> = last.conversation.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["a", "one", "b", "two", "c"]);
}

#[tokio::test]
async fn profile_change_on_restart_is_a_downgrade() {
    let (mut p, handle) = fake(FaultScript::none()).await;
    let id = start(&mut p).await;
    p.run_turn(&id, "paged", None).await.unwrap();
    handle.set_profile(Profile::ReleaseN);
    let mut p = restart(&handle).await;
    let resumed = p
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert_eq!(
        error_of(&resumed),
        Some((-32601, "paginated_threads is not supported yet".into()))
    );
}

#[tokio::test]
async fn two_fakes_on_one_home_share_the_writer_lock() {
    let home = tempfile::tempdir().unwrap();
    let (a, first) = FakeAppServer::builder()
        .codex_home(home.path())
        .spawn_in_process()
        .unwrap();
    let mut a = peer(a);
    a.initialize(false).await.unwrap();
    let id = start(&mut a).await;
    a.run_turn(&id, "mine", None).await.unwrap();
    let (b, _second) = FakeAppServer::builder()
        .codex_home(home.path())
        .spawn_in_process()
        .unwrap();
    let mut b = peer(b);
    b.initialize(false).await.unwrap();
    let busy = b
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert_eq!(
        error_of(&busy),
        Some((-32600, format!("thread {id} already has an active writer")))
    );
    first.kill().await;
    let resumed = b
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert!(resumed.get("result").is_some(), "{resumed}");
}

/// The event log says how far a turn got: what `cargo xtask restarts` reads after a kill.
#[tokio::test]
async fn the_event_log_records_requests_and_finished_turns_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("events.log");
    let (stream, _handle) = FakeAppServer::builder()
        .event_log(&log)
        .spawn_in_process()
        .unwrap();
    let mut p = peer(stream);
    p.initialize(true).await.unwrap();
    let id = start(&mut p).await;
    p.run_turn(&id, "hi", None).await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let events: Vec<&str> = text
        .lines()
        .map(|line| line.split_once(' ').unwrap().1)
        .collect();
    let done = format!("turn-done {id}");
    assert_eq!(
        events,
        [
            "request initialize",
            "request thread/start",
            "request turn/start",
            done.as_str()
        ]
    );
    for line in text.lines() {
        let ms: u64 = line.split_once(' ').unwrap().0.parse().unwrap();
        assert!(ms > 1_700_000_000_000, "{line}");
    }
}
