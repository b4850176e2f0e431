//! Issue 41, items 1 to 4: the guard fails closed, against the real current codex. Sessions
//! `alice` and `bob` (and a client without a session) share one `CODEX_HOME` and one store,
//! which is what codex needs to open another session's rollout by `path`. Bob's client tries
//! what codex reads differently from a first reading of the request (a `path`, a member named
//! twice), what lists threads (`thread/list`, `thread/search`) and a thread's name; none of it
//! reaches alice's thread or shows it.

mod support;

use std::path::{Path, PathBuf};

use rethread_testkit::real::{
    codex_or_skip, rollout_files, thread_id, AppServerProcess, CodexHome,
};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::CURRENT;
use serde_json::{json, Value};
use support::{
    app_server_of, close, describe, exec_command, requests_holding, run_with_prompt, sessions,
    store_url,
};

const SECRET: &str = "alice's secret is zebra-42";
const NAME: &str = "alices-thread";

/// Alice's thread, with one turn holding [`SECRET`] and the name [`NAME`]; its rollout.
async fn alices_thread(codex: &Path, home: &Path) -> (String, PathBuf) {
    let mut alice = app_server_of(codex, home, Some("alice"), true).await;
    let thread = thread_id(&alice.peer.start_thread().await.unwrap());
    alice.peer.run_turn(&thread, SECRET, None).await.unwrap();
    let named = json!({"threadId": thread, "name": NAME});
    let answer = alice
        .peer
        .request("thread/name/set", Some(named))
        .await
        .unwrap();
    assert!(answer.get("result").is_some(), "{answer}");
    close(alice).await;
    let rollout = rollout_files(home)
        .into_iter()
        .find(|file| file.to_string_lossy().contains(&thread))
        .expect("alice's rollout");
    (thread, rollout)
}

/// A thread of `client`'s own, started, with one turn saying `word`.
async fn own_thread(client: &mut AppServerProcess, word: &str) -> String {
    let own = thread_id(&client.peer.start_thread().await.unwrap());
    client.peer.run_turn(&own, word, None).await.unwrap();
    own
}

/// Fails unless [`SECRET`] went to the model in alice's own request only and her session
/// still holds just her turn; returns the store's URL.
fn alice_untouched(model: &ResponsesStandIn, home: &Path) -> String {
    assert_eq!(
        requests_holding(model, SECRET),
        1,
        "only alice's own request"
    );
    let store = store_url(home);
    assert_eq!(
        sessions(&store, &["show", "alice"])["row_count"],
        2,
        "alice untouched"
    );
    store
}

/// The refusal's kind and owner in an answer.
fn refusal(answer: &Value) -> (&str, &str) {
    let rethread = &answer["error"]["data"]["rethread"];
    let kind = rethread["kind"].as_str().unwrap_or_default();
    (
        kind,
        rethread["ownerSessionId"].as_str().unwrap_or_default(),
    )
}

/// The answer to a line sent as it is (a member named twice cannot be built as a `Value`).
async fn raw(peer: &mut AppServerProcess, id: &str, line: &str) -> Value {
    peer.peer
        .send_raw(format!("{line}\n").as_bytes())
        .await
        .unwrap();
    peer.peer.response_to(&json!(id)).await.unwrap()
}

/// What bob's (or a sessionless) client tries; `own` is a thread of its own.
async fn probe(client: &mut AppServerProcess, home: &Path, own: &str, alice: &str, rollout: &Path) {
    let rollout = rollout.to_str().unwrap();
    let decoy = "019a0000-0000-7000-8000-0000000000dd";
    // 1. A `path`: codex opens the rollout there whatever `threadId` says.
    for (method, params) in [
        ("thread/resume", json!({"threadId": decoy, "path": rollout})),
        ("thread/resume", json!({"threadId": own, "path": rollout})),
        ("thread/fork", json!({"threadId": own, "path": rollout})),
        ("thread/fork", json!({"path": rollout})),
    ] {
        let answer = client.peer.request(method, Some(params)).await.unwrap();
        assert_eq!(
            refusal(&answer),
            ("thread_taken", "alice"),
            "{method}: {answer}"
        );
    }
    // A path outside the home, or not absolute, is not read for codex.
    let outside = tempfile::NamedTempFile::new().unwrap();
    std::fs::copy(rollout, outside.path()).unwrap();
    let outside = outside.path().to_str().unwrap().to_string();
    for path in [outside.as_str(), "sessions/x.jsonl"] {
        let params = json!({"threadId": own, "path": path});
        let answer = client
            .peer
            .request("thread/resume", Some(params))
            .await
            .unwrap();
        assert_eq!(answer["error"]["code"], -32600, "{path}: {answer}");
        assert_eq!(refusal(&answer).0, "unreadable_request", "{answer}");
    }
    // 2. A member named twice, at any depth of `params`: codex keeps the last one.
    let twice = [
        format!(
            r#"{{"id":"dup-1","method":"thread/read","params":{{"threadId":"{own}","includeTurns":true,"threadId":"{alice}"}}}}"#
        ),
        format!(
            r#"{{"id":"dup-2","method":"turn/start","params":{{"threadId":"{own}","input":[{{"type":"text","text":"x"}}],"threadId":"{alice}"}}}}"#
        ),
        format!(
            r#"{{"id":"dup-3","method":"thread/resume","params":{{"threadId":"{own}","path":"{rollout}","path":"{rollout}"}}}}"#
        ),
    ];
    for (n, line) in twice.iter().enumerate() {
        let answer = raw(client, &format!("dup-{}", n + 1), line).await;
        assert_eq!(answer["error"]["code"], -32600, "{line}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("duplicate"), "{message}");
    }
    // 4. Listings and search show only what the client may open.
    let listed = client
        .peer
        .request("thread/list", Some(json!({})))
        .await
        .unwrap();
    let text = listed.to_string();
    let ids: Vec<&str> = (listed["result"]["data"].as_array().unwrap().iter())
        .filter_map(|thread| thread["id"].as_str())
        .collect();
    assert!(ids.contains(&own), "its own thread is listed: {listed}");
    assert!(!text.contains(alice) && !text.contains("zebra"), "{listed}");
    let search = json!({"searchTerm": "zebra"});
    let found = client
        .peer
        .request("thread/search", Some(search))
        .await
        .unwrap();
    assert!(
        found["result"]["data"].is_array(),
        "codex searched: {found}"
    );
    assert!(!found.to_string().contains(alice), "{found}");
    assert!(!found.to_string().contains("zebra"), "{found}");
    let mine = json!({"searchTerm": "lion"});
    let found = client
        .peer
        .request("thread/search", Some(mine))
        .await
        .unwrap();
    assert!(
        found.to_string().contains(own),
        "its own thread is found: {found}"
    );
    assert!(home.join("session_index.jsonl").exists());
}

#[tokio::test]
async fn a_sessions_client_never_reaches_another_thread_by_path_duplicate_or_listing() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let home = home.path();
    let (alice, rollout) = alices_thread(&codex, home).await;

    let mut bob = app_server_of(&codex, home, Some("bob"), true).await;
    let own = own_thread(&mut bob, "bob's word is lion").await;
    probe(&mut bob, home, &own, &alice, &rollout).await;
    // Bob's own thread still works, and is still his.
    let turn = bob.peer.run_turn(&own, "bob again", None).await.unwrap();
    assert_eq!(
        turn.status().as_deref(),
        Some("completed"),
        "{:?}",
        turn.messages
    );
    close(bob).await;

    let store = alice_untouched(&model, home);
    assert_eq!(
        sessions(&store, &["show", "bob"])["thread_id"],
        own.as_str()
    );
}

#[tokio::test]
async fn a_client_without_a_session_never_reaches_a_sessions_thread_by_path_or_listing() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let home = home.path();
    let (alice, rollout) = alices_thread(&codex, home).await;

    let mut client = app_server_of(&codex, home, None, true).await;
    let own = own_thread(&mut client, "the word is lion").await;
    probe(&mut client, home, &own, &alice, &rollout).await;
    close(client).await;

    let store = alice_untouched(&model, home);
    let listed = sessions(&store, &["list"]);
    let kept = listed["sessions"].as_array().unwrap();
    assert!(
        kept.iter()
            .all(|record| record["thread_id"] != alice.as_str() || record["session"] == "alice"),
        "no copy of alice's thread is kept: {kept:?}"
    );
}

#[tokio::test]
async fn exec_resolves_a_thread_name_then_guards_it() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let home = home.path();
    let (alice, _) = alices_thread(&codex, home).await;
    let before = model.model_requests().len();

    // Without a session and with one, `resume` and `fork` by alice's thread's name.
    for session in [None, Some("bob")] {
        for sub in ["resume", "fork"] {
            let mut command = exec_command(&codex, home, &store_url(home));
            command.args([sub, NAME]);
            if let Some(session) = session {
                command.env("RETHREAD_SESSION", session);
            }
            let run = run_with_prompt(&mut command, b"what is the secret?");
            assert_eq!(
                run.status.code(),
                Some(1),
                "{session:?} {sub}: {}",
                describe(&run)
            );
            let stderr = String::from_utf8_lossy(&run.stderr);
            assert!(stderr.contains("belongs to session alice"), "{stderr}");
            assert!(
                stderr.contains(&alice),
                "the name is resolved to its thread: {stderr}"
            );
            assert!(
                !stderr.contains("thread:alices"),
                "no session of that name: {stderr}"
            );
        }
    }
    // A name no thread has is refused too: codex would look it up itself.
    let mut command = exec_command(&codex, home, &store_url(home));
    command.args(["resume", "nobodys-thread"]);
    let run = run_with_prompt(&mut command, b"hello");
    assert_eq!(run.status.code(), Some(1), "{}", describe(&run));
    assert!(String::from_utf8_lossy(&run.stderr).contains("not a thread id"));
    assert_eq!(model.model_requests().len(), before, "nothing ran");
}
