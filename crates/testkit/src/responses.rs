//! A local stand-in for the OpenAI Responses API, so the **real** `codex app-server` can run
//! turns offline (`docs/design.md`, "Real turns offline").
//!
//! It listens on `127.0.0.1` on an ephemeral port, speaks plain HTTP/1.1 with keep-alive, and
//! answers:
//! - `POST /v1/responses` with `text/event-stream` and the three events codex needs
//!   (`response.created`, `response.output_item.done` carrying an assistant message,
//!   `response.completed`);
//! - `GET /v1/models` with `{"models":[]}`;
//! - anything else with `404`.
//!
//! Every request is recorded (method, path, headers, body), so a test can read the
//! conversation the model saw on each turn ([`RecordedRequest::conversation`]). The reply text
//! is deterministic and scriptable ([`Reply`]).
//!
//! The server runs on its own thread with its own single-threaded tokio runtime, so it works
//! from sync tests and from any runtime flavour; dropping the [`ResponsesStandIn`] stops it.
//!
//! ```no_run
//! use rethread_testkit::responses::{Reply, ResponsesStandIn};
//! let server = ResponsesStandIn::start().unwrap();
//! server.set_reply(Reply::Fixed("hello".into()));
//! let config = server.codex_config_toml();
//! assert!(config.contains(&server.base_url()));
//! ```

use rethread_store::Unpoisoned;
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};

pub use rethread_fake_appserver::model::{echo_reply, ConversationMessage, Reply};

/// The largest request head (request line plus headers) the stand-in accepts.
const MAX_HEAD: usize = 64 * 1024;
/// The largest request body the stand-in accepts (codex sends ~40 KB per turn).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// One HTTP request the stand-in received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The request target, e.g. `/v1/responses`.
    pub path: String,
    /// Header names (lower-cased) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl RecordedRequest {
    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// True for a model request (`POST .../responses`).
    pub fn is_model_request(&self) -> bool {
        self.method == "POST" && self.path.ends_with("/responses")
    }

    /// The conversation the model saw: the `input` array's messages with their text.
    pub fn conversation(&self) -> Vec<ConversationMessage> {
        self.json()
            .map(|body| conversation_of(&body))
            .unwrap_or_default()
    }

    /// The value of a header (name compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Extracts the messages of a Responses-API request body's `input` array.
pub fn conversation_of(body: &Value) -> Vec<ConversationMessage> {
    let Some(items) = body.get("input").and_then(Value::as_array) else {
        return Vec::new();
    };
    items
        .iter()
        .filter(|item| {
            item.get("type")
                .and_then(Value::as_str)
                .unwrap_or("message")
                == "message"
        })
        .filter_map(|item| {
            let role = item.get("role")?.as_str()?.to_string();
            let text = match item.get("content")? {
                Value::String(text) => text.clone(),
                Value::Array(parts) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => return None,
            };
            Some(ConversationMessage { role, text })
        })
        .collect()
}

#[derive(Debug)]
struct Shared {
    requests: Mutex<Vec<RecordedRequest>>,
    reply: Mutex<Reply>,
    tool_calls: Mutex<VecDeque<String>>,
    /// HTTP errors the next model requests get, in order (`push_error`).
    errors: Mutex<VecDeque<(u16, Value)>>,
    delay: Mutex<Duration>,
    stream_deltas: std::sync::atomic::AtomicBool,
    arrived: Notify,
}

/// A running Responses-API stand-in. Dropping it stops the server.
#[derive(Debug)]
pub struct ResponsesStandIn {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ResponsesStandIn {
    /// Binds `127.0.0.1:0` and starts serving on a dedicated thread.
    pub fn start() -> io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            reply: Mutex::new(Reply::Echo),
            tool_calls: Mutex::new(VecDeque::new()),
            errors: Mutex::new(VecDeque::new()),
            delay: Mutex::new(Duration::ZERO),
            stream_deltas: std::sync::atomic::AtomicBool::new(false),
            arrived: Notify::new(),
        });
        let (stop_tx, stop_rx) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let served = shared.clone();
        let thread = std::thread::Builder::new()
            .name("responses-stand-in".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = accept_loop(listener, served) => {}
                        _ = stop_rx => {}
                    }
                });
            })?;
        Ok(ResponsesStandIn {
            addr,
            shared,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The socket address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The provider base URL, `http://127.0.0.1:<port>/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The offline `config.toml` for a `CODEX_HOME` whose model is this stand-in.
    pub fn codex_config_toml(&self) -> String {
        offline_config_toml(&self.base_url())
    }

    /// Replaces what the model answers from now on.
    pub fn set_reply(&self, reply: Reply) {
        *self.shared.reply.lock().unpoisoned() = reply;
    }

    /// Makes the next model reply a call of codex's `exec_command` tool for `cmd` with
    /// `sandbox_permissions: "require_escalated"`, so that codex (with
    /// `approval_policy = "on-request"`) asks the client to approve it
    /// (`item/commandExecution/requestApproval`). The reply after that is a normal one.
    pub fn push_escalated_command(&self, cmd: &str) {
        self.shared
            .tool_calls
            .lock()
            .unpoisoned()
            .push_back(cmd.to_string());
    }

    /// Makes the next model request fail with HTTP `status` and the JSON `body` (the reply
    /// after that is a normal one); see [`invalid_encrypted_content`] for the refusal a home
    /// of another account gets.
    pub fn push_error(&self, status: u16, body: Value) {
        self.shared
            .errors
            .lock()
            .unpoisoned()
            .push_back((status, body));
    }

    /// Makes the model stream its text as a real one does: the message item is announced
    /// (`response.output_item.added`) and its text sent in two `response.output_text.delta`
    /// events before the item is done, so codex sends `item/agentMessage/delta`
    /// notifications. Off by default (the three events of the wire notes).
    pub fn set_stream_deltas(&self, on: bool) {
        self.shared
            .stream_deltas
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Makes every model reply wait this long (a slow model, so a turn can be interrupted).
    pub fn set_delay(&self, delay: Duration) {
        *self.shared.delay.lock().unpoisoned() = delay;
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests.lock().unpoisoned().clone()
    }

    /// The model requests (`POST /v1/responses`) received so far.
    pub fn model_requests(&self) -> Vec<RecordedRequest> {
        self.shared
            .requests
            .lock()
            .unpoisoned()
            .iter()
            .filter(|r| r.is_model_request())
            .cloned()
            .collect()
    }

    /// Waits until at least `n` model requests have arrived, or the timeout passes; returns
    /// how many there are.
    pub async fn wait_for_model_requests(&self, n: usize, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.arrived.notified();
            let count = self.model_requests().len();
            if count >= n || tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.model_requests().len();
            }
        }
    }
}

impl Drop for ResponsesStandIn {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The offline `config.toml` that points codex at a Responses-API stand-in at `base_url`.
pub fn offline_config_toml(base_url: &str) -> String {
    format!(
        "model = \"mock-model\"\n\
         model_provider = \"mock\"\n\
         approval_policy = \"never\"\n\
         sandbox_mode = \"read-only\"\n\
         [model_providers.mock]\n\
         name = \"mock\"\n\
         base_url = \"{base_url}\"\n\
         wire_api = \"responses\"\n\
         request_max_retries = 0\n\
         stream_max_retries = 0\n\
         supports_websockets = false\n"
    )
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            // A broken connection only ends that connection.
            let _ = serve_connection(stream, shared).await;
        });
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut buffer = Vec::new();
    loop {
        let Some(request) = read_request(&mut reader, &mut buffer).await? else {
            return Ok(());
        };
        let close = request
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let response = respond(&request, &shared);
        let slow = request.is_model_request();
        shared.requests.lock().unpoisoned().push(request);
        shared.arrived.notify_waiters();
        let delay = *shared.delay.lock().unpoisoned();
        if slow && !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        write.write_all(&response).await?;
        write.flush().await?;
        if close {
            return Ok(());
        }
    }
}

fn respond(request: &RecordedRequest, shared: &Shared) -> Vec<u8> {
    let path = request.path.split('?').next().unwrap_or_default();
    if request.method == "POST" && path.ends_with("/responses") {
        if let Some((status, body)) = shared.errors.lock().unpoisoned().pop_front() {
            let status = format!("{status} {}", reason_phrase(status));
            return http_response(&status, "application/json", body.to_string().as_bytes());
        }
        let tool_call = shared.tool_calls.lock().unpoisoned().pop_front();
        let body = match tool_call {
            Some(cmd) => sse_events(json!({
                "type": "function_call", "id": "fc1", "call_id": "call1", "name": "exec_command",
                "arguments": json!({"cmd": cmd, "sandbox_permissions": "require_escalated",
                                    "justification": "rethread test approval"}).to_string(),
            })),
            None => {
                let text = shared
                    .reply
                    .lock()
                    .unpoisoned()
                    .next_reply(&request.conversation());
                if shared
                    .stream_deltas
                    .load(std::sync::atomic::Ordering::Relaxed)
                {
                    sse_streamed_body(&text)
                } else {
                    sse_body(&text)
                }
            }
        };
        http_response("200 OK", "text/event-stream", &body)
    } else if request.method == "GET" && path.ends_with("/models") {
        http_response("200 OK", "application/json", br#"{"models":[]}"#)
    } else {
        http_response(
            "404 Not Found",
            "application/json",
            br#"{"error":"not found"}"#,
        )
    }
}

/// The HTTP 400 body the Responses API answers a request whose input carries encrypted
/// reasoning another account or organisation made (openai/codex #13724): push it with
/// [`ResponsesStandIn::push_error`] (`400`).
pub fn invalid_encrypted_content() -> Value {
    json!({"error": {
        "message": "The encrypted content gAAA...Zg== could not be verified.",
        "type": "invalid_request_error",
        "param": null,
        "code": "invalid_encrypted_content",
    }})
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        _ => "Error",
    }
}

/// The three server-sent events of one model reply carrying `text`.
pub fn sse_body(text: &str) -> Vec<u8> {
    sse_events(json!({"type": "message", "role": "assistant", "id": "m1",
                      "content": [{"type": "output_text", "text": text}]}))
}

/// The server-sent events of one model reply carrying `text` streamed in two deltas (split
/// on a character boundary), as a real model streams it.
pub fn sse_streamed_body(text: &str) -> Vec<u8> {
    let [first, second] = rethread_fake_appserver::model::stream_pieces(text);
    let done = json!({"type": "message", "role": "assistant", "id": "m1",
                      "content": [{"type": "output_text", "text": text}]});
    let mut events = vec![
        (
            "response.created",
            json!({"type": "response.created", "response": {"id": "r1"}}),
        ),
        (
            "response.output_item.added",
            json!({"type": "response.output_item.added", "output_index": 0,
                   "item": {"type": "message", "role": "assistant", "id": "m1", "content": []}}),
        ),
    ];
    for piece in [first, second] {
        events.push((
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "item_id": "m1", "output_index": 0,
                   "content_index": 0, "delta": piece}),
        ));
    }
    events.push((
        "response.output_item.done",
        json!({"type": "response.output_item.done", "item": done}),
    ));
    events.push(completed_event());
    render_sse(&events)
}

fn completed_event() -> (&'static str, Value) {
    (
        "response.completed",
        json!({"type": "response.completed", "response": {"id": "r1", "usage": {
            "input_tokens": 1, "input_tokens_details": null, "output_tokens": 1,
            "output_tokens_details": null, "total_tokens": 2}}}),
    )
}

fn render_sse(events: &[(&str, Value)]) -> Vec<u8> {
    let mut body = String::new();
    for (kind, data) in events {
        body.push_str(&format!("event: {kind}\ndata: {data}\n\n"));
    }
    body.into_bytes()
}

/// The three server-sent events of one model reply whose output is `item`.
fn sse_events(item: Value) -> Vec<u8> {
    render_sse(&[
        (
            "response.created",
            json!({"type": "response.created", "response": {"id": "r1"}}),
        ),
        (
            "response.output_item.done",
            json!({"type": "response.output_item.done", "item": item}),
        ),
        completed_event(),
    ])
}

fn http_response(status: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\
         cache-control: no-cache\r\nconnection: keep-alive\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// Reads one request; `Ok(None)` when the peer closed the connection between requests.
async fn read_request<R: AsyncReadExt + Unpin>(
    reader: &mut R,
    buffer: &mut Vec<u8>,
) -> io::Result<Option<RecordedRequest>> {
    let head_end = loop {
        if let Some(pos) = find(buffer, b"\r\n\r\n") {
            break pos;
        }
        if buffer.len() > MAX_HEAD {
            return Err(invalid("request head too large"));
        }
        if fill(reader, buffer).await? == 0 {
            return if buffer.is_empty() {
                Ok(None)
            } else {
                Err(invalid("truncated head"))
            };
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    buffer.drain(..head_end + 4);
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_ascii_lowercase(), value.trim().to_string()))
        })
        .collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let chunked =
        header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        read_chunked(reader, buffer).await?
    } else {
        let length: usize = match header("content-length") {
            Some(v) => v.parse().map_err(|_| invalid("bad content-length"))?,
            None => 0,
        };
        if length > MAX_BODY {
            return Err(invalid("body too large"));
        }
        while buffer.len() < length {
            if fill(reader, buffer).await? == 0 {
                return Err(invalid("truncated body"));
            }
        }
        buffer.drain(..length).collect()
    };
    Ok(Some(RecordedRequest {
        method,
        path,
        headers,
        body,
    }))
}

async fn read_chunked<R: AsyncReadExt + Unpin>(
    reader: &mut R,
    buffer: &mut Vec<u8>,
) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line(reader, buffer).await?;
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| invalid("bad chunk size"))?;
        if size == 0 {
            // Trailers, then the empty line that ends the body.
            while !read_line(reader, buffer).await?.is_empty() {}
            return Ok(body);
        }
        if body.len() + size > MAX_BODY {
            return Err(invalid("body too large"));
        }
        while buffer.len() < size + 2 {
            if fill(reader, buffer).await? == 0 {
                return Err(invalid("truncated chunk"));
            }
        }
        body.extend_from_slice(&buffer[..size]);
        buffer.drain(..size + 2);
    }
}

async fn read_line<R: AsyncReadExt + Unpin>(
    reader: &mut R,
    buffer: &mut Vec<u8>,
) -> io::Result<String> {
    loop {
        if let Some(pos) = find(buffer, b"\r\n") {
            let line = String::from_utf8_lossy(&buffer[..pos]).into_owned();
            buffer.drain(..pos + 2);
            return Ok(line);
        }
        if buffer.len() > MAX_HEAD {
            return Err(invalid("line too long"));
        }
        if fill(reader, buffer).await? == 0 {
            return Err(invalid("truncated line"));
        }
    }
}

async fn fill<R: AsyncReadExt + Unpin>(reader: &mut R, buffer: &mut Vec<u8>) -> io::Result<usize> {
    let mut chunk = [0u8; 16 * 1024];
    let n = reader.read(&mut chunk).await?;
    buffer.extend_from_slice(&chunk[..n]);
    Ok(n)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn roundtrip(stream: &mut std::net::TcpStream, request: &[u8]) -> String {
        stream.write_all(request).unwrap();
        let mut response = Vec::new();
        let mut byte = [0u8; 4096];
        // Read until the full content-length body arrived.
        loop {
            let n = stream.read(&mut byte).unwrap();
            assert!(n > 0, "connection closed early");
            response.extend_from_slice(&byte[..n]);
            let text = String::from_utf8_lossy(&response).into_owned();
            if let Some(head_end) = text.find("\r\n\r\n") {
                let length: usize = text[..head_end]
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .unwrap()
                    .parse()
                    .unwrap();
                if response.len() >= head_end + 4 + length {
                    return text;
                }
            }
        }
    }

    #[test]
    fn serves_models_and_sse_over_keep_alive_with_chunked_and_sized_bodies() {
        let server = ResponsesStandIn::start().unwrap();
        let mut stream = std::net::TcpStream::connect(server.addr()).unwrap();
        let models = roundtrip(&mut stream, b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n");
        assert!(models.ends_with(r#"{"models":[]}"#), "{models}");

        let body = r#"{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"zebra"}]}]}"#;
        let sized = format!(
            "POST /v1/responses HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let reply = roundtrip(&mut stream, sized.as_bytes());
        assert!(reply.contains("content-type: text/event-stream"));
        assert!(reply.contains("event: response.created\ndata: "));
        assert!(reply.contains(r#""text":"echo: zebra""#), "{reply}");

        server.set_reply(Reply::Fixed("fixed!".into()));
        let (a, b) = body.split_at(10);
        let chunked = format!(
            "POST /v1/responses HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x};ext=1\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        );
        let reply = roundtrip(&mut stream, chunked.as_bytes());
        assert!(reply.contains(r#""text":"fixed!""#), "{reply}");

        let requests = server.model_requests();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[1].body, body.as_bytes());
        assert_eq!(
            requests[0].conversation(),
            vec![ConversationMessage {
                role: "user".into(),
                text: "zebra".into()
            }]
        );
        assert_eq!(server.requests().len(), 3);
    }
}
