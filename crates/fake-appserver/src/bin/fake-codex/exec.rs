//! `fake-codex exec --experimental-json [OPTIONS] [resume <ID>] [PROMPT]`: the fake behind
//! `codex exec`'s JSONL interface, as codex builds it: an app-server of its own (the fake,
//! in-process), driven through `initialize`, `thread/start` or `thread/resume`, and one
//! `turn/start`, its notifications printed as exec's events (`tests/exec_parity.rs` compares
//! them with the real codex's):
//!
//! - `{"type":"thread.started","thread_id"}`, `{"type":"turn.started"}`, `item.completed`
//!   with an `agent_message` item (ids `item_0`, `item_1`, ...; a `warning` is an `error`
//!   item, as codex reports non-fatal problems), then `{"type":"turn.completed","usage"}`, or
//!   `{"type":"turn.failed","error":{"message"}}` and exit 1.
//! - The prompt: the `PROMPT` argument, with a piped stdin appended as a `<stdin>` block; or
//!   stdin alone (`-` or no argument; "Reading prompt from stdin..." on stderr). An empty one
//!   is `No prompt provided via stdin.` and exit 1.
//! - `resume <id>` of a thread the home lacks: on stderr `Error: thread/resume: thread/resume
//!   failed: <message> (code <code>)` and exit 1, codex's words; an id that is not a UUID starts
//!   a new thread (codex looks it up as a thread name). `-c developer_instructions=<TOML>`
//!   gives a new thread its developer instructions, `--cd` its working directory, `--model`
//!   its model.
//! - Only JSONL output (`--experimental-json` or `--json`); options codex does not know are
//!   refused as its parser does (exit 2); `--last`, `fork` and `review` are not served (exit 2).

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use rethread_fake_appserver::FakeBuilder;
use rethread_protocol::exec::ExecArgs;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::Failure;

/// The options of `codex exec` (0.171.0) and of its `resume`, by long name or short letter.
const KNOWN_OPTIONS: [&str; 37] = [
    "config",
    "enable",
    "disable",
    "remote",
    "remote-auth-token-env",
    "strict-config",
    "image",
    "model",
    "oss",
    "local-provider",
    "profile",
    "sandbox",
    "approve-for-me",
    "dangerously-bypass-approvals-and-sandbox",
    "dangerously-bypass-hook-trust",
    "cd",
    "worktree",
    "add-dir",
    "thread-source",
    "cyber-access-program",
    "skip-git-repo-check",
    "trust",
    "ephemeral",
    "ignore-user-config",
    "ignore-rules",
    "output-schema",
    "color",
    "json",
    "experimental-json",
    "output-last-message",
    "last",
    "all",
    "help",
    "version",
    "h",
    "V",
    "full-auto",
];

const USAGE: &str = "Usage: fake-codex exec --experimental-json [OPTIONS] [resume <ID>] [PROMPT]";

/// Runs `exec` with `args` (those after `exec`) on a fake built by `builder`; returns the
/// exit code.
pub(crate) fn run(args: Vec<String>, builder: FakeBuilder) -> Result<u8, Failure> {
    let run = ExecArgs::parse(args);
    if run.has_flag("help") || run.has_flag("h") {
        println!("{USAGE}");
        return Ok(0);
    }
    if let Some(unknown) = run
        .option_names()
        .find(|n| !KNOWN_OPTIONS.contains(&n.as_str()))
    {
        let shown = if unknown.len() == 1 {
            format!("-{unknown}")
        } else {
            format!("--{unknown}")
        };
        return Err(Failure::Usage(format!(
            "error: unexpected argument '{shown}' found"
        )));
    }
    if !(run.has_flag("experimental-json") || run.has_flag("json")) {
        return Err(Failure::Usage(
            "exec prints JSONL only: pass --experimental-json or --json".into(),
        ));
    }
    match run.subcommand() {
        None | Some("resume") if !run.has_flag("last") => {}
        _ => {
            return Err(Failure::Usage(
                "exec serves a new thread or `resume <ID>` only".into(),
            ))
        }
    }
    let Some(prompt) = prompt(&run)? else {
        eprintln!("No prompt provided via stdin.");
        return Ok(1);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let code = runtime.block_on(drive(&run, prompt, builder))?;
    runtime.shutdown_background();
    Ok(code)
}

/// The prompt, as codex composes it; `None` when it is empty.
fn prompt(run: &ExecArgs) -> Result<Option<String>, Failure> {
    let read_stdin = || {
        let mut bytes = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read stdin: {e}"))?;
        String::from_utf8(bytes).map_err(|_| Failure::Failed("stdin is not UTF-8".into()))
    };
    let prompt = match run.prompt().map(|p| p.to_string_lossy().into_owned()) {
        Some(given) if given != "-" => {
            let piped = if std::io::stdin().is_terminal() {
                String::new()
            } else {
                read_stdin()?
            };
            let piped = piped.trim_end();
            if piped.is_empty() {
                given
            } else {
                format!("{given}\n\n<stdin>\n{piped}\n</stdin>")
            }
        }
        _ => {
            eprintln!("Reading prompt from stdin...");
            read_stdin()?
        }
    };
    Ok((!prompt.trim().is_empty()).then_some(prompt))
}

/// The fake's app-server, in-process, as a line client.
struct Client {
    lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    next_id: i64,
    /// Notifications read while waiting for an answer.
    queued: std::collections::VecDeque<Value>,
}

impl Client {
    async fn send(&mut self, message: Value) -> Result<(), Failure> {
        let mut line = message.to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .await
            .map_err(|e| Failure::Failed(format!("the fake app-server closed: {e}")))
    }

    async fn next(&mut self) -> Result<Option<Value>, Failure> {
        if let Some(queued) = self.queued.pop_front() {
            return Ok(Some(queued));
        }
        loop {
            let line = self
                .lines
                .next_line()
                .await
                .map_err(|e| format!("reading the fake app-server: {e}"))?;
            let Some(line) = line else { return Ok(None) };
            let Ok(message) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if message.get("method").is_some() && message.get("id").is_some() {
                // A server request (an approval): declined, as an unattended run would.
                let answer = json!({"id": message["id"], "result": {"decision": "decline"}});
                self.send(answer).await?;
                continue;
            }
            return Ok(Some(message));
        }
    }

    /// Sends a request and waits for its answer: `Ok(result)` or `Err((code, message))`.
    async fn request(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<Result<Value, (i64, String)>, Failure> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"id": id, "method": method, "params": params}))
            .await?;
        let mut early = Vec::new();
        let answer = loop {
            let Some(message) = self.next().await? else {
                return Err(Failure::Failed(format!(
                    "the fake app-server closed before answering {method}"
                )));
            };
            if message.get("id") == Some(&json!(id)) {
                break message;
            }
            early.push(message);
        };
        self.queued.extend(early);
        Ok(match answer.get("error") {
            Some(error) => Err((
                error["code"].as_i64().unwrap_or(-32603),
                error["message"].as_str().unwrap_or_default().to_string(),
            )),
            None => Ok(answer["result"].clone()),
        })
    }
}

/// Prints one exec event on stdout, flushed (a reader sees each line as it comes).
fn emit(event: Value) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{event}")
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::Failed(format!("cannot write to stdout: {e}")))
}

async fn drive(run: &ExecArgs, prompt: String, builder: FakeBuilder) -> Result<u8, Failure> {
    let (stream, _fake) = builder
        .spawn_in_process()
        .map_err(|e| format!("cannot start the fake app-server: {e}"))?;
    let (reader, writer) = tokio::io::split(stream);
    let mut client = Client {
        lines: BufReader::new(reader).lines(),
        writer,
        next_id: 0,
        queued: Default::default(),
    };
    let init = json!({"clientInfo": {"name": "codex_exec", "version": env!("CARGO_PKG_VERSION")}});
    if let Err((code, message)) = client.request("initialize", init).await? {
        eprintln!("Error: initialize failed: {message} (code {code})");
        return Ok(1);
    }
    client.send(json!({"method": "initialized"})).await?;
    // The fake does not fork: a `fork` starts a new thread.
    let resume = (run.thread_id())
        .filter(|id| run.subcommand() == Some("resume") && uuid::Uuid::parse_str(id).is_ok());
    let opened = match resume {
        Some(id) => {
            client
                .request("thread/resume", json!({"threadId": id}))
                .await?
        }
        None => client.request("thread/start", start_params(run)).await?,
    };
    let method = if resume.is_some() {
        "thread/resume"
    } else {
        "thread/start"
    };
    let thread_id = match opened {
        Ok(result) => result["thread"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        Err((code, message)) => {
            eprintln!("Error: {method}: {method} failed: {message} (code {code})");
            return Ok(1);
        }
    };
    emit(json!({"type": "thread.started", "thread_id": thread_id}))?;
    let mut input = vec![json!({"type": "text", "text": prompt})];
    input.extend(
        run.option_values("image")
            .map(|path| json!({"type": "localImage", "path": path})),
    );
    let turn = client
        .request("turn/start", json!({"threadId": thread_id, "input": input}))
        .await?;
    if let Err((code, message)) = turn {
        eprintln!("Error: turn/start: turn/start failed: {message} (code {code})");
        return Ok(1);
    }
    let mut items = 0u64;
    let mut item_id = || {
        items += 1;
        format!("item_{}", items - 1)
    };
    let mut usage = json!({"input_tokens": 0, "cached_input_tokens": 0,
                           "cache_write_input_tokens": 0, "output_tokens": 0,
                           "reasoning_output_tokens": 0});
    while let Some(message) = client.next().await? {
        let params = &message["params"];
        let ours = params["threadId"].as_str() == Some(thread_id.as_str());
        match message["method"].as_str() {
            Some("warning") => emit(json!({"type": "item.completed", "item": {
                "id": item_id(), "type": "error", "message": params["message"]}}))?,
            Some("turn/started") if ours => emit(json!({"type": "turn.started"}))?,
            Some("item/completed") if ours && params["item"]["type"] == "agentMessage" => {
                emit(json!({"type": "item.completed", "item": {
                    "id": item_id(), "type": "agent_message", "text": params["item"]["text"]}}))?
            }
            Some("thread/tokenUsage/updated") if ours => {
                let total = &params["tokenUsage"]["total"];
                usage["input_tokens"] = total["inputTokens"].clone();
                usage["cached_input_tokens"] = total["cachedInputTokens"].clone();
                usage["output_tokens"] = total["outputTokens"].clone();
                usage["reasoning_output_tokens"] = total["reasoningOutputTokens"].clone();
            }
            Some("turn/completed") if ours => {
                let turn = &params["turn"];
                return match turn["status"].as_str() {
                    Some("completed") => {
                        emit(json!({"type": "turn.completed", "usage": usage}))?;
                        Ok(0)
                    }
                    Some("failed") => {
                        let message = turn["error"]["message"].as_str().unwrap_or("turn failed");
                        emit(json!({"type": "turn.failed", "error": {"message": message}}))?;
                        Ok(1)
                    }
                    _ => Ok(1),
                };
            }
            _ => {}
        }
    }
    eprintln!("Error: the app-server closed before the turn completed");
    Ok(1)
}

/// `thread/start` params from the run's options.
fn start_params(run: &ExecArgs) -> Value {
    let cwd = run
        .option_values("cd")
        .last()
        .map(PathBuf::from)
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_default();
    let mut params = json!({"cwd": cwd});
    if let Some(model) = run.option_values("model").last() {
        params["model"] = json!(model);
    }
    if let Some(text) = run.config("developer_instructions") {
        params["developerInstructions"] = json!(text);
    }
    params
}
