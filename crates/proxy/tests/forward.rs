//! The forwarder against the in-process fake app-server and against a scripted codex (the test
//! plays codex on the other end of a pipe): transparency, ids, approvals, garbage, oversized
//! lines, back-pressure, the ways forwarding ends, and the seam's order guarantees.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rethread_proxy::{
    ClientAction, ClientContext, ClientError, Ended, HookError, Line, LineKind, NoSession,
    ProxyError, ServerAction, ServerContext, SessionHooks, NO_SESSION_WARNING, PROXY_ID_PREFIX,
};
use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Forwards everything and does nothing else.
#[derive(Debug, Default)]
struct Transparent;

impl SessionHooks for Transparent {}

#[tokio::test]
async fn a_turn_passes_through_byte_for_byte_with_one_warning_after_initialize() {
    let (mut proxied, fake) = proxy_fake(Arc::new(NoSession::new()), FakeAppServer::builder());
    let init = proxied.client.initialize(false).await.unwrap();
    assert!(init["result"]["userAgent"].is_string(), "{init}");
    let started = start_thread(&mut proxied.client).await;
    let id = thread_id(&started);
    let turn = proxied
        .client
        .run_turn(&id, "remember zebra", None)
        .await
        .unwrap();
    assert_eq!(turn.agent_text(), ["echo: remember zebra"]);
    let (ended, proxied) = close_client(proxied).await;
    assert_eq!(
        ended,
        Ended::ClientClosed {
            codex_finished: true
        }
    );
    assert!(!fake.is_running(), "codex's input was closed");

    // Codex read exactly what the client wrote.
    assert_eq!(bytes(&proxied.codex_read), bytes(&proxied.client_sent));
    // The client read exactly what codex wrote, plus one warning right after `initialize`.
    let mut got = lines(&proxied.client_got);
    let warnings: Vec<usize> = (0..got.len())
        .filter(|i| got[*i].contains("\"method\":\"warning\""))
        .collect();
    assert_eq!(warnings.len(), 1, "{got:#?}");
    let warning: Value = serde_json::from_str(&got[warnings[0]]).unwrap();
    assert_eq!(
        warning,
        json!({"method": "warning", "params": {"message": NO_SESSION_WARNING, "threadId": null}})
    );
    let before: Value = serde_json::from_str(&got[warnings[0] - 1]).unwrap();
    assert_eq!(before["id"], 1, "the warning follows the initialize answer");
    got.remove(warnings[0]);
    assert_eq!(got, lines(&proxied.codex_wrote));
    assert_eq!(
        *proxied.reports.lock().unwrap(),
        vec![NO_SESSION_WARNING.to_string()]
    );
}

#[tokio::test]
async fn a_client_sees_the_same_turn_directly_and_through_the_proxy() {
    async fn script<R, W>(peer: &mut WirePeer<R, W>) -> (Vec<String>, Vec<String>)
    where
        R: tokio::io::AsyncRead + Unpin,
        W: tokio::io::AsyncWrite + Unpin,
    {
        peer.initialize(true).await.unwrap();
        let started = peer
            .request(
                "thread/start",
                Some(json!({"cwd": "/tmp", "developerInstructions": "be brief"})),
            )
            .await
            .unwrap();
        let turn = peer
            .run_turn(&thread_id(&started), "hello", None)
            .await
            .unwrap();
        let mut methods: Vec<String> = peer
            .drain_queued()
            .iter()
            .filter_map(|m| m["method"].as_str().map(str::to_string))
            .collect();
        methods.extend(turn.methods());
        (methods, turn.agent_text())
    }
    let (stream, _direct_fake) = FakeAppServer::builder().spawn_in_process().unwrap();
    let (read, write) = tokio::io::split(stream);
    let direct = script(&mut WirePeer::new(read, write)).await;
    let (mut proxied, _fake) = proxy_fake(Arc::new(Transparent), FakeAppServer::builder());
    let through = script(&mut proxied.client).await;
    assert!(!direct.0.is_empty());
    assert_eq!(direct, through);
}

/// Makes its own requests: one before forwarding each client `thread/read`, and a stream of
/// them from a task of its own started in `on_start`.
#[derive(Debug, Default)]
struct Chatty {
    answered: AtomicUsize,
    failed: Mutex<Vec<String>>,
}

impl Chatty {
    fn note(&self, result: Result<Value, ClientError>) {
        match result {
            Ok(value) if value.get("data").is_some() => {
                self.answered.fetch_add(1, Ordering::SeqCst);
            }
            // Codex's refusals (before `initialize`) are answers too: they came back to us.
            Err(ClientError::Rpc { .. }) => {
                self.answered.fetch_add(1, Ordering::SeqCst);
            }
            other => self.failed.lock().unwrap().push(format!("{other:?}")),
        }
    }
}

#[derive(Debug, Default)]
struct ChattyHooks(Arc<Chatty>);

impl SessionHooks for ChattyHooks {
    async fn on_start(&self, ctx: &ClientContext) -> Result<(), HookError> {
        let requester = ctx.requester();
        let chatty = self.0.clone();
        tokio::spawn(async move {
            for _ in 0..40 {
                chatty.note(requester.request("thread/list", Some(json!({}))).await);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        Ok(())
    }
    async fn on_client_message(
        &self,
        line: &Line,
        ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        if line.method() == Some("thread/read") {
            self.0
                .note(ctx.request("thread/list", Some(json!({}))).await);
        }
        Ok(ClientAction::Forward)
    }
    async fn on_server_message(
        &self,
        line: &Line,
        _ctx: &ServerContext,
    ) -> Result<ServerAction, HookError> {
        assert!(
            !line.id().is_some_and(
                |id| id.to_string().contains(PROXY_ID_PREFIX) && line.kind().is_answer()
            ),
            "a proxy answer reached the hooks: {line:?}"
        );
        Ok(ServerAction::Forward)
    }
}

#[tokio::test]
async fn client_ids_and_the_proxys_own_ids_never_collide() {
    let chatty = Arc::new(Chatty::default());
    let (mut proxied, _fake) = proxy_fake(
        Arc::new(ChattyHooks(chatty.clone())),
        FakeAppServer::builder(),
    );
    let client = &mut proxied.client;
    // Integer ids (the harness counts from 1) ...
    let thread = open_thread(client).await;
    // ... UUID strings, a string that looks like an integer already used, big and negative
    // integers, and one id in the proxy's own space.
    let ids = [
        json!("9f1c2a4e-6b7d-4e8f-9a0b-1c2d3e4f5a6b"),
        json!("1"),
        json!(2),
        json!(9_007_199_254_740_993_i64),
        json!(-7),
        json!("00000000-0000-0000-0000-000000000000"),
    ];
    for id in &ids {
        client
            .send(&json!({"id": id, "method": "thread/read", "params": {"threadId": thread}}))
            .await
            .unwrap();
    }
    let reserved = json!(format!("{PROXY_ID_PREFIX}1"));
    client
        .send(&json!({"id": reserved, "method": "thread/list", "params": {}}))
        .await
        .unwrap();
    for id in &ids {
        let answer = client.response_to(id).await.unwrap();
        assert_eq!(answer["result"]["thread"]["id"], json!(thread), "{answer}");
    }
    let refused = client.response_to(&reserved).await.unwrap();
    assert_eq!(error_of(&refused).unwrap().0, -32600, "{refused}");
    // Let the background requests finish.
    for _ in 0..500 {
        if chatty.answered.load(Ordering::SeqCst) >= 40 + ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_, proxied) = close_client(proxied).await;
    assert_eq!(chatty.failed.lock().unwrap().clone(), Vec::<String>::new());
    assert_eq!(chatty.answered.load(Ordering::SeqCst), 40 + ids.len());
    // Not one of the proxy's answers reached the client (the one answer in its id space is
    // the refusal of the client's own request), and codex never saw the reserved id.
    let in_proxy_space: Vec<Value> = lines(&proxied.client_got)
        .iter()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|value| value.get("method").is_none())
        .filter(|value| {
            value["id"]
                .as_str()
                .is_some_and(|s| s.starts_with(PROXY_ID_PREFIX))
        })
        .collect();
    assert_eq!(in_proxy_space, [refused]);
    let reserved_seen_by_codex = lines(&proxied.codex_read)
        .iter()
        .filter(|l| {
            l.contains(&format!(
                "\"id\":\"{PROXY_ID_PREFIX}1\",\"method\":\"thread/list\""
            ))
        })
        .count();
    // Exactly one: the proxy's own first request; the client's was refused.
    assert_eq!(reserved_seen_by_codex, 1);
}

#[tokio::test]
async fn approvals_and_their_answers_pass_both_ways() {
    let (mut proxied, _fake) = proxy_fake(
        Arc::new(Transparent),
        FakeAppServer::builder().faults(FaultScript::of([Fault::Approval { turn: 1 }])),
    );
    proxied.client.initialize(false).await.unwrap();
    let id = thread_id(&start_thread(&mut proxied.client).await);
    let turn = proxied
        .client
        .run_turn(&id, "run it", Some(json!({"decision": "accept"})))
        .await
        .unwrap();
    assert_eq!(turn.status().as_deref(), Some("completed"));
    let request = turn
        .messages
        .iter()
        .find(|m| m.get("id").is_some() && m.get("method").is_some())
        .expect("an approval request reached the client");
    assert_eq!(
        request["method"], "item/commandExecution/requestApproval",
        "{request}"
    );
    let (_, proxied) = close_client(proxied).await;
    let answer = format!(
        "{{\"id\":{},\"result\":{{\"decision\":\"accept\"}}}}",
        request["id"]
    );
    assert!(
        lines(&proxied.codex_read).contains(&answer),
        "codex got the client's answer as sent"
    );
    assert_eq!(bytes(&proxied.codex_read), bytes(&proxied.client_sent));
    assert_eq!(bytes(&proxied.client_got), bytes(&proxied.codex_wrote));
}

/// A scripted codex: the test writes codex's lines and reads what reaches codex.
struct Scripted {
    proxied: Proxied,
    codex_lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    codex_write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
}

fn scripted(
    hooks: impl SessionHooks + 'static,
    codex_pipe: usize,
    options: impl FnOnce(rethread_proxy::ProxyOptions) -> rethread_proxy::ProxyOptions,
) -> Scripted {
    let (codex_end, proxy_end) = tokio::io::duplex(codex_pipe);
    let (read, write) = tokio::io::split(proxy_end);
    let proxied = proxy(Arc::new(hooks), read, write, options);
    let (codex_read, codex_write) = tokio::io::split(codex_end);
    Scripted {
        proxied,
        codex_lines: BufReader::new(codex_read).lines(),
        codex_write,
    }
}

impl Scripted {
    async fn codex_says(&mut self, bytes: &[u8]) {
        self.codex_write.write_all(bytes).await.unwrap();
    }
    async fn codex_hears(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(10), self.codex_lines.next_line())
            .await
            .expect("a line for codex")
            .unwrap()
            .expect("codex's input is open")
    }
    async fn client_hears_raw(&mut self) -> Value {
        self.proxied
            .client
            .next_message()
            .await
            .unwrap()
            .expect("a line")
    }
}

#[tokio::test]
async fn garbage_passes_through_unchanged_and_is_reported_unless_codex_would_die_of_it() {
    let mut s = scripted(Transparent, 64 * 1024, |o| o);
    let garbage: [&[u8]; 3] = [b"not json", b"[1,2]", b"{\"id\":1.5,\"method\":\"m\"}"];
    // Not UTF-8: codex's line reader would fail on it and codex exit (tests/hostile.rs).
    let not_utf8: &[u8] = b"\xff\xfe{";
    for line in garbage.into_iter().chain([not_utf8]) {
        s.proxied
            .client
            .send_raw(&[line, b"\n"].concat())
            .await
            .unwrap();
    }
    s.proxied
        .client
        .send(&json!({"id": 1, "method": "thread/list"}))
        .await
        .unwrap();
    for line in garbage {
        let heard = s.codex_lines.get_mut();
        let mut raw = Vec::new();
        heard.read_until(b'\n', &mut raw).await.unwrap();
        assert_eq!(raw, [line, b"\n"].concat());
    }
    assert_eq!(s.codex_hears().await, r#"{"id":1,"method":"thread/list"}"#);
    s.codex_says(b"codex says hi\n{\"id\":1,\"result\":{\"data\":[]}}\n")
        .await;
    assert_eq!(s.client_hears_raw().await, json!("codex says hi"));
    assert_eq!(
        s.client_hears_raw().await,
        json!({"id": 1, "result": {"data": []}})
    );
    let reports = s.proxied.reports.lock().unwrap().clone();
    assert_eq!(reports.len(), 5, "{reports:#?}");
    let unrouted = reports
        .iter()
        .filter(|r| r.contains("not a JSON-RPC message"))
        .count();
    assert_eq!(unrouted, 4, "{reports:#?}");
    assert!(
        reports
            .iter()
            .any(|r| r.contains("dropped a line from the client that is not UTF-8")),
        "{reports:#?}"
    );
}

#[tokio::test]
async fn oversized_lines_are_answered_in_their_senders_place_or_dropped() {
    let limit = 10_000;
    let mut s = scripted(Transparent, 64 * 1024, |mut o| {
        o.max_line_length = limit;
        o
    });
    let big = "x".repeat(3 * limit);
    // A client request: answered with an error, never reaches codex.
    s.proxied
        .client
        .send(&json!({"id": "big-1", "method": "turn/start", "params": {"text": big}}))
        .await
        .unwrap();
    let answer = s.proxied.client.response_to(&json!("big-1")).await.unwrap();
    assert_eq!(error_of(&answer).unwrap().0, -32600, "{answer}");
    // A client answer to a server request: codex gets an error in its place.
    s.proxied
        .client
        .send(&json!({"id": 41, "result": {"text": big}}))
        .await
        .unwrap();
    let heard: Value = serde_json::from_str(&s.codex_hears().await).unwrap();
    assert_eq!(heard["id"], 41);
    assert_eq!(heard["error"]["code"], -32600);
    // Codex's answer to a client request: the client gets an error with its id.
    let line = json!({"id": 5, "result": {"thread": {"turns": [big]}}}).to_string();
    s.codex_says(format!("{line}\n").as_bytes()).await;
    let answer = s.client_hears_raw().await;
    assert_eq!(answer["id"], 5);
    assert_eq!(answer["error"]["code"], -32603);
    // Codex's server request: answered to codex with an error.
    let line = json!({"id": 9, "method": "item/tool/call", "params": {"a": big}}).to_string();
    s.codex_says(format!("{line}\n").as_bytes()).await;
    let heard: Value = serde_json::from_str(&s.codex_hears().await).unwrap();
    assert_eq!(
        (heard["id"].clone(), heard["error"]["code"].clone()),
        (json!(9), json!(-32603))
    );
    // A notification: dropped; the next line still passes.
    let line = json!({"method": "item/completed", "params": {"a": big}}).to_string();
    s.codex_says(format!("{line}\n{{\"method\":\"after\"}}\n").as_bytes())
        .await;
    assert_eq!(s.client_hears_raw().await, json!({"method": "after"}));
    assert_eq!(s.proxied.reports.lock().unwrap().len(), 5);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_does_not_read_slows_codex_down_and_loses_nothing() {
    let total = 20_000usize;
    let mut s = scripted(Transparent, 4096, |mut o| {
        o.queue_lines = 8;
        o.queue_bytes = 4096;
        o.write_buffer = 4096;
        o
    });
    let written = Arc::new(AtomicUsize::new(0));
    let counter = written.clone();
    let mut codex_write = s.codex_write;
    let writer = tokio::spawn(async move {
        for n in 0..total {
            let line = format!("{{\"method\":\"tick\",\"params\":{{\"n\":{n}}}}}\n");
            codex_write.write_all(line.as_bytes()).await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
        }
        codex_write
    });
    // Once no task can go on (the clock is paused: tokio moves it on, and so ends this sleep,
    // only when every task waits), codex's writes are held where the client stopped reading.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let stalled = written.load(Ordering::SeqCst);
    // Pipes (4 KiB to the proxy, 64 KiB to the client), the proxy's read buffer, queue and
    // write buffer hold a few thousand of these 40-byte lines at most.
    assert!(
        stalled < 4_000,
        "codex wrote {stalled} lines to a client that reads nothing"
    );
    for n in 0..total {
        let message = s.proxied.client.next_message().await.unwrap().unwrap();
        assert_eq!(message["params"]["n"], n);
    }
    let _ = writer.await.unwrap();
}

#[tokio::test]
async fn when_codex_closes_its_output_everything_it_said_reaches_the_client() {
    let mut s = scripted(Transparent, 64 * 1024, |o| o);
    let mut said = String::new();
    for n in 0..1000 {
        said.push_str(&format!("{{\"method\":\"n\",\"params\":{n}}}\n"));
    }
    s.codex_says(said.as_bytes()).await;
    s.codex_write.shutdown().await.unwrap();
    drop(s.codex_write);
    let mut proxied = s.proxied;
    let ended = tokio::time::timeout(Duration::from_secs(10), &mut proxied.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ended, Ended::CodexClosed);
    let mut got = Vec::new();
    while let Some(message) = proxied.client.next_message().await.unwrap() {
        got.push(message);
    }
    assert_eq!(got.len(), 1000);
    assert_eq!(bytes(&proxied.client_got), said.as_bytes());
}

#[tokio::test]
async fn a_codex_that_ignores_the_end_of_its_input_is_given_up_on_after_the_grace() {
    let mut s = scripted(Transparent, 64 * 1024, |mut o| {
        o.shutdown_grace = Duration::from_millis(200);
        o
    });
    s.proxied.client.close_writer().await;
    // Codex's input is closed ...
    assert!(s.codex_lines.next_line().await.unwrap().is_none());
    // ... but it keeps its output open: the forwarder stops waiting after the grace.
    let ended = tokio::time::timeout(Duration::from_secs(5), &mut s.proxied.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        ended,
        Ended::ClientClosed {
            codex_finished: false
        }
    );
}

/// Answers the client's first `thread/start` itself, the way a session binding does on a
/// fallback: its own `thread/start`, then a warning, then the answer under the client's id.
#[derive(Debug, Default)]
struct AnswersStart {
    done: Mutex<bool>,
}

impl SessionHooks for AnswersStart {
    async fn on_client_message(
        &self,
        line: &Line,
        ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        if line.kind() != LineKind::Request || line.method() != Some("thread/start") {
            return Ok(ClientAction::Forward);
        }
        if std::mem::replace(&mut *self.done.lock().unwrap(), true) {
            return Ok(ClientAction::Forward);
        }
        let params = line.value()?["params"].clone();
        let result = ctx.request("thread/start", Some(params)).await?;
        let thread = result["thread"]["id"].as_str().map(str::to_string);
        ctx.send_to_client(Line::warning("started by the hook", thread.as_deref()))
            .await?;
        ctx.send_to_client(Line::response(line.id().unwrap().clone(), result))
            .await?;
        Ok(ClientAction::Consumed)
    }
}

#[tokio::test]
async fn what_codex_said_before_a_proxy_answer_then_the_warning_then_the_client_answer() {
    let (mut proxied, fake) =
        proxy_fake(Arc::new(AnswersStart::default()), FakeAppServer::builder());
    proxied.client.initialize(false).await.unwrap();
    let answer = start_thread(&mut proxied.client).await;
    let id = thread_id(&answer);
    let before: Vec<String> = proxied
        .client
        .drain_queued()
        .iter()
        .map(|m| m["method"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(before, ["thread/started", "warning"]);
    // The client's next line reaches codex after the hook's own request: the turn runs on
    // the thread the hook started.
    let turn = proxied.client.run_turn(&id, "hi", None).await.unwrap();
    assert_eq!(turn.status().as_deref(), Some("completed"));
    assert_eq!(fake.methods(), ["initialize", "thread/start", "turn/start"]);
    let (_, proxied) = close_client(proxied).await;
    let warning: Value = serde_json::from_str(
        lines(&proxied.client_got)
            .iter()
            .find(|l| l.contains("\"warning\""))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(warning["params"]["threadId"], json!(id));
}

/// Fails on `turn/start`.
#[derive(Debug, Default)]
struct FailsOnTurn;

impl SessionHooks for FailsOnTurn {
    async fn on_client_message(
        &self,
        line: &Line,
        _ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        if line.method() == Some("turn/start") {
            return Err("the store is gone".into());
        }
        Ok(ClientAction::Forward)
    }
}

#[tokio::test]
async fn a_hook_error_stops_the_proxy() {
    let (mut proxied, _fake) = proxy_fake(Arc::new(FailsOnTurn), FakeAppServer::builder());
    proxied.client.initialize(false).await.unwrap();
    proxied
        .client
        .send(&json!({"id": 9, "method": "turn/start", "params": {}}))
        .await
        .unwrap();
    let result = tokio::time::timeout(Duration::from_secs(5), &mut proxied.task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&result, Err(ProxyError::Hook(e)) if e.to_string() == "the store is gone"),
        "{result:?}"
    );
}

/// Makes one request of its own on `thread/list` and reports how it went.
#[derive(Debug, Default)]
struct AsksOnce(Mutex<Option<Result<Value, ClientError>>>);

impl SessionHooks for AsksOnce {
    async fn on_client_message(
        &self,
        line: &Line,
        ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        if line.method() == Some("thread/list") {
            let result = ctx.request("thread/list", None).await;
            *self.0.lock().unwrap() = Some(result);
        }
        Ok(ClientAction::Forward)
    }
}

#[tokio::test]
async fn a_proxy_request_times_out_and_its_late_answer_reaches_nobody() {
    let hooks = Arc::new(AsksOnce::default());
    let (codex_end, proxy_end) = tokio::io::duplex(64 * 1024);
    let (read, write) = tokio::io::split(proxy_end);
    let mut proxied = proxy(hooks.clone(), read, write, |mut o| {
        o.request_timeout = Duration::from_millis(100);
        o
    });
    let (codex_read, mut codex_write) = tokio::io::split(codex_end);
    let mut codex_lines = BufReader::new(codex_read).lines();
    proxied
        .client
        .send(&json!({"id": 1, "method": "thread/list"}))
        .await
        .unwrap();
    let own: Value =
        serde_json::from_str(&codex_lines.next_line().await.unwrap().unwrap()).unwrap();
    assert_eq!(own["id"], json!(format!("{PROXY_ID_PREFIX}1")));
    // Codex does not answer in time; the client's request goes on once the hook gave up.
    let client: Value =
        serde_json::from_str(&codex_lines.next_line().await.unwrap().unwrap()).unwrap();
    assert_eq!(client["id"], 1);
    assert!(matches!(
        hooks.0.lock().unwrap().take(),
        Some(Err(ClientError::Timeout { .. }))
    ));
    codex_write
        .write_all(
            format!("{{\"id\":\"{PROXY_ID_PREFIX}1\",\"result\":{{}}}}\n{{\"id\":1,\"result\":{{\"data\":[]}}}}\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    // The client gets only its own answer.
    assert_eq!(
        proxied.client.next_message().await.unwrap().unwrap(),
        json!({"id": 1, "result": {"data": []}})
    );
    let reports = proxied.reports.lock().unwrap().clone();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(reports[0].contains("no longer waits"));
    // Once codex's output ends, a request fails at once.
    drop(codex_write);
    drop(codex_lines);
    proxied
        .client
        .send(&json!({"id": 2, "method": "thread/list"}))
        .await
        .unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), &mut proxied.task).await;
    let outcome = hooks.0.lock().unwrap().take();
    assert!(
        matches!(outcome, None | Some(Err(ClientError::Closed { .. }))),
        "{outcome:?}"
    );
}
