//! The protocol proven against the real codex:
//! - every message this crate can produce validates against the JSON Schema that each supported
//!   release (`rethread_testkit::SUPPORTED`: current, previous, floor) generates (`codex
//!   app-server generate-json-schema`), run at test time;
//! - every message each supported release sends during real turns (recorded at test time
//!   against the Responses-API stand-in) decodes, typed where this crate types it.

use std::path::Path;

use rethread_protocol::jsonrpc::{Request as RawRequest, Response};
use rethread_protocol::messages::*;
use rethread_protocol::{HistoryMode, Message, RpcError};
use rethread_testkit::real::{codex_or_skip, generate_json_schema, AppServerProcess, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::supported_releases;
use serde_json::{json, Value};

fn schema(dir: &Path, name: &str) -> jsonschema::Validator {
    let text = std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let schema: Value = serde_json::from_str(&text).unwrap();
    jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn assert_valid(validator: &jsonschema::Validator, value: &Value, what: &str) {
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what} does not validate: {errors:?}\n{value}"
    );
}

fn generate_schema(codex: &Path) -> tempfile::TempDir {
    generate_json_schema(codex).expect("generate-json-schema")
}

/// Every client request this crate can build, with fields set and unset.
fn client_requests() -> Vec<Message> {
    let id = |n: i64| n;
    let info = ClientInfo {
        name: "rethread".into(),
        version: "0.1.0".into(),
        title: Some("t".into()),
    };
    let mut out = vec![
        Message::request(
            id(1),
            Initialize::METHOD,
            &InitializeParams {
                client_info: info.clone(),
                capabilities: None,
            },
        ),
        Message::request(
            id(2),
            Initialize::METHOD,
            &InitializeParams {
                client_info: info,
                capabilities: Some(InitializeCapabilities {
                    experimental_api: true,
                }),
            },
        ),
        Message::request(id(3), ThreadStart::METHOD, &ThreadStartParams::default()),
        Message::request(
            id(4),
            ThreadStart::METHOD,
            &ThreadStartParams::default()
                .cwd("/tmp")
                .history_mode(HistoryMode::Paginated)
                .developer_instructions("seed")
                .model("mock-model")
                .setting("sandbox", serde_json::json!("read-only"))
                .setting("approvalPolicy", serde_json::json!("never")),
        ),
        Message::request(id(5), ThreadResume::METHOD, &ThreadResumeParams::new("t")),
        Message::request(
            id(6),
            ThreadResume::METHOD,
            &ThreadResumeParams::new("t")
                .exclude_turns(true)
                .setting("developerInstructions", serde_json::json!("x")),
        ),
        Message::request(
            id(7),
            ThreadRead::METHOD,
            &ThreadReadParams {
                thread_id: "t".into(),
                include_turns: true,
            },
        ),
        Message::request(id(8), ThreadList::METHOD, &ThreadListParams::default()),
        Message::request(
            id(9),
            ThreadList::METHOD,
            &ThreadListParams {
                cursor: Some("c".into()),
                limit: Some(5),
            },
        ),
        Message::request(id(10), TurnStart::METHOD, &{
            let mut turn = TurnStartParams::new("t", vec![UserInput::text("hi")]);
            turn.settings
                .insert("effort".into(), serde_json::json!("high"));
            turn
        }),
        Message::request(
            id(12),
            TurnStart::METHOD,
            &TurnStartParams::new(
                "t",
                vec![
                    UserInput::text("look"),
                    UserInput::local_image("/tmp/image.png"),
                    UserInput::image_url("https://example.invalid/image.png"),
                ],
            ),
        ),
        Message::request(
            id(11),
            TurnInterrupt::METHOD,
            &TurnInterruptParams {
                thread_id: "t".into(),
                turn_id: "u".into(),
            },
        ),
    ]
    .into_iter()
    .map(Result::unwrap)
    .collect::<Vec<_>>();
    out.push(
        Message::request(
            "string-id",
            ThreadRead::METHOD,
            &ThreadReadParams::default(),
        )
        .unwrap(),
    );
    out
}

/// `doctor`'s probe lists a thread's turns (`thread/turns/list`), a method 0.144.6 lists only
/// in its experimental schema (the probe's client declares `experimentalApi`).
#[test]
fn the_probe_request_validates_against_each_supported_experimental_schema() {
    for version in supported_releases() {
        let Some(codex) = codex_or_skip(&version) else {
            continue;
        };
        let dir = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(&codex)
            .args([
                "app-server",
                "generate-json-schema",
                "--experimental",
                "--out",
            ])
            .arg(dir.path())
            .env("CODEX_HOME", home.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "{version}: {status}");
        let requests = schema(dir.path(), "ClientRequest.json");
        let message = Message::request(
            1,
            ThreadTurnsList::METHOD,
            &ThreadTurnsListParams {
                thread_id: "t".into(),
                limit: Some(1),
            },
        )
        .unwrap();
        let value = serde_json::to_value(&message).unwrap();
        assert_valid(
            &requests,
            &value,
            &format!("{version}: {}", message.to_line()),
        );
    }
}

#[test]
fn every_message_we_produce_validates_against_each_supported_schema() {
    for version in supported_releases() {
        validate_against(&version);
    }
}

fn validate_against(version: &str) {
    let Some(codex) = codex_or_skip(version) else {
        return;
    };
    let dir = generate_schema(&codex);
    let requests = schema(dir.path(), "ClientRequest.json");
    for message in client_requests() {
        let value = serde_json::to_value(&message).unwrap();
        assert_valid(&requests, &value, &message.to_line());
    }
    let notifications = schema(dir.path(), "ClientNotification.json");
    let initialized = serde_json::to_value(Message::notification(INITIALIZED, None)).unwrap();
    assert_valid(&notifications, &initialized, "initialized");

    // Answers to server requests: the decline of each approval validates against that
    // request's response schema, wrapped in a valid JSON-RPC response.
    let responses = schema(dir.path(), "JSONRPCResponse.json");
    let errors = schema(dir.path(), "JSONRPCError.json");
    let answers = [
        (
            "item/commandExecution/requestApproval",
            "v2/CommandExecutionRequestApprovalResponse.json",
        ),
        (
            "item/fileChange/requestApproval",
            "v2/FileChangeRequestApprovalResponse.json",
        ),
        (
            "item/permissions/requestApproval",
            "v2/PermissionsRequestApprovalResponse.json",
        ),
        ("applyPatchApproval", "ApplyPatchApprovalResponse.json"),
        ("execCommandApproval", "ExecCommandApprovalResponse.json"),
    ];
    assert_eq!(answers.len(), APPROVAL_METHODS.len());
    for (method, file) in answers {
        let file = if dir.path().join(file).exists() {
            file.to_string()
        } else {
            file.replace("v2/", "")
        };
        let request = RawRequest {
            id: 1.into(),
            method: method.into(),
            params: Some(json!({"threadId": "t"})),
        };
        let decline = ServerRequest::from_raw(&request)
            .unwrap()
            .decline_result()
            .unwrap();
        assert_valid(&schema(dir.path(), &file), &decline, method);
        let wrapped = serde_json::to_value(Message::Response(Response {
            id: 1.into(),
            result: decline,
        }))
        .unwrap();
        assert_valid(&responses, &wrapped, method);
    }
    let refusal = Message::error(
        Some(2.into()),
        RpcError::new(-32601, "rethread does not handle server request `x`"),
    );
    assert_valid(
        &errors,
        &serde_json::to_value(refusal).unwrap(),
        "error answer",
    );
}

/// Decodes every line a real 0.169.0 app-server sent, typing what this crate types.
fn decode_all(log: &[Value], sent: &[Value]) -> usize {
    let method_of = |id: &Value| {
        sent.iter()
            .find(|m| m.get("id") == Some(id))
            .and_then(|m| m["method"].as_str())
            .map(str::to_string)
    };
    let mut typed = 0;
    for value in log {
        let message = Message::from_value(value.clone()).unwrap_or_else(|e| panic!("{e}: {value}"));
        match &message {
            Message::Notification(raw) => {
                let notification = ServerNotification::from_raw(raw)
                    .unwrap_or_else(|e| panic!("{}: {e}: {value}", raw.method));
                if !matches!(notification, ServerNotification::Other { .. }) {
                    typed += 1;
                }
            }
            Message::Response(response) => {
                let method =
                    method_of(value.get("id").unwrap()).expect("a response to a request we sent");
                let ok = match method.as_str() {
                    "initialize" => response.result_as::<InitializeResponse>().map(drop),
                    "thread/start" => response.result_as::<ThreadStartResponse>().map(drop),
                    "thread/resume" => response.result_as::<ThreadResumeResponse>().map(drop),
                    "thread/read" => response.result_as::<ThreadReadResponse>().map(drop),
                    "thread/list" => response.result_as::<ThreadListResponse>().map(drop),
                    "thread/turns/list" => {
                        response.result_as::<ThreadTurnsListResponse>().map(drop)
                    }
                    "turn/start" => response.result_as::<TurnStartResponse>().map(drop),
                    "turn/interrupt" => response.result_as::<TurnInterruptResponse>().map(drop),
                    _ => Ok(()),
                };
                ok.unwrap_or_else(|e| panic!("{method} result: {e}: {value}"));
                typed += 1;
            }
            Message::Request(raw) => {
                ServerRequest::from_raw(raw).unwrap();
            }
            Message::Error(_) => {}
        }
    }
    typed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_real_app_server_sends_during_real_turns_decodes() {
    for version in supported_releases() {
        real_turns_decode(&version).await;
    }
}

async fn real_turns_decode(version: &str) {
    let Some(codex) = codex_or_skip(version) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let mut server = AppServerProcess::spawn(&codex, home.path()).await.unwrap();
    server.peer.initialize(true).await.unwrap();
    let started = server
        .peer
        .request("thread/start", Some(json!({"cwd": home.path()})))
        .await
        .unwrap();
    let thread_id = started["result"]["thread"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let started_mode: Thread = serde_json::from_value(started["result"]["thread"].clone()).unwrap();
    let run = server
        .peer
        .run_turn(&thread_id, "remember PAPAYA", None)
        .await
        .unwrap();
    assert_eq!(run.status().as_deref(), Some("completed"));
    server
        .peer
        .request(
            "thread/read",
            Some(json!({"threadId": thread_id, "includeTurns": true})),
        )
        .await
        .unwrap();
    server
        .peer
        .request("thread/list", Some(json!({"limit": 5})))
        .await
        .unwrap();
    let listed = server
        .peer
        .request(
            "thread/turns/list",
            Some(json!({"threadId": thread_id, "limit": 1})),
        )
        .await
        .unwrap();
    assert_eq!(
        listed["result"]["data"].as_array().map(Vec::len),
        Some(1),
        "{version}: {listed}"
    );
    let mut typed = decode_all(&server.peer.log, &server.peer.sent);
    server.kill().await.unwrap();

    // After a restart: resume (with turns) and a second turn.
    let mut server = AppServerProcess::spawn(&codex, home.path()).await.unwrap();
    server.peer.initialize(true).await.unwrap();
    let resumed = server
        .peer
        .request("thread/resume", Some(json!({"threadId": thread_id})))
        .await
        .unwrap();
    let thread: Thread = serde_json::from_value(resumed["result"]["thread"].clone()).unwrap();
    assert!(
        !matches!(thread.history_mode, HistoryMode::Unknown(_)),
        "{version}: {:?}",
        thread.history_mode
    );
    assert_eq!(
        thread.history_mode, started_mode.history_mode,
        "{version}: a resumed thread keeps the mode it started with"
    );
    server
        .peer
        .run_turn(&thread_id, "what was it?", None)
        .await
        .unwrap();
    typed += decode_all(&server.peer.log, &server.peer.sent);
    server.kill().await.unwrap();
    // initialize x2, thread/start, turn/start x2, read, list, resume, and the turn notifications.
    assert!(typed >= 12, "{version}: only {typed} messages were typed");
}
