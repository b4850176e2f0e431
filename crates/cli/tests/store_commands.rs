//! The store commands as a process, without codex: `verify`, `sessions list` paging,
//! `sessions forget --json`, `migrate --json`. Stores are filled through the library.

use std::path::Path;
use std::process::{Command, Output};

use rethread_store::{open_url, OpenOptions, TurnCommit};
use serde_json::{json, Value};

/// `rethread ARGS` on the store `url`; no codex is needed or found.
fn rethread(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rethread"))
        .args(args)
        .env("RETHREAD_STORE", url)
        .env("RETHREAD_CODEX_BIN", "/nonexistent/codex")
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {}", text(&out.stdout)))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Sessions `ids`, each with `rows` rows on thread `t-<id>`, written through the library.
fn fill(url: &str, ids: &[&str], rows: usize) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = open_url(url, OpenOptions::new()).await.unwrap();
        for id in ids {
            store
                .commit_turn(TurnCommit::new(
                    id.to_string(),
                    format!("t-{id}"),
                    (0..rows).map(|n| json!({ "n": n })).collect(),
                ))
                .await
                .unwrap();
        }
    });
}

/// Runs SQL on a SQLite store from a connection of its own, as another program would.
fn sqlite_edit(path: &Path, sql: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let changed = conn.execute(sql, []).unwrap();
    assert_eq!(changed, 1, "{sql}");
}

fn session_ids(list: &Value) -> Vec<String> {
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn verify_passes_a_clean_store_with_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        format!("redb:{}", dir.path().join("s.redb").display()),
        format!("sqlite:{}", dir.path().join("s.sqlite").display()),
    ] {
        fill(&url, &["a", "b", "c"], 2);
        let out = rethread(&url, &["verify", "--json"]);
        assert_eq!(code(&out), Some(0), "{}", text(&out.stderr));
        let report = stdout_json(&out);
        assert_eq!(report["store"], url.as_str());
        assert_eq!(report["ok"], true);
        assert_eq!(report["complete"], true);
        assert_eq!(report["sessions"], 3);
        assert_eq!(report["rows"], 6);
        assert_eq!(report["problems"], json!([]));
        assert_eq!(report["unlisted_problems"], 0);

        let out = rethread(&url, &["verify"]);
        assert_eq!(code(&out), Some(0));
        let human = text(&out.stdout);
        assert!(human.contains("3 session(s), 6 row(s)"), "{human}");
        assert!(human.contains("no problems"), "{human}");
        assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    }
}

/// The damage a read finds when it touches it is also what `verify` reports, whole-store:
/// a record changed outside rethread, a missing row, rows of no session. Exit 1.
#[test]
fn verify_reports_every_damage_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sqlite");
    let url = format!("sqlite:{}", path.display());
    fill(&url, &["a", "b", "c"], 3);
    sqlite_edit(
        &path,
        "UPDATE sessions SET row_count = 1 WHERE session_id = 'a'",
    );
    sqlite_edit(
        &path,
        "DELETE FROM transcript_rows WHERE session_id = 'b' AND seq = 1",
    );
    sqlite_edit(
        &path,
        "INSERT INTO transcript_rows (session_id, seq, body, checksum) \
         SELECT 'ghost', seq, body, checksum FROM transcript_rows \
         WHERE session_id = 'c' AND seq = 0",
    );
    sqlite_edit(
        &path,
        "DELETE FROM transcript_rows WHERE session_id = 'c' AND seq = 2",
    );
    // The changed record is an error when touched (`show` reads no rows, so it cannot see
    // the others) ...
    let out = rethread(&url, &["sessions", "show", "a"]);
    assert_eq!(code(&out), Some(1), "{}", text(&out.stdout));
    // ... and verify finds all of it in one run.
    let out = rethread(&url, &["verify", "--json"]);
    assert_eq!(code(&out), Some(1), "{}", text(&out.stderr));
    let report = stdout_json(&out);
    assert_eq!(report["ok"], false);
    let found: Vec<(String, Value)> = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["kind"].as_str().unwrap().to_string(),
                p["session_id"].clone(),
            )
        })
        .collect();
    for expected in [
        ("session", json!("a")),
        ("missing_rows", json!("b")),
        ("stray_rows", json!("ghost")),
    ] {
        let expected = (expected.0.to_string(), expected.1);
        assert!(found.contains(&expected), "{expected:?} not in {found:?}");
    }
    // The missing rows are named as a person counts them: one row is one row.
    let details: Vec<&str> = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "missing_rows")
        .map(|p| p["detail"].as_str().unwrap())
        .collect();
    assert_eq!(
        details,
        [
            "session b: row 1 is missing",
            "session c counts 3 rows; row 2 is missing"
        ],
        "{report}"
    );
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("rethread: store "), "{stderr}");
    assert!(stderr.contains("is damaged"), "{stderr}");

    let out = rethread(&url, &["verify"]);
    assert_eq!(code(&out), Some(1));
    let human = text(&out.stdout);
    let row_of = |kind: &str, session: &str| {
        human.lines().any(|line| {
            let mut columns = line.split_whitespace();
            columns.next() == Some(kind) && columns.next() == Some(session)
        })
    };
    assert!(human.starts_with("PROBLEM"), "{human}");
    assert!(row_of("session", "a"), "{human}");
    assert!(row_of("missing_rows", "b"), "{human}");
    assert!(human.contains("damaged"), "{human}");
}

#[test]
fn verify_of_an_unreadable_store_fails_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-a-store.sqlite");
    std::fs::write(&path, b"this is not a database, not even a little").unwrap();
    let out = rethread(&format!("sqlite:{}", path.display()), &["verify", "--json"]);
    assert_eq!(code(&out), Some(1));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert_eq!(text(&out.stderr).lines().count(), 1);
}

#[test]
fn sessions_list_pages_with_limit_and_after() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("redb:{}", dir.path().join("s.redb").display());
    fill(&url, &["s0", "s1", "s2", "s3", "s4"], 1);

    let mut after: Option<String> = None;
    let mut pages = Vec::new();
    loop {
        let mut args = vec!["sessions", "list", "--json", "--limit", "2"];
        if let Some(after) = &after {
            args.extend(["--after", after.as_str()]);
        }
        let out = rethread(&url, &args);
        assert_eq!(code(&out), Some(0), "{}", text(&out.stderr));
        let page = stdout_json(&out);
        pages.push(session_ids(&page));
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => break,
        }
        assert!(pages.len() < 10, "paging does not end: {pages:?}");
    }
    let all: Vec<String> = pages.concat();
    assert_eq!(all, ["s0", "s1", "s2", "s3", "s4"], "{pages:?}");
    assert!(pages.iter().all(|p| p.len() <= 2), "{pages:?}");
    assert_eq!(pages[0], ["s0", "s1"]);

    // Without --limit: everything, no next page.
    let out = rethread(&url, &["sessions", "list", "--json"]);
    let list = stdout_json(&out);
    assert_eq!(session_ids(&list).len(), 5);
    assert_eq!(list["next_after"], Value::Null);

    // Human output: the hint names the next --after while more may follow, on the same store
    // (given by the variable or the flag), so that pasting it reads the next page.
    let hint = format!("rethread sessions list --store {url} --limit 2 --after s1");
    for args in [
        &["sessions", "list", "--limit", "2"][..],
        &["sessions", "list", "--limit", "2", "--store", &url],
    ] {
        let out = rethread(&url, args);
        assert_eq!(code(&out), Some(0));
        let human = text(&out.stdout);
        assert!(human.contains("s1") && !human.contains("s2"), "{human}");
        assert!(text(&out.stderr).contains(&hint), "{}", text(&out.stderr));
    }
    let out = rethread(&url, &["sessions", "list", "--after", "s4"]);
    assert_eq!(code(&out), Some(0));
    assert_eq!(text(&out.stdout).trim(), "no sessions");
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let out = rethread(&url, &["sessions", "list", "--after", "s3"]);
    assert!(text(&out.stdout).contains("s4"));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));

    // A limit outside 1..=10000 is a usage error.
    for bad in ["0", "10001", "-1", "x"] {
        let out = rethread(&url, &["sessions", "list", "--limit", bad]);
        assert_eq!(code(&out), Some(2), "--limit {bad}");
    }
}

#[test]
fn forget_and_migrate_print_one_json_object() {
    let dir = tempfile::tempdir().unwrap();
    let from = format!("redb:{}", dir.path().join("from.redb").display());
    let to = format!(
        "sqlite:{}",
        dir.path().join("to").join("to.sqlite").display()
    );
    fill(&from, &["a", "b", "c"], 2);

    let out = rethread(&from, &["migrate", "--json", "--from", &from, "--to", &to]);
    assert_eq!(code(&out), Some(0), "{}", text(&out.stderr));
    let expected = json!({
        "from": from, "to": to, "sessions": 3, "copied": 3, "already_present": 0,
        "rows_copied": 6, "mirror_bytes_copied": 0, "verified": true,
    });
    assert_eq!(stdout_json(&out), expected);
    // A rerun copies nothing and says so.
    let out = rethread(&from, &["migrate", "--json", "--from", &from, "--to", &to]);
    let report = stdout_json(&out);
    assert_eq!(
        (&report["copied"], &report["already_present"]),
        (&json!(0), &json!(3))
    );
    // The same store on both sides is refused: options that do not go together (exit 2).
    let out = rethread(
        &from,
        &["migrate", "--json", "--from", &from, "--to", &from],
    );
    assert_eq!(code(&out), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("the same store"));

    let out = rethread(&to, &["sessions", "forget", "b", "--json"]);
    assert_eq!(code(&out), Some(0), "{}", text(&out.stderr));
    assert_eq!(stdout_json(&out), json!({ "forgot": "b" }));
    let out = rethread(&to, &["sessions", "forget", "b", "--json"]);
    assert_eq!(code(&out), Some(1));
    assert!(text(&out.stderr).contains("no session b"));
    let list = stdout_json(&rethread(&to, &["sessions", "list", "--json"]));
    assert_eq!(session_ids(&list), ["a", "c"]);
}

/// A reader that stops early (`rethread sessions list | head -1`) is no failure: the commands
/// that print a report end quietly, never with a panic and its backtrace (exit 101).
#[cfg(unix)]
#[test]
fn a_report_whose_reader_went_away_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("store.sqlite").display());
    fill(&url, &["a", "b"], 2);
    for args in [
        &["sessions", "list"][..],
        &["sessions", "list", "--json"],
        &["sessions", "show", "a", "--rows"],
        &["verify"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rethread"))
            .args(args)
            .env("RETHREAD_STORE", &url)
            .env("RETHREAD_CODEX_BIN", "/nonexistent/codex")
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The read end closes before the command writes: its first write meets no reader.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = text(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        let quiet = out.status.code() == Some(0) || out.status.signal() == Some(13);
        assert!(quiet, "{args:?}: {:?} {stderr}", out.status);
    }
}

/// Issue 41, item 5: a thread kept without a session is the record `thread:<canonical id>`;
/// `sessions show thread:<ID IN UPPER CASE>` and `forget` said "no session", so a script fed
/// the id in another spelling silently kept the data. Every command that takes a session id
/// reads a kept thread's in every spelling codex reads.
#[test]
fn a_kept_threads_record_is_found_by_its_id_in_any_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("s.sqlite").display());
    let id = "0195ec6b-66c5-7e31-9f2f-3ad0a1f2b9c4";
    let key = format!("thread:{id}");
    fill(&url, &[key.as_str(), "zz-session"], 2);
    let spellings = [
        format!("thread:{}", id.to_uppercase()),
        format!("thread:{}", id.replace('-', "")),
        format!("thread:urn:uuid:{id}"),
        format!("thread:{{{}}}", id.to_uppercase()),
    ];
    for spelling in &spellings {
        let shown = rethread(&url, &["sessions", "show", spelling, "--json"]);
        assert_eq!(code(&shown), Some(0), "{spelling}: {}", text(&shown.stderr));
        assert_eq!(stdout_json(&shown)["session"], key.as_str(), "{spelling}");
        let rows = rethread(&url, &["sessions", "show", spelling, "--rows", "--json"]);
        assert_eq!(code(&rows), Some(0), "{spelling}: {}", text(&rows.stderr));
        assert_eq!(stdout_json(&rows)["rows"].as_array().unwrap().len(), 2);
        // The page after the record is the one after its canonical key.
        let after = rethread(&url, &["sessions", "list", "--after", spelling, "--json"]);
        assert_eq!(
            session_ids(&stdout_json(&after)),
            ["zz-session"],
            "{spelling}"
        );
    }
    let forgot = rethread(&url, &["sessions", "forget", &spellings[0], "--json"]);
    assert_eq!(code(&forgot), Some(0), "{}", text(&forgot.stderr));
    assert_eq!(stdout_json(&forgot), json!({"forgot": key}));
    let list = stdout_json(&rethread(&url, &["sessions", "list", "--json"]));
    assert_eq!(
        session_ids(&list),
        ["zz-session"],
        "the kept thread is gone"
    );
}
