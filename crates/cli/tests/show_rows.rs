//! Issue 22: `sessions show ID --rows` prints the transcript: for people each row's role and
//! text, escaped; with `--json` the rows as stored; paged the way `sessions list` pages
//! (`--limit N`, `--after SEQ`, a hint on stderr when more may follow).

mod support;

use std::process::{Command, Output};

use rethread_store::{open_url, OpenOptions, TurnCommit};
use serde_json::{json, Value};
use support::rethread;

fn run(store: &str, args: &[&str]) -> Output {
    Command::new(rethread())
        .args(args)
        .env("RETHREAD_STORE", store)
        .env("RUST_LOG", "off")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The rows of session `s`: a user message with a terminal escape and a newline, the reply, a
/// tool row, and a row a host wrote in its own shape.
fn rows() -> Vec<Value> {
    vec![
        json!({"role": "user", "text": "line one\nline \u{1b}[31mtwo", "thread_id": "t", "turn_id": "u1"}),
        json!({"role": "assistant", "text": "echo: one", "thread_id": "t", "turn_id": "u1"}),
        json!({"role": "tool", "kind": "commandExecution", "summary": "ls -la", "thread_id": "t", "turn_id": "u2"}),
        json!({"host": "own", "n": 7}),
    ]
}

fn store_with_rows(dir: &std::path::Path) -> String {
    let url = format!("sqlite:{}", dir.join("store.sqlite").display());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = open_url(&url, OpenOptions::new()).await.unwrap();
        let rows = rows();
        store
            .commit_turn(TurnCommit::new(
                "s",
                "0199aaaa-0000-7000-8000-000000000001",
                rows[..2].to_vec(),
            ))
            .await
            .unwrap();
        store
            .commit_turn(TurnCommit::new(
                "s",
                "0199aaaa-0000-7000-8000-000000000001",
                rows[2..].to_vec(),
            ))
            .await
            .unwrap();
    });
    url
}

#[test]
fn sessions_show_rows_prints_the_transcript_for_people() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path());
    let out = run(&store, &["sessions", "show", "s", "--rows"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 5, "{shown}");
    assert!(lines[0].starts_with("SEQ"), "{shown}");
    let columns = |line: &str| {
        line.split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(columns(lines[1]), "0 user");
    assert!(
        lines[1].ends_with(r"line one\nline \u{1b}[31mtwo"),
        "escaped: {shown}"
    );
    assert_eq!(columns(lines[2]), "1 assistant");
    assert!(lines[2].ends_with("echo: one"), "{shown}");
    assert_eq!(columns(lines[3]), "2 tool");
    assert!(lines[3].ends_with("ls -la"), "{shown}");
    assert_eq!(columns(lines[4]), "3 -");
    assert!(lines[4].ends_with(r#"{"host":"own","n":7}"#), "{shown}");
    assert!(!shown.contains('\u{1b}'), "{shown:?}");
}

#[test]
fn sessions_show_rows_json_is_the_rows_as_stored_and_pages() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_rows(dir.path());
    let page = |args: &[&str]| -> (Value, String) {
        let mut all = vec!["sessions", "show", "s", "--rows", "--json"];
        all.extend_from_slice(args);
        let out = run(&store, &all);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        (
            serde_json::from_slice(&out.stdout).unwrap(),
            text(&out.stderr),
        )
    };
    let (whole, _) = page(&[]);
    assert_eq!(whole["session"], "s");
    assert_eq!(whole["next_after"], Value::Null);
    let stored: Vec<Value> = whole["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["row"].clone())
        .collect();
    assert_eq!(stored, rows());
    let seqs: Vec<u64> = whole["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [0, 1, 2, 3]);

    // Page by page: `--limit` and the `next_after` of the page before.
    let (first, _) = page(&["--limit", "3"]);
    assert_eq!(first["rows"].as_array().unwrap().len(), 3);
    assert_eq!(first["next_after"], 2);
    let (rest, _) = page(&["--limit", "3", "--after", "2"]);
    assert_eq!(rest["rows"], json!([{"seq": 3, "row": rows()[3]}]));
    assert_eq!(rest["next_after"], Value::Null);

    // For people, the hint names the next page.
    let out = run(&store, &["sessions", "show", "s", "--rows", "--limit", "2"]);
    assert_eq!(
        text(&out.stdout).lines().count(),
        3,
        "{}",
        text(&out.stdout)
    );
    let hint = format!("rethread sessions show s --rows --store {store} --limit 2 --after 1");
    assert!(text(&out.stderr).contains(&hint), "{}", text(&out.stderr));
    // `--limit` and `--after` belong to `--rows`; a missing session is an error.
    let out = run(&store, &["sessions", "show", "s", "--limit", "2"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&store, &["sessions", "show", "nobody", "--rows"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no session nobody"),
        "{}",
        text(&out.stderr)
    );
}
