//! One server "process": a select loop over input lines, an outgoing queue and the turn tasks
//! it spawned; request-level faults; dispatch by method; `initialize`.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use rethread_protocol::{ErrorCode, Message, NdjsonCodec, RequestId};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::codec::FramedRead;

use super::params::{field_str, invalid, Answer, Failure, Handled};
use super::{list, lock, threads, turns, Ended, LoggedRequest, Shared};
use crate::faults::{Fault, OVERLOADED_MESSAGE};
use crate::profile::Profile;
use crate::store::{Store, ThreadMeta, TurnRecord};
use crate::util::now_ms;

/// The methods the fake serves, in the order its "unknown variant" error lists them.
const METHODS: [&str; 8] = [
    "initialize",
    "thread/start",
    "thread/resume",
    "thread/read",
    "thread/turns/list",
    "thread/list",
    "turn/start",
    "turn/interrupt",
];

#[derive(Debug)]
enum Out {
    Line(String),
    Exit,
}

/// Sends lines to the writer.
#[derive(Debug, Clone)]
pub(super) struct Emitter {
    out: mpsc::UnboundedSender<Out>,
    timestamps: bool,
}

impl Emitter {
    pub(super) fn line(&self, line: String) {
        let _ = self.out.send(Out::Line(line));
    }

    pub(super) fn notify(&self, method: &str, params: Value) {
        let mut message = Map::new();
        message.insert("method".into(), json!(method));
        message.insert("params".into(), params);
        if self.timestamps {
            message.insert("emittedAtMs".into(), json!(now_ms()));
        }
        self.line(Value::Object(message).to_string());
    }

    pub(super) fn respond(&self, id: &Value, outcome: Result<Value, Failure>) {
        let line = match outcome {
            Ok(result) => json!({"id": id, "result": result}),
            Err((code, message)) => json!({"id": id, "error": {"code": code, "message": message}}),
        };
        self.line(line.to_string());
    }

    pub(super) fn exit(&self) {
        let _ = self.out.send(Out::Exit);
    }
}

#[derive(Debug)]
pub(super) struct Loaded {
    pub(super) meta: ThreadMeta,
    pub(super) turns: Vec<TurnRecord>,
    pub(super) materialized: bool,
    pub(super) _writer_lock: Option<File>,
    pub(super) active: Option<ActiveTurn>,
    /// The last turn interrupted in this process, until another turn starts (0.144.6 keeps
    /// treating it as active).
    pub(super) interrupted: Option<String>,
}

#[derive(Debug)]
pub(super) struct ActiveTurn {
    pub(super) interrupt: Option<oneshot::Sender<()>>,
}

#[derive(Debug)]
pub(super) struct Proc {
    pub(super) shared: Arc<Shared>,
    pub(super) profile: Profile,
    pub(super) store: Store,
    pub(super) initialized: bool,
    pub(super) experimental: bool,
    pub(super) threads: HashMap<String, Loaded>,
    pub(super) pending: HashMap<String, oneshot::Sender<Value>>,
    pub(super) next_server_request: i64,
}

pub(super) type ProcRef = Arc<Mutex<Proc>>;

/// Releases the process's threads (and their writer locks) however the process ends,
/// including an abort.
struct ReleaseOnDrop(ProcRef);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let mut proc = lock(&self.0);
        proc.threads.clear();
        proc.pending.clear();
    }
}

pub(super) async fn run_process<R, W>(
    shared: Arc<Shared>,
    reader: R,
    writer: W,
) -> io::Result<Ended>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let profile = *lock(&shared.profile);
    let store = Store::open(&shared.home)?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let emitter = Emitter {
        out: tx,
        timestamps: profile.emits_timestamps(),
    };
    let proc = Arc::new(Mutex::new(Proc {
        shared,
        profile,
        store,
        initialized: false,
        experimental: false,
        threads: HashMap::new(),
        pending: HashMap::new(),
        next_server_request: 0,
    }));
    let _release = ReleaseOnDrop(proc.clone());
    let mut tasks = JoinSet::new();
    let mut input = FramedRead::new(reader, NdjsonCodec::new());
    let mut output = BufWriter::with_capacity(64 * 1024, writer);
    loop {
        tokio::select! {
            biased;
            out = rx.recv() => {
                let mut next = out;
                // Drain what is queued, then flush once.
                loop {
                    match next {
                        Some(Out::Line(line)) => {
                            output.write_all(line.as_bytes()).await?;
                            output.write_all(b"\n").await?;
                        }
                        Some(Out::Exit) | None => {
                            output.flush().await?;
                            return Ok(Ended::Fault);
                        }
                    }
                    match rx.try_recv() {
                        Ok(more) => next = Some(more),
                        Err(_) => break,
                    }
                }
                output.flush().await?;
            }
            frame = input.next() => match frame {
                // End of input: codex exits when its stdin closes.
                None => {
                    while let Ok(Out::Line(line)) = rx.try_recv() {
                        output.write_all(line.as_bytes()).await?;
                        output.write_all(b"\n").await?;
                    }
                    output.flush().await?;
                    return Ok(Ended::InputClosed);
                }
                Some(Err(e)) => return Err(e),
                // Codex ignores lines it cannot read; so does the fake.
                Some(Ok(Err(_))) => {}
                Some(Ok(Ok(message))) => handle_message(&proc, &emitter, &mut tasks, message),
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

fn handle_message(proc: &ProcRef, emitter: &Emitter, tasks: &mut JoinSet<()>, message: Message) {
    match message {
        Message::Request(request) => {
            let id = serde_json::to_value(&request.id).unwrap_or(Value::Null);
            handle_request(
                proc,
                emitter,
                tasks,
                id,
                request.id,
                request.method,
                request.params,
            );
        }
        Message::Response(response) => {
            let key = response.id.to_string();
            if let Some(waiter) = lock(proc).pending.remove(&key) {
                let _ = waiter.send(response.result);
            }
        }
        Message::Error(error) => {
            if let Some(id) = error.id {
                if let Some(waiter) = lock(proc).pending.remove(&id.to_string()) {
                    let _ = waiter.send(json!({"error": error.error.message}));
                }
            }
        }
        // `initialized` and any other client notification need no answer.
        Message::Notification(_) => {}
    }
}

fn handle_request(
    proc: &ProcRef,
    emitter: &Emitter,
    tasks: &mut JoinSet<()>,
    id: Value,
    request_id: RequestId,
    method: String,
    params: Option<Value>,
) {
    let shared = lock(proc).shared.clone();
    shared.log_event(&format!("request {method}"));
    let number = {
        let mut counters = lock(&shared.counters);
        counters.requests += 1;
        counters.requests
    };
    lock(&shared.requests).push(LoggedRequest {
        id: request_id,
        method: method.clone(),
        params: params.clone(),
    });
    let faults = lock(&shared.faults).faults.clone();
    if faults
        .iter()
        .any(|f| matches!(f, Fault::ExitAtRequest { n } if *n == number))
    {
        emitter.exit();
        return;
    }
    if !METHODS.contains(&method.as_str()) {
        let expected = METHODS
            .iter()
            .map(|m| format!("`{m}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let message =
            format!("Invalid request: unknown variant `{method}`, expected one of {expected}");
        emitter.respond(&id, Err((ErrorCode::INVALID_REQUEST, message)));
        return;
    }
    let initialized = lock(proc).initialized;
    if method != "initialize" && !initialized {
        emitter.respond(
            &id,
            Err((ErrorCode::INVALID_REQUEST, "Not initialized".into())),
        );
        return;
    }
    for fault in &faults {
        match fault {
            Fault::GarbageLine { at_request } if *at_request == number => {
                emitter.line("this line is not json {".into());
            }
            Fault::OversizedLine { at_request, bytes } if *at_request == number => {
                let padding = "x".repeat(*bytes);
                emitter.notify("warning", json!({"threadId": null, "message": padding}));
            }
            _ => {}
        }
    }
    let answer_id = if faults
        .iter()
        .any(|f| matches!(f, Fault::WrongId { at_request } if *at_request == number))
    {
        match &id {
            Value::Number(n) => json!(n.as_i64().unwrap_or(0).wrapping_add(1000)),
            Value::String(s) => json!(format!("{s}-wrong")),
            other => other.clone(),
        }
    } else {
        id
    };
    for (index, fault) in faults.iter().enumerate() {
        if let Fault::Overloaded {
            method: only,
            attempts,
        } = fault
        {
            if only.as_deref().is_none_or(|m| m == method) {
                let mut counters = lock(&shared.counters);
                let used = counters.overloaded.entry(index).or_insert(0);
                if *used < *attempts {
                    *used += 1;
                    emitter.respond(
                        &answer_id,
                        Err((ErrorCode::OVERLOADED, OVERLOADED_MESSAGE.into())),
                    );
                    return;
                }
            }
        }
    }
    let delay: u64 = faults
        .iter()
        .filter_map(|f| match f {
            Fault::Delay {
                method: only,
                millis,
            } if only.as_deref().is_none_or(|m| m == method) => Some(*millis),
            _ => None,
        })
        .sum();
    if delay > 0 {
        let proc = proc.clone();
        let emitter = emitter.clone();
        tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let mut tasks = JoinSet::new();
            dispatch(
                &proc, &emitter, &mut tasks, &answer_id, &method, params, &faults,
            );
            // A turn started after a delay runs to its end within this task.
            while tasks.join_next().await.is_some() {}
        });
        return;
    }
    dispatch(proc, emitter, tasks, &answer_id, &method, params, &faults);
}

fn dispatch(
    proc: &ProcRef,
    emitter: &Emitter,
    tasks: &mut JoinSet<()>,
    id: &Value,
    method: &str,
    params: Option<Value>,
    faults: &[Fault],
) {
    let Some(mut params) = params else {
        emitter.respond(id, Err(invalid("missing field `params`")));
        return;
    };
    // codex reads a thread id as a UUID in any spelling, and writes it lower-case hyphenated.
    if let Some(thread) = params.get_mut("threadId") {
        if let Some(uuid) = thread
            .as_str()
            .and_then(|id| uuid::Uuid::parse_str(id).ok())
        {
            *thread = Value::String(uuid.to_string());
        }
    }
    let handled = match method {
        "initialize" => initialize(&mut lock(proc), &params),
        "thread/start" => threads::thread_start(&mut lock(proc), emitter, id, &params),
        "thread/resume" => threads::thread_resume(&mut lock(proc), emitter, id, &params, faults),
        "thread/read" => threads::thread_read(&mut lock(proc), emitter, &params),
        "thread/turns/list" => threads::thread_turns_list(&mut lock(proc), emitter, &params),
        "thread/list" => list::thread_list(&mut lock(proc), &params),
        "turn/start" => turns::turn_start(proc, emitter, tasks, id, &params, faults),
        "turn/interrupt" => turns::turn_interrupt(&mut lock(proc), &params),
        _ => Err((
            ErrorCode::METHOD_NOT_FOUND,
            format!("{method} is not served by the fake"),
        )),
    };
    match handled {
        Ok(Answer::Reply(result)) => emitter.respond(id, Ok(result)),
        Ok(Answer::Sent | Answer::Never) => {}
        Err(failure) => emitter.respond(id, Err(failure)),
    }
}

fn initialize(proc: &mut Proc, params: &Value) -> Handled {
    if proc.initialized {
        return Err((ErrorCode::INVALID_REQUEST, "Already initialized".into()));
    }
    let info = params
        .get("clientInfo")
        .ok_or_else(|| invalid("missing field `clientInfo`"))?;
    let name = field_str(info, "name")?;
    let version = field_str(info, "version")?;
    proc.experimental = params
        .pointer("/capabilities/experimentalApi")
        .and_then(Value::as_bool)
        == Some(true);
    proc.initialized = true;
    Ok(Answer::Reply(json!({
        "userAgent": format!("{name}/{} (rethread fake {}; {version})", proc.profile.cli_version(), proc.profile),
        "codexHome": proc.store.home(),
        "platformFamily": "unix",
        "platformOs": "linux",
    })))
}
