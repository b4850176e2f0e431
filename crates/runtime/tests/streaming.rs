//! Streamed turns: `run_turn_streamed` yields a turn's events while it runs, several subscribers
//! watch one thread without taking from each other or from the runtime, and the commit is the
//! one `run_turn` makes. Against a scripted peer (exact order, a server that holds
//! `turn/completed` back until the events were seen), the in-process fake, and every supported
//! real codex release (offline, the model played by the Responses stand-in).

mod support;

use std::time::Duration;

use rethread_protocol::messages::ServerNotification;
use rethread_runtime::{
    AppServerClient, BinderOptions, ClientError, ClientOptions, CodexCommand, Publication,
    SessionBinder, StatusRail, ThreadEvent, ThreadEvents, TurnEvent, TurnInput,
};
use rethread_store::BindingStore;
use rethread_testkit::real::{ask_for_approvals, codex_or_skip, CodexHome};
use rethread_testkit::responses::{Reply, ResponsesStandIn};
use rethread_testkit::supported_releases;
use serde_json::{json, Value};
use tokio::sync::oneshot;

fn options() -> BinderOptions {
    BinderOptions::default()
        .codex_home(Some("/home/codex".into()))
        .retry_backoff(Duration::from_millis(1))
}

/// A short name for each event, to assert orders.
fn name(event: &TurnEvent) -> String {
    match event {
        TurnEvent::AgentMessageDelta { delta, .. } => format!("delta:{delta}"),
        TurnEvent::ItemStarted(item) => format!("started:{}", item.kind().unwrap_or("?")),
        TurnEvent::ItemCompleted(item) => format!("completed:{}", item.kind().unwrap_or("?")),
        TurnEvent::ServerRequest(answered) => format!("request:{}", answered.request.method()),
        TurnEvent::TokenUsage(_) => "usage".into(),
        TurnEvent::Notification(ServerNotification::Other { method, .. }) => method.clone(),
        TurnEvent::Notification(other) => format!("{other:?}")
            .split('(')
            .next()
            .unwrap_or_default()
            .to_string(),
        TurnEvent::Completed(_) => "completed".into(),
        _ => "other".into(),
    }
}

fn position(names: &[String], wanted: &str) -> usize {
    names
        .iter()
        .position(|n| n == wanted)
        .unwrap_or_else(|| panic!("no {wanted} in {names:?}"))
}

/// Reads a subscription up to and including the notification that completes a turn.
async fn read_until_turn_completed(events: &mut ThreadEvents) -> Vec<ThreadEvent> {
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(60), events.next())
            .await
            .expect("the observer got the turn's end in time")
            .expect("the observer is not cut off");
        let done = matches!(
            event,
            ThreadEvent::Notification(ServerNotification::TurnCompleted(_))
        );
        seen.push(event);
        if done {
            return seen;
        }
    }
}

/// The scripted server holds `turn/completed` back until the test has seen the events before
/// it: they are streamed, not collected at the end. A second subscriber sees the same events,
/// the approval comes with its answer, another turn's stale notifications are left out, and
/// nothing is committed before the turn completed.
#[tokio::test]
async fn a_streamed_turn_yields_each_event_before_turn_completed_and_commits_after_it() {
    let store = BindingStore::memory();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let (release, held) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        peer.start_thread("t1").await;
        let (id, params) = peer.expect("turn/start").await;
        assert_eq!(
            params["input"],
            json!([{"type": "text", "text": "hi"}, {"type": "localImage", "path": "/tmp/dot.png"}])
        );
        let turn = json!({"id": "u1", "status": "inProgress", "items": []});
        peer.reply(id, json!({"turn": turn})).await;
        peer.notify("turn/started", json!({"threadId": "t1", "turn": turn}))
            .await;
        let started = json!({"type": "agentMessage", "id": "m1", "text": ""});
        peer.notify(
            "item/started",
            json!({"threadId": "t1", "turnId": "u1", "item": started}),
        )
        .await;
        for piece in ["hel", "lo"] {
            peer.notify(
                "item/agentMessage/delta",
                json!({"threadId": "t1", "turnId": "u1", "itemId": "m1", "delta": piece}),
            )
            .await;
        }
        peer.send_raw(r#"{"id":"a1","method":"item/commandExecution/requestApproval","params":{"threadId":"t1","turnId":"u1","itemId":"c1","startedAtMs":1}}"#).await;
        match peer.recv().await {
            rethread_protocol::Message::Response(r) => assert_eq!(r.id, "a1".into()),
            other => panic!("{other:?}"),
        }
        // A turn interrupted earlier on this thread still reporting: not this turn's.
        peer.notify(
            "item/completed",
            json!({"threadId": "t1", "turnId": "u0", "item": {"type": "agentMessage", "id": "old", "text": "stale"}}),
        )
        .await;
        let done = json!({"type": "agentMessage", "id": "m1", "text": "hello"});
        peer.notify(
            "item/completed",
            json!({"threadId": "t1", "turnId": "u1", "item": done}),
        )
        .await;
        let usage = json!({"totalTokens": 7, "inputTokens": 5, "cachedInputTokens": 0,
                           "outputTokens": 2, "reasoningOutputTokens": 0});
        peer.notify(
            "thread/tokenUsage/updated",
            json!({"threadId": "t1", "turnId": "u1", "tokenUsage": {"total": usage, "last": usage}}),
        )
        .await;
        held.await.unwrap();
        peer.notify(
            "turn/completed",
            json!({"threadId": "t1", "turn": {"id": "u1", "status": "completed", "items": []}}),
        )
        .await;
        peer
    });

    let mut binder =
        SessionBinder::new("s", store.clone(), StatusRail::recording().0).with_options(options());
    let mut session = binder.open(&client).await.unwrap();
    let mut observer = client.subscribe("t1").unwrap();
    let input = TurnInput::text("hi").with_local_image("/tmp/dot.png");
    let mut turn = session.run_turn_streamed(input).await.unwrap();
    assert_eq!((turn.thread_id(), turn.turn_id()), ("t1", "u1"));
    let mut names = Vec::new();
    while names.last().map(String::as_str) != Some("usage") {
        let event = turn.next().await.unwrap().unwrap();
        if let TurnEvent::ServerRequest(answered) = &event {
            assert_eq!(answered.answer, Ok(json!({"decision": "decline"})));
        }
        names.push(name(&event));
    }
    assert_eq!(
        names,
        [
            "TurnStarted",
            "started:agentMessage",
            "delta:hel",
            "delta:lo",
            "request:item/commandExecution/requestApproval",
            "completed:agentMessage",
            "usage",
        ]
    );
    // Everything above arrived while codex had not completed the turn: nothing is committed.
    assert!(store.session("s").await.unwrap().is_none());
    release.send(()).unwrap();
    let report = match turn.next().await.unwrap().unwrap() {
        TurnEvent::Completed(report) => report,
        other => panic!("{other:?}"),
    };
    assert!(turn.next().await.is_none(), "Completed is the last event");
    drop(turn);
    assert_eq!(report.reply, "hello");
    assert_eq!(report.publication, Publication::Published);
    assert_eq!(report.token_usage.unwrap().total.total_tokens, 7);
    assert_eq!(
        report.rows,
        [
            json!({"role": "user", "text": "hi", "thread_id": "t1", "turn_id": "u1",
                   "attachments": [{"type": "localImage", "path": "/tmp/dot.png"}]}),
            json!({"role": "assistant", "text": "hello", "thread_id": "t1", "turn_id": "u1"}),
        ]
    );
    let record = store.session("s").await.unwrap().unwrap();
    assert_eq!((record.thread_id(), record.row_count), (Some("t1"), 2));

    // The second subscriber saw the same turn, the stale notification and the approval too.
    let seen = read_until_turn_completed(&mut observer).await;
    let deltas: Vec<&str> = seen
        .iter()
        .filter_map(|e| match e {
            ThreadEvent::Notification(ServerNotification::AgentMessageDelta(d)) => {
                Some(d.delta.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(deltas, ["hel", "lo"]);
    assert!(seen
        .iter()
        .any(|e| matches!(e, ThreadEvent::ServerRequest(a) if a.id == "a1".into())));
    server.await.unwrap();
}

/// The runtime's own subscription is waited for, so a turn gets every event through a buffer
/// far smaller than the turn; a subscriber that reads nothing is cut off instead of stalling
/// it.
#[tokio::test]
async fn a_turn_loses_nothing_through_a_small_buffer_and_a_forgotten_subscriber_cannot_stall_it() {
    let options = ClientOptions::default().notification_buffer(4);
    let store = BindingStore::memory();
    let (client, mut peer, _) = support::connect(options).await;
    let server = tokio::spawn(async move {
        peer.start_thread("t1").await;
        let (id, _) = peer.expect("turn/start").await;
        let turn = json!({"id": "u1", "status": "inProgress", "items": []});
        peer.reply(id, json!({"turn": turn})).await;
        for i in 0..300 {
            peer.notify(
                "item/agentMessage/delta",
                json!({"threadId": "t1", "turnId": "u1", "itemId": "m1", "delta": format!("{i} ")}),
            )
            .await;
        }
        let text: String = (0..300).map(|i| format!("{i} ")).collect();
        peer.notify(
            "item/completed",
            json!({"threadId": "t1", "turnId": "u1", "item": {"type": "agentMessage", "id": "m1", "text": text}}),
        )
        .await;
        peer.notify(
            "turn/completed",
            json!({"threadId": "t1", "turn": {"id": "u1", "status": "completed", "items": []}}),
        )
        .await;
        peer
    });
    let mut binder = SessionBinder::new("s", store.clone(), StatusRail::recording().0)
        .with_options(self::options());
    let mut session = binder.open(&client).await.unwrap();
    let mut forgotten = client.subscribe("t1").unwrap();
    let mut turn = session.run_turn_streamed("count").await.unwrap();
    let mut streamed = String::new();
    let report = loop {
        match turn.next().await.unwrap().unwrap() {
            TurnEvent::AgentMessageDelta { delta, .. } => streamed.push_str(&delta),
            TurnEvent::Completed(report) => break report,
            _ => {}
        }
    };
    let text: String = (0..300).map(|i| format!("{i} ")).collect();
    assert_eq!(streamed, text, "every delta, in order");
    assert_eq!(report.reply, text);
    for i in 0..4 {
        assert!(matches!(
            forgotten.next().await.unwrap(),
            ThreadEvent::Notification(ServerNotification::AgentMessageDelta(d)) if d.delta == format!("{i} ")
        ));
    }
    assert!(matches!(
        forgotten.next().await,
        Err(ClientError::Lagged { buffer: 4, .. })
    ));
    server.await.unwrap();
}

/// Dropping a streamed turn before its end abandons it: `turn/interrupt` goes out and nothing
/// is committed.
#[tokio::test]
async fn an_abandoned_turn_is_interrupted_and_writes_nothing() {
    let store = BindingStore::memory();
    let (client, mut peer, _) = support::connect(ClientOptions::default()).await;
    let mut binder =
        SessionBinder::new("s", store.clone(), StatusRail::recording().0).with_options(options());
    let opening = tokio::spawn(async move {
        let mut session = binder.open(&client).await.unwrap();
        let turn = session.run_turn_streamed("hi").await.unwrap();
        drop(turn);
        (binder, session)
    });
    peer.start_thread("t1").await;
    peer.accept_turn("u1").await;
    let (_binder, _session) = opening.await.unwrap();
    let (_, params) = peer.expect("turn/interrupt").await;
    assert_eq!(params, json!({"threadId": "t1", "turnId": "u1"}));
    assert!(store.session("s").await.unwrap().is_none());
}

/// The in-process fake: a streamed turn and `run_turn` commit the same rows; the events come
/// before the end and a second subscriber sees them too.
#[tokio::test]
async fn on_the_fake_a_streamed_turn_commits_what_run_turn_commits() {
    let home = tempfile::tempdir().unwrap();
    let (stream, _fake) = rethread_fake_appserver::FakeAppServer::builder()
        .codex_home(home.path())
        .spawn_in_process()
        .unwrap();
    let client = support::client_on(stream).await;
    let store = BindingStore::memory();

    let mut streamed_binder = SessionBinder::new("streamed", store.clone(), StatusRail::default())
        .with_options(options());
    let mut session = streamed_binder.open(&client).await.unwrap();
    let mut observer = client.subscribe(session.thread_id()).unwrap();
    let mut turn = session.run_turn_streamed("hello").await.unwrap();
    let mut events = Vec::new();
    while let Some(event) = turn.next().await {
        events.push(event.unwrap());
    }
    let names: Vec<String> = events.iter().map(name).collect();
    let last = names.len() - 1;
    assert_eq!(position(&names, "completed"), last, "{names:?}");
    // The fake's model streams its answer in two pieces, as codex sends them: a delta each.
    assert!(position(&names, "started:agentMessage") < position(&names, "delta:echo:"));
    assert!(position(&names, "delta:echo:") < position(&names, "delta: hello"));
    assert!(position(&names, "delta: hello") < position(&names, "completed:agentMessage"));
    assert!(position(&names, "completed:agentMessage") < position(&names, "usage"));
    let Some(TurnEvent::Completed(streamed)) = events.pop() else {
        panic!("{names:?}")
    };
    drop(turn);
    let seen = read_until_turn_completed(&mut observer).await;
    let observed: String = seen
        .iter()
        .filter_map(|e| match e {
            ThreadEvent::Notification(ServerNotification::AgentMessageDelta(d)) => {
                Some(d.delta.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        observed, "echo: hello",
        "the other subscriber saw every delta"
    );

    let mut plain_binder =
        SessionBinder::new("plain", store.clone(), StatusRail::default()).with_options(options());
    let mut plain_session = plain_binder.open(&client).await.unwrap();
    let plain = plain_session.run_turn("hello").await.unwrap();
    let strip = |rows: &[Value]| {
        rows.iter()
            .map(|row| {
                let mut row = row.clone();
                row.as_object_mut().unwrap().remove("thread_id");
                row.as_object_mut().unwrap().remove("turn_id");
                row
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&streamed.rows), strip(&plain.rows));
    assert_eq!(streamed.reply, plain.reply);
    assert_eq!(streamed.publication, Publication::Published);
    assert_eq!(streamed.token_usage, plain.token_usage);
    assert!(streamed.token_usage.is_some());
    for (id, report) in [("streamed", &*streamed), ("plain", &plain)] {
        let record = store.session(id).await.unwrap().unwrap();
        assert_eq!(record.thread_id(), Some(report.thread_id.as_str()));
        assert_eq!(record.row_count, 2);
    }
}

/// A 1x1 PNG.
fn tiny_png() -> Vec<u8> {
    vec![
        0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44,
        0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x02, 0x00, 0x00, 0x00, 0x90,
        0x77, 0x53, 0xde, 0x00, 0x00, 0x00, 0x0c, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8,
        0xcf, 0xc0, 0x00, 0x00, 0x03, 0x01, 0x01, 0x00, 0xc9, 0xfe, 0x92, 0xef, 0x00, 0x00, 0x00,
        0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
    ]
}

/// Standard base64 with padding, to compare what the model received with the file.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn base64_matches_the_standard_vectors() {
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"f"), "Zg==");
    assert_eq!(base64(b"fo"), "Zm8=");
    assert_eq!(base64(b"foo"), "Zm9v");
    assert_eq!(base64(b"foobar"), "Zm9vYmFy");
}

/// The `input_image` parts of a model request body.
fn image_urls(body: &Value) -> Vec<String> {
    body["input"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
        .filter(|part| part["type"] == "input_image")
        .filter_map(|part| part["image_url"].as_str().map(str::to_string))
        .collect()
}

/// Every supported real codex: a streamed turn with an image file whose deltas, items and
/// token usage come before the end, watched by a second subscriber, committed like `run_turn`;
/// the model received the image's bytes; an approval comes as an event with its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_the_real_codex_a_streamed_turn_streams_and_commits() {
    for version in supported_releases() {
        streamed_turn_on_real_codex(&version).await;
    }
}

async fn streamed_turn_on_real_codex(version: &str) {
    let Some(codex) = codex_or_skip(version) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    model.set_stream_deltas(true);
    model.set_reply(Reply::Fixed("a single red dot".into()));
    let home = CodexHome::new(&model).unwrap();
    ask_for_approvals(home.path()).unwrap();
    let image = home.path().join("dot.png");
    std::fs::write(&image, tiny_png()).unwrap();
    let mut command = CodexCommand::new(&codex)
        .env("CODEX_HOME", home.path().display().to_string())
        .env("RUST_LOG", "error");
    command.cwd = Some(home.path().to_path_buf());
    let client = AppServerClient::spawn(&command).await.unwrap();
    let store = BindingStore::memory();
    let mut binder = SessionBinder::new("s", store.clone(), StatusRail::default())
        .with_options(options().codex_home(Some(home.path().display().to_string())));
    let mut session = binder.open(&client).await.unwrap();
    let thread = session.thread_id().to_string();
    let mut observer = client.subscribe(&thread).unwrap();

    let input = TurnInput::text("what is on this image?").with_local_image(&image);
    let mut turn = session.run_turn_streamed(input).await.unwrap();
    let mut events = Vec::new();
    while let Some(event) = turn.next().await {
        let event = event.unwrap_or_else(|e| panic!("{version}: {e}"));
        if events.is_empty() {
            // The turn's first event arrived: codex has not completed it, nothing is committed.
            assert!(store.session("s").await.unwrap().is_none(), "{version}");
        }
        events.push(event);
    }
    drop(turn);
    let names: Vec<String> = events.iter().map(name).collect();
    let last = names.len() - 1;
    assert_eq!(position(&names, "completed"), last, "{version}: {names:?}");
    let deltas: String = events
        .iter()
        .filter_map(|e| match e {
            TurnEvent::AgentMessageDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, "a single red dot", "{version}: {names:?}");
    let first_delta = names.iter().position(|n| n.starts_with("delta:")).unwrap();
    assert!(
        position(&names, "started:agentMessage") < first_delta,
        "{version}: {names:?}"
    );
    assert!(
        first_delta < position(&names, "completed:agentMessage"),
        "{version}: {names:?}"
    );
    assert!(
        position(&names, "completed:agentMessage") < position(&names, "usage"),
        "{version}: {names:?}"
    );
    let Some(TurnEvent::Completed(report)) = events.pop() else {
        unreachable!()
    };
    assert_eq!(report.reply, "a single red dot", "{version}");
    assert_eq!(report.publication, Publication::Published, "{version}");
    assert!(
        report.token_usage.is_some_and(|u| u.total.total_tokens > 0),
        "{version}"
    );
    assert_eq!(
        report.rows[0]["attachments"],
        json!([{"type": "localImage", "path": image.display().to_string()}]),
        "{version}"
    );
    let record = store.session("s").await.unwrap().unwrap();
    assert_eq!(
        (record.thread_id(), record.row_count),
        (Some(thread.as_str()), report.rows.len() as u64),
        "{version}"
    );
    // Codex accepted the image by path and sent the model its bytes.
    let requests = model.model_requests();
    let body = requests.last().unwrap().json().unwrap();
    assert_eq!(
        image_urls(&body),
        [format!("data:image/png;base64,{}", base64(&tiny_png()))],
        "{version}"
    );
    // The second subscriber saw the deltas before the turn's end.
    let seen = read_until_turn_completed(&mut observer).await;
    let observed: String = seen
        .iter()
        .filter_map(|e| match e {
            ThreadEvent::Notification(ServerNotification::AgentMessageDelta(d)) => {
                Some(d.delta.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(observed, "a single red dot", "{version}");

    // An approval: the command the model asks for is declined by the default handler, and
    // the turn's events say so.
    model.push_escalated_command("echo approved");
    let mut turn = session.run_turn_streamed("run the command").await.unwrap();
    let mut approvals = Vec::new();
    let report = loop {
        match turn
            .next()
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{version}: {e}"))
        {
            TurnEvent::ServerRequest(answered) => approvals.push(answered),
            TurnEvent::Completed(report) => break report,
            _ => {}
        }
    };
    drop(turn);
    assert_eq!(approvals.len(), 1, "{version}: {approvals:?}");
    assert!(approvals[0].request.is_approval(), "{version}");
    assert_eq!(
        approvals[0].answer,
        Ok(approvals[0].request.decline_result().unwrap()),
        "{version}"
    );
    assert_eq!(report.publication, Publication::Published, "{version}");
    assert!(matches!(
        report.rows.last().map(|r| r["role"].clone()),
        Some(Value::String(role)) if role == "assistant"
    ));
    client.shutdown().await;
}
