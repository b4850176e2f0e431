//! Issue 34, defect 1: a thread the client names, against the real current codex (which reads
//! a thread id in any spelling of its UUID). Sessions `alice` and `bob` share one
//! `CODEX_HOME` and one store; bob's client names alice's thread every way codex accepts,
//! through `rethread exec` and `rethread app-server`, and never reaches it: nothing of alice's
//! is sent to the model for bob, nothing of bob's lands in alice's thread.

mod support;

use std::path::Path;
use std::process::Output;

use rethread_testkit::real::{codex_or_skip, thread_id, CodexHome};
use rethread_testkit::responses::ResponsesStandIn;
use rethread_testkit::CURRENT;
use serde_json::{json, Value};
use support::{
    app_server_of, close, describe, exec_command, requests_holding, run_with_prompt, sessions,
    started_thread, store_url,
};

const SECRET: &str = "alice's secret is zebra-42";

/// Every spelling codex reads as `id` (a lower-case hyphenated UUID), the exact one last.
fn spellings(id: &str) -> Vec<String> {
    let simple = id.replace('-', "");
    vec![
        id.to_uppercase(),
        simple.clone(),
        simple.to_uppercase(),
        format!("{{{id}}}"),
        format!("urn:uuid:{id}"),
        id.to_string(),
    ]
}

/// `rethread exec --experimental-json --skip-git-repo-check --cd HOME ARGS...` for `session`
/// with the real codex, `prompt` on stdin.
fn exec(codex: &Path, home: &Path, session: &str, args: &[&str], prompt: &str) -> Output {
    let mut command = exec_command(codex, home, &store_url(home));
    command.args(args).env("RETHREAD_SESSION", session);
    run_with_prompt(&mut command, prompt.as_bytes())
}

/// `rethread sessions show ID --json`.
fn session(home: &Path, id: &str) -> Value {
    sessions(&store_url(home), &["show", id])
}

#[test]
fn exec_never_continues_or_forks_another_sessions_thread_in_any_spelling() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let home = home.path();
    let alice = started_thread(&exec(&codex, home, "alice", &[], SECRET));

    // Bob names alice's thread: every spelling, resumed or forked. Refused before codex runs,
    // exit 1, the reason on stderr; nothing reaches the model.
    let before = model.model_requests().len();
    for spelling in spellings(&alice) {
        for sub in ["resume", "fork"] {
            let run = exec(
                &codex,
                home,
                "bob",
                &[sub, &spelling],
                "bob asks: what is it?",
            );
            assert_eq!(
                run.status.code(),
                Some(1),
                "{sub} {spelling}: {}",
                describe(&run)
            );
            assert!(
                run.stdout.is_empty(),
                "{sub} {spelling}: {}",
                describe(&run)
            );
            let stderr = String::from_utf8_lossy(&run.stderr);
            assert!(stderr.contains("belongs to session alice"), "{stderr}");
        }
    }
    // `resume --last --all` picks the newest thread of the home (alice's): bob has none yet.
    let last = exec(
        &codex,
        home,
        "bob",
        &["resume", "--last", "--all"],
        "bob asks again",
    );
    assert_eq!(last.status.code(), Some(1), "{}", describe(&last));
    assert!(String::from_utf8_lossy(&last.stderr).contains("resume --last"));
    // Text that is not an id: codex would look it up as a thread name, whoever's.
    let named = exec(
        &codex,
        home,
        "bob",
        &["resume", "alices-thread"],
        "bob asks",
    );
    assert_eq!(named.status.code(), Some(1), "{}", describe(&named));
    assert!(String::from_utf8_lossy(&named.stderr).contains("not a thread id"));
    assert_eq!(model.model_requests().len(), before, "nothing of bob's ran");

    // Bob's own thread: `--last` is pinned to it, and his own id in another spelling is his.
    let bob = started_thread(&exec(&codex, home, "bob", &[], "bob's word is lion"));
    assert_ne!(bob, alice);
    let own_last = exec(
        &codex,
        home,
        "bob",
        &["resume", "--last", "--all"],
        "bob again",
    );
    assert_eq!(started_thread(&own_last), bob);
    let upper = bob.to_uppercase();
    let own = exec(&codex, home, "bob", &["resume", &upper], "bob once more");
    assert_eq!(started_thread(&own), bob, "codex names it canonically");
    let stored = session(home, "bob");
    assert_eq!(
        stored["thread_id"],
        bob.as_str(),
        "one thread, one spelling"
    );
    assert_eq!(
        stored["row_count"], 6,
        "every run on bob's own thread is recorded"
    );
    assert_eq!(
        requests_holding(&model, SECRET),
        1,
        "only alice's own request"
    );

    // Alice's thread holds nothing of bob's.
    let next = exec(&codex, home, "alice", &[], "alice again");
    assert_eq!(started_thread(&next), alice);
    let last_request = model.model_requests().pop().unwrap().conversation();
    assert!(last_request.iter().any(|m| m.text.contains(SECRET)));
    assert!(
        last_request.iter().all(|m| !m.text.contains("bob")),
        "{last_request:?}"
    );
}

#[tokio::test]
async fn app_server_never_resumes_forks_or_reads_another_sessions_thread_in_any_spelling() {
    let Some(codex) = codex_or_skip(CURRENT) else {
        return;
    };
    let model = ResponsesStandIn::start().unwrap();
    let home = CodexHome::new(&model).unwrap();
    let home = home.path();
    let mut first = app_server_of(&codex, home, Some("alice"), false).await;
    let alice = thread_id(&first.peer.start_thread().await.unwrap());
    first.peer.run_turn(&alice, SECRET, None).await.unwrap();
    close(first).await;

    let mut bob = app_server_of(&codex, home, Some("bob"), false).await;
    let own = thread_id(&bob.peer.start_thread().await.unwrap());
    for spelling in spellings(&alice) {
        let asks = [
            ("thread/resume", json!({"threadId": spelling})),
            ("thread/fork", json!({"threadId": spelling})),
            (
                "thread/read",
                json!({"threadId": spelling, "includeTurns": true}),
            ),
            ("thread/turns/list", json!({"threadId": spelling})),
            (
                "thread/rollback",
                json!({"threadId": spelling, "numTurns": 1}),
            ),
            ("thread/archive", json!({"threadId": spelling})),
            (
                "turn/start",
                json!({"threadId": spelling, "input": [{"type": "text", "text": "bob asks"}]}),
            ),
        ];
        for (method, params) in asks {
            let answer = bob.peer.request(method, Some(params)).await.unwrap();
            let refusal = &answer["error"]["data"]["rethread"];
            assert_eq!(
                refusal["kind"], "thread_taken",
                "{method} {spelling}: {answer}"
            );
            assert_eq!(refusal["ownerSessionId"], "alice", "{answer}");
            assert_eq!(refusal["threadId"], alice.as_str(), "canonical: {answer}");
        }
    }
    // Bob's own thread, named upper-cased, is his.
    bob.peer
        .run_turn(&own, "bob's word is lion", None)
        .await
        .unwrap();
    let resumed = bob
        .peer
        .request(
            "thread/resume",
            Some(json!({"threadId": own.to_uppercase()})),
        )
        .await
        .unwrap();
    assert_eq!(resumed["result"]["thread"]["id"], own.as_str(), "{resumed}");
    let turn = bob
        .peer
        .run_turn(&own.to_uppercase(), "bob again", None)
        .await
        .unwrap();
    assert_eq!(
        turn.status().as_deref(),
        Some("completed"),
        "{:?}",
        turn.messages
    );
    close(bob).await;
    assert_eq!(
        requests_holding(&model, SECRET),
        1,
        "only alice's own request"
    );
    let stored = session(home, "bob");
    assert_eq!(
        stored["thread_id"],
        own.as_str(),
        "one thread, one spelling"
    );
    assert_eq!(stored["row_count"], 4, "both of bob's turns are recorded");
    assert_eq!(
        session(home, "alice")["row_count"],
        2,
        "alice's thread untouched"
    );
}
