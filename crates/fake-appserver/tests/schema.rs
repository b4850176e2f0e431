//! What the fake sends validates against the JSON Schema each supported codex generates
//! (`codex app-server generate-json-schema`): responses, notifications and server requests of a
//! session that starts, runs turns (one with an approval, one interrupted), restarts, resumes,
//! reads and lists.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use rethread_fake_appserver::{FakeAppServer, Fault, FaultScript, Profile};
use rethread_testkit::real::{codex_or_skip, generate_json_schema, thread_id, WirePeer};
use rethread_testkit::{recent_releases, FLOOR};
use serde_json::{json, Value};

fn generate_schema(codex: &Path) -> tempfile::TempDir {
    generate_json_schema(codex).expect("generate-json-schema")
}

fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::validator_for(schema).unwrap()
}

fn file_schema(dir: &Path, name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap()
}

/// A schema for one definition of the bundled schema file.
fn bundled(dir: &Path, definition: &str) -> Value {
    let bundle = file_schema(dir, "codex_app_server_protocol.schemas.json");
    json!({"$ref": format!("#/definitions/{definition}"), "definitions": bundle["definitions"]})
}

/// Runs a session against the fake and returns, per connection, what was sent and what was
/// received.
async fn session(profile: Profile) -> Vec<(Vec<Value>, Vec<Value>)> {
    let faults = FaultScript::of([Fault::Approval { turn: 1 }]);
    let (stream, handle) = FakeAppServer::builder()
        .profile(profile)
        .faults(faults)
        .spawn_in_process()
        .unwrap();
    let (read, write) = tokio::io::split(stream);
    let mut peer = WirePeer::new(read, write);
    peer.timeout = Duration::from_secs(5);
    peer.initialize(true).await.unwrap();
    let started = peer.start_thread().await.unwrap();
    let id = thread_id(&started);
    peer.run_turn(&id, "first", Some(json!({"decision": "accept"})))
        .await
        .unwrap();
    peer.run_turn(&id, "second", None).await.unwrap();
    let first = (
        std::mem::take(&mut peer.sent),
        std::mem::take(&mut peer.log),
    );
    peer.close_writer().await;

    handle.set_faults(FaultScript::of([Fault::SlowTurn { millis: 5_000 }]));
    let (read, write) = tokio::io::split(handle.restart().await.unwrap());
    let mut peer = WirePeer::new(read, write);
    peer.timeout = Duration::from_secs(5);
    peer.initialize(true).await.unwrap();
    let resumed = peer
        .request("thread/resume", Some(json!({"threadId": id})))
        .await
        .unwrap();
    assert!(resumed.get("result").is_some(), "{resumed}");
    peer.request(
        "thread/resume",
        Some(json!({"threadId": id, "excludeTurns": true})),
    )
    .await
    .unwrap();
    peer.request(
        "thread/read",
        Some(json!({"threadId": id, "includeTurns": true})),
    )
    .await
    .unwrap();
    peer.request("thread/read", Some(json!({"threadId": id})))
        .await
        .unwrap();
    peer.request("thread/list", Some(json!({}))).await.unwrap();
    let turn = peer
        .request(
            "turn/start",
            Some(json!({"threadId": id, "input": [{"type": "text", "text": "slow"}]})),
        )
        .await
        .unwrap();
    peer.wait_for("turn/started").await.unwrap();
    let turn_id = turn["result"]["turn"]["id"].clone();
    peer.request(
        "turn/interrupt",
        Some(json!({"threadId": id, "turnId": turn_id})),
    )
    .await
    .unwrap();
    peer.wait_for("turn/completed").await.unwrap();
    vec![first, (peer.sent, peer.log)]
}

async fn validate(version: &str, profile: Profile) {
    let Some(codex) = codex_or_skip(version) else {
        return;
    };
    let dir = generate_schema(&codex);
    let dir = dir.path();
    let mut responses: HashMap<&str, jsonschema::Validator> = HashMap::new();
    responses.insert("initialize", validator(&bundled(dir, "InitializeResponse")));
    for (method, file) in [
        ("thread/start", "v2/ThreadStartResponse.json"),
        ("thread/resume", "v2/ThreadResumeResponse.json"),
        ("thread/read", "v2/ThreadReadResponse.json"),
        ("thread/list", "v2/ThreadListResponse.json"),
        ("turn/start", "v2/TurnStartResponse.json"),
        ("turn/interrupt", "v2/TurnInterruptResponse.json"),
    ] {
        responses.insert(method, validator(&file_schema(dir, file)));
    }
    let notifications = by_method(&file_schema(dir, "ServerNotification.json"));
    let server_requests = by_method(&file_schema(dir, "ServerRequest.json"));

    let mut problems = Vec::new();
    let mut checked = 0;
    for (sent, received) in session(profile).await {
        let methods: HashMap<Value, String> = sent
            .iter()
            .filter_map(|m| Some((m.get("id")?.clone(), m.get("method")?.as_str()?.to_string())))
            .collect();
        for message in &received {
            let (what, validator, instance) =
                if let Some(method) = message.get("method").and_then(Value::as_str) {
                    let params = message.get("params").cloned().unwrap_or_default();
                    let (what, table) = if message.get("id").is_some() {
                        (format!("server request {method}"), &server_requests)
                    } else {
                        (format!("notification {method}"), &notifications)
                    };
                    let Some(validator) = table.get(method) else {
                        problems.push(format!("{what}: no such method in the schema"));
                        continue;
                    };
                    (what, validator, params)
                } else if let Some(result) = message.get("result") {
                    let Some(method) = message.get("id").and_then(|id| methods.get(id)) else {
                        continue;
                    };
                    (
                        format!("{method} response"),
                        &responses[method.as_str()],
                        result.clone(),
                    )
                } else {
                    continue;
                };
            checked += 1;
            let errors: Vec<String> = validator
                .iter_errors(&instance)
                .take(3)
                .map(|e| format!("{e} at {}", e.instance_path()))
                .collect();
            if !errors.is_empty() {
                problems.push(format!(
                    "{what}: {errors:?}\n    {}",
                    truncate(&instance.to_string())
                ));
            }
        }
    }
    assert!(checked > 20, "only {checked} messages checked");
    assert!(
        problems.is_empty(),
        "fake ({profile}) vs codex {version} schema:\n  {}",
        problems.join("\n  ")
    );
}

/// One validator per method of a `oneOf` of `{"method": {"enum": [m]}, "params": {"$ref"}}`
/// variants (`ServerNotification.json`, `ServerRequest.json`), for precise error messages.
fn by_method(schema: &Value) -> HashMap<String, jsonschema::Validator> {
    let mut out = HashMap::new();
    for variant in schema["oneOf"].as_array().unwrap() {
        let Some(method) = variant
            .pointer("/properties/method/enum/0")
            .and_then(Value::as_str)
        else {
            continue;
        };
        let params = variant
            .pointer("/properties/params")
            .cloned()
            .unwrap_or(json!({}));
        let mut wrapped = params;
        wrapped["definitions"] = schema["definitions"].clone();
        out.insert(method.to_string(), validator(&wrapped));
    }
    out
}

fn truncate(text: &str) -> String {
    text.chars().take(400).collect()
}

/// The current profile speaks the schema of the current and the previous release.
#[tokio::test]
async fn current_profile_speaks_the_recent_schemas() {
    for version in recent_releases() {
        validate(&version, Profile::Current).await;
    }
}

#[tokio::test]
async fn release_n_profile_speaks_the_floor_schema() {
    validate(FLOOR, Profile::ReleaseN).await;
}
