//! Hostile and unlucky input to the forwarder (issue 19, items 18-20): client lines codex would
//! die of or read otherwise than the proxy, a codex that dies while the proxy's own request
//! waits for it, and a codex that exits while the client reads slowly. The test plays codex on
//! the other end of a pipe, reading its input the way codex does (`BufReader::lines`, which
//! fails on a line that is not UTF-8).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rethread_protocol::{ErrorCode, RequestId, RpcError};
use rethread_proxy::{
    forward, ClientAction, ClientContext, ClientError, Ended, HookError, Line, LineKind, NoSession,
    SessionHooks,
};
use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// What the hooks saw of a line: its kind, id and method.
type Seen = (LineKind, Option<RequestId>, Option<String>);

/// Forwards everything and records what the client side's hook saw.
#[derive(Debug, Default)]
struct Recording {
    seen: Mutex<Vec<Seen>>,
}

impl SessionHooks for Recording {
    async fn on_client_message(
        &self,
        line: &Line,
        _ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        self.seen.lock().unwrap().push((
            line.kind(),
            line.id().cloned(),
            line.method().map(str::to_string),
        ));
        Ok(ClientAction::Forward)
    }
}

/// A forwarder between a test client and a codex the test plays.
struct Scripted {
    proxied: Proxied,
    codex_lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    codex_write: Option<tokio::io::WriteHalf<tokio::io::DuplexStream>>,
}

fn scripted(hooks: Arc<impl SessionHooks + 'static>) -> Scripted {
    let (codex_end, proxy_end) = tokio::io::duplex(64 * 1024);
    let (read, write) = tokio::io::split(proxy_end);
    let proxied = proxy(hooks, read, write, |mut o| {
        o.request_timeout = Duration::from_secs(30);
        o
    });
    let (codex_read, codex_write) = tokio::io::split(codex_end);
    Scripted {
        proxied,
        codex_lines: BufReader::new(codex_read).lines(),
        codex_write: Some(codex_write),
    }
}

impl Scripted {
    async fn client_sends(&mut self, line: &[u8]) {
        self.proxied
            .client
            .send_raw(&[line, b"\n"].concat())
            .await
            .unwrap();
    }
    /// The next line codex reads, read as codex reads it (a line that is not UTF-8 fails).
    async fn codex_hears(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(10), self.codex_lines.next_line())
            .await
            .expect("a line for codex")
            .expect("codex can read its input as UTF-8 lines")
            .expect("codex's input is open")
    }
    async fn codex_says(&mut self, line: &Value) {
        let writer = self.codex_write.as_mut().unwrap();
        writer
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
    }
    async fn client_hears(&mut self) -> Value {
        tokio::time::timeout(Duration::from_secs(10), self.proxied.client.next_message())
            .await
            .expect("a line for the client")
            .unwrap()
            .expect("the client's input is open")
    }
    fn reports(&self) -> Vec<String> {
        self.proxied.reports.lock().unwrap().clone()
    }
}

/// Issue 19, item 18: one byte that is not UTF-8 in a client request went to codex, whose
/// stdin reader fails on it and ends codex (the proxy then exited 0, the session over). The
/// request is answered with `-32700` and its id, codex never reads it, the session goes on.
#[tokio::test]
async fn a_request_that_is_not_utf8_is_answered_and_the_session_goes_on() {
    let mut s = scripted(Arc::new(Recording::default()));
    s.client_sends(b"{\"id\":7,\"method\":\"turn/start\",\"params\":{\"text\":\"caf\xe9\"}}")
        .await;
    let answer = s.client_hears().await;
    assert_eq!(answer["id"], 7, "{answer}");
    assert_eq!(answer["error"]["code"], -32700, "{answer}");
    // Without an id to answer, the line is reported and dropped.
    s.client_sends(b"{\"method\":\"note\",\"params\":\"\xff\"}")
        .await;
    s.client_sends(br#"{"id":8,"method":"thread/list"}"#).await;
    assert_eq!(s.codex_hears().await, r#"{"id":8,"method":"thread/list"}"#);
    s.codex_says(&json!({"id": 8, "result": {"data": []}}))
        .await;
    assert_eq!(
        s.client_hears().await,
        json!({"id": 8, "result": {"data": []}})
    );
    let reports = s.reports();
    assert_eq!(reports.len(), 2, "{reports:#?}");
    assert!(
        reports.iter().all(|r| r.contains("not UTF-8")),
        "{reports:#?}"
    );
}

/// Issue 19, item 19: a client line with two `id`s (or two of any member routing reads) was
/// passed to codex as "not a message"; the fake answered it under its last id, an answer the
/// proxy could take for its own. Such lines never reach codex; a sender that can be named is
/// answered (a request's sender with `-32600`; codex, for the client's answer to its request,
/// with an error in its place), any other is reported and dropped.
#[tokio::test]
async fn a_line_with_a_duplicate_member_never_reaches_codex() {
    let hooks = Arc::new(Recording::default());
    let mut s = scripted(hooks.clone());
    s.client_sends(br#"{"id":1,"id":"rethread-proxy:1","method":"thread/list"}"#)
        .await;
    s.client_sends(br#"{"method":"a","method":"b"}"#).await;
    s.client_sends(br#"{"id":"dup-method","method":"thread/list","method":"thread/read"}"#)
        .await;
    let answer = s.client_hears().await;
    assert_eq!(
        (answer["id"].clone(), answer["error"]["code"].clone()),
        (json!("dup-method"), json!(-32600)),
        "{answer}"
    );
    s.client_sends(br#"{"id":"dup-params","method":"m","params":{},"params":{}}"#)
        .await;
    let answer = s.client_hears().await;
    assert_eq!(answer["id"], "dup-params", "{answer}");
    // The client's answer to a server request, with two results: codex gets an error for it.
    s.client_sends(br#"{"id":41,"result":{"a":1},"result":{"a":2}}"#)
        .await;
    let heard: Value = serde_json::from_str(&s.codex_hears().await).unwrap();
    assert_eq!(
        (heard["id"].clone(), heard["error"]["code"].clone()),
        (json!(41), json!(-32600)),
        "{heard}"
    );
    s.client_sends(br#"{"id":2,"method":"thread/list"}"#).await;
    assert_eq!(s.codex_hears().await, r#"{"id":2,"method":"thread/list"}"#);
    assert_eq!(
        *hooks.seen.lock().unwrap(),
        vec![(
            LineKind::Request,
            Some(RequestId::Integer(2)),
            Some("thread/list".to_string())
        )],
        "the hooks never see a refused line"
    );
    let reports = s.reports();
    assert_eq!(reports.len(), 5, "{reports:#?}");
    assert!(
        reports.iter().all(|r| r.contains("duplicate")),
        "{reports:#?}"
    );
}

/// The proxy's view of a client line (kind, id, method) is serde_json's: a line serde_json
/// cannot read is not routed as a message (a reader that skipped nested values unchecked would
/// see a request in each of these), and escapes in member names are read.
#[tokio::test]
async fn the_hooks_see_a_client_line_as_serde_json_reads_it() {
    let hooks = Arc::new(Recording::default());
    let mut s = scripted(hooks.clone());
    let unreadable: [&[u8]; 3] = [
        br#"{"id":1,"method":"thread/start","params":{"cwd":tru}}"#,
        br#"{"id":2,"method":"thread/start","params":{"n":1e999}}"#,
        br#"{"id":3,"method":"thread/start","params":{"a":[1 2]}}"#,
    ];
    for line in unreadable {
        s.client_sends(line).await;
    }
    s.client_sends(br#"{"i\u0064":4,"me\u0074hod":"thread/list"}"#)
        .await;
    for line in unreadable {
        // Passed on unrouted: codex ignores a line it cannot read, as it would without us.
        assert_eq!(s.codex_hears().await.as_bytes(), line);
    }
    assert_eq!(
        s.codex_hears().await,
        r#"{"i\u0064":4,"me\u0074hod":"thread/list"}"#
    );
    assert_eq!(
        *hooks.seen.lock().unwrap(),
        vec![(
            LineKind::Request,
            Some(RequestId::Integer(4)),
            Some("thread/list".to_string())
        )]
    );
}

/// Resumes, like the session hooks do on a client's `thread/start`, with a request of its own,
/// and answers the client with an error when that request fails.
#[derive(Debug, Default)]
struct ResumesOnStart {
    failures: Mutex<Vec<ClientError>>,
}

impl SessionHooks for ResumesOnStart {
    async fn on_client_message(
        &self,
        line: &Line,
        ctx: &ClientContext,
    ) -> Result<ClientAction, HookError> {
        if line.method() != Some("thread/start") {
            return Ok(ClientAction::Forward);
        }
        let params = json!({"threadId": "thr-bound"});
        match ctx.request("thread/resume", Some(params)).await {
            Ok(result) => {
                let answer = Line::response(line.id().unwrap().clone(), result);
                ctx.send_to_client(answer).await?;
            }
            Err(error) => {
                let rpc = RpcError::new(ErrorCode::INTERNAL_ERROR, error.to_string());
                self.failures.lock().unwrap().push(error);
                ctx.send_to_client(Line::error_response(line.id().cloned(), rpc))
                    .await?;
            }
        }
        Ok(ClientAction::Consumed)
    }
}

/// Issue 19, item 20: codex dying while the proxy's own `thread/resume` waited gave the client
/// EOF and no answer: the forwarder closed the client's output on codex's EOF before the hook
/// could queue its error. The hook that is mid-request now finishes, and what it queued reaches
/// the client before the end.
#[tokio::test]
async fn codex_dying_during_the_proxys_own_request_still_answers_the_client() {
    let hooks = Arc::new(ResumesOnStart::default());
    let mut s = scripted(hooks.clone());
    s.client_sends(br#"{"id":"start-1","method":"thread/start","params":{"cwd":"/"}}"#)
        .await;
    let resume: Value = serde_json::from_str(&s.codex_hears().await).unwrap();
    assert_eq!(resume["method"], "thread/resume");
    // Codex dies: its output ends without an answer.
    let mut output = s.codex_write.take().unwrap();
    output.shutdown().await.unwrap();
    let answer = s.client_hears().await;
    assert_eq!(answer["id"], "start-1", "{answer}");
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert!(matches!(
        hooks.failures.lock().unwrap().as_slice(),
        [ClientError::Closed { .. }]
    ));
    assert_eq!(s.proxied.client.next_message().await.unwrap(), None);
    let ended = tokio::time::timeout(Duration::from_secs(10), &mut s.proxied.task)
        .await
        .expect("the forwarder ends")
        .unwrap()
        .unwrap();
    assert_eq!(ended, Ended::CodexClosed);
}

/// Codex exits while the queue to a slow client is full: closing the client's output waits for
/// room that only the client's writer makes. That close ran in the forwarder's `select!` arm,
/// where nothing else is polled: the writer stalled, and the proxy hung (deaf to signals too).
#[tokio::test]
async fn codex_exiting_while_the_client_reads_slowly_ends_with_everything_delivered() {
    let (codex_end, proxy_codex) = tokio::io::duplex(64 * 1024);
    let (codex_out, codex_in) = tokio::io::split(proxy_codex);
    let (codex_out, codex_read_to_end) = signal_end(codex_out);
    // One byte in flight to the client: the proxy's writer waits until the client reads.
    let (client_end, proxy_client) = tokio::io::duplex(1);
    let (client_in, client_out) = tokio::io::split(proxy_client);
    let reports = Arc::new(Mutex::new(Vec::new()));
    let mut options = recording_options(&reports);
    options.queue_lines = 2;
    options.write_buffer = 1;
    let said = "{\"method\":\"n\",\"params\":1}\n{\"method\":\"n\",\"params\":2}\n\
                {\"method\":\"n\",\"params\":3}\n";
    let (_codex_read, mut codex_write) = tokio::io::split(codex_end);
    codex_write.write_all(said.as_bytes()).await.unwrap();
    codex_write.shutdown().await.unwrap();
    let task = tokio::spawn(async move {
        let hooks = NoSession::new();
        let stop = std::future::pending();
        forward(
            &hooks, &options, client_in, client_out, codex_out, codex_in, stop,
        )
        .await
    });
    // The client's input stays open; it starts reading once the queue has filled up. The
    // proxy reads codex's end only after the last line went into the queue, and in that same
    // poll of its task (before this one runs again) it turns to closing the client's output:
    // with the queue full, where the bug hung.
    let (mut client_read, _client_write) = tokio::io::split(client_end);
    tokio::time::timeout(Duration::from_secs(5), codex_read_to_end)
        .await
        .expect("the proxy reads codex's output to its end")
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), client_read.read_to_end(&mut got))
        .await
        .expect("the client's output ends")
        .unwrap();
    assert_eq!(String::from_utf8(got).unwrap(), said);
    let ended = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the forwarder ends")
        .unwrap()
        .unwrap();
    assert_eq!(ended, Ended::CodexClosed);
}

/// `inner`, and a receiver told when a read through it first finds the end of the stream.
fn signal_end<R>(inner: R) -> (SignalEnd<R>, tokio::sync::oneshot::Receiver<()>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let reader = SignalEnd {
        inner,
        ended: Some(tx),
    };
    (reader, rx)
}

/// A reader that says when it reaches the end of its stream (see [`signal_end`]).
struct SignalEnd<R> {
    inner: R,
    ended: Option<tokio::sync::oneshot::Sender<()>>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for SignalEnd<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let at_end = matches!(poll, std::task::Poll::Ready(Ok(()))) && buf.filled().len() == before;
        if at_end && buf.remaining() > 0 {
            if let Some(ended) = self.ended.take() {
                let _ = ended.send(());
            }
        }
        poll
    }
}
