//! Retention through the `rethread` binary: `sessions prune --idle` (dry run, JSON, a leased
//! session kept, exit codes), the bytes each session holds in `sessions list` / `show` and the
//! order by them, `doctor`'s warning near the mirror cap (on stderr and in `--json`), and the
//! cap set by `RETHREAD_MIRROR_CAP` or `chat --mirror-cap` (app-server's flag: app_server.rs).
//! Stores are filled through the library.

mod support;

use std::process::{Command, Output};
use std::time::Duration;

use rethread_store::{open_url, LocalOwner, MirrorAppend, MirrorUpdate, OpenOptions, TurnCommit};
use serde_json::{json, Value};
use support::{
    fake_codex, json_of, rethread as rethread_bin, wait_out_the_shortest_idle, SHORTEST_IDLE,
};

fn rethread(url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(rethread_bin());
    command
        .args(args)
        .env("RETHREAD_STORE", url)
        .env("RETHREAD_CODEX_BIN", fake_codex())
        .env("RUST_LOG", "error")
        .env_remove("RETHREAD_MIRROR")
        .env_remove("RETHREAD_MIRROR_CAP");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

const ROLLOUT: &str = "sessions/2026/12/01/rollout-2026-12-01T10-00-00-t.jsonl";

/// Session `id` with `rows` rows and a mirror of `mirror` bytes.
fn turn(id: &str, rows: usize, mirror: usize) -> TurnCommit {
    let mut line = "x".repeat(mirror.saturating_sub(1)).into_bytes();
    line.push(b'\n');
    let update = MirrorUpdate::new(vec![MirrorAppend::whole(ROLLOUT, line)]);
    let rows = (0..rows)
        .map(|n| json!({"role": "user", "text": n}))
        .collect();
    TurnCommit::new(id, format!("t-{id}"), rows).mirror(Some(update))
}

#[test]
fn prune_removes_idle_sessions_keeps_a_leased_one_and_a_dry_run_removes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("s.sqlite").display());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // A live holder: this process, with its lease for a day.
    let holder = LocalOwner::new();
    runtime.block_on(async {
        let store = open_url(&url, OpenOptions::new()).await.unwrap();
        for id in ["idle-a", "idle-b", "held"] {
            store.commit_turn(turn(id, 2, 100)).await.unwrap();
        }
        let day = Duration::from_secs(86_400);
        store
            .acquire_lease("held", holder.owner(), day)
            .await
            .unwrap();
        // A host that took a session and left before its first turn: a lease record only.
        let left = store.acquire_lease("left", holder.owner(), day).await;
        assert!(store.release_lease(&left.unwrap()).await.unwrap());
    });
    wait_out_the_shortest_idle();
    let ids = |v: &Value| -> Vec<String> {
        let removed = v["removed"].as_array().unwrap().iter();
        removed
            .map(|r| r["session"].as_str().unwrap().to_string())
            .collect()
    };

    let out = rethread(&url, &["sessions", "prune", "--idle", "1d", "--json"], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        ids(&json_of(&out)),
        Vec::<String>::new(),
        "nothing idle for a day"
    );

    let out = rethread(
        &url,
        &[
            "sessions",
            "prune",
            "--idle",
            SHORTEST_IDLE,
            "--dry-run",
            "--json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let dry = json_of(&out);
    assert_eq!(ids(&dry), ["idle-a", "idle-b", "left"]);
    assert_eq!(
        dry["removed"][2],
        json!({"kind": "lease", "session": "left"})
    );
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["kept_leased"], json!(["held"]));
    assert_eq!(dry["removed"][0]["kind"], "session");
    assert_eq!(dry["removed"][0]["mirror_bytes"], 100);
    assert!(dry["stored_bytes"].as_u64().unwrap() > 200, "{dry}");
    let list = json_of(&rethread(&url, &["sessions", "list", "--json"], &[]));
    assert_eq!(
        list["sessions"].as_array().unwrap().len(),
        3,
        "a dry run removes nothing"
    );

    let out = rethread(&url, &["sessions", "prune", "--idle", SHORTEST_IDLE], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("removed 2 idle sessions"), "{said}");
    assert!(said.contains("kept held (a live host holds it)"), "{said}");
    assert!(
        said.contains("removed 1 lease record(s) left without a session"),
        "{said}"
    );
    let list = json_of(&rethread(&url, &["sessions", "list", "--json"], &[]));
    let left = list["sessions"].as_array().unwrap().iter();
    let left: Vec<&str> = left.map(|s| s["session"].as_str().unwrap()).collect();
    assert_eq!(left, ["held"]);
    drop(holder);
}

/// Issue 41, item 7: `--idle 1m` was a minute (an operator may mean a month), `1M` and `1y`
/// were refused (`1y` naming `jiff::SpanRelativeTo`), and `0s`, `1ms`, `1ns` meant every
/// session not leased. Months and years are taken (30 and 365 days); a bare `m`, zero and
/// less than a second are usage errors naming the units.
#[test]
fn prune_takes_months_and_years_and_refuses_an_ambiguous_or_empty_span() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("none.sqlite").display());
    for taken in ["1mo", "1y", "2MO", "1y 2mo 3w 4d 5h 6min 7s"] {
        let out = rethread(&url, &["sessions", "prune", "--idle", taken], &[]);
        let said = String::from_utf8_lossy(&out.stderr);
        // A missing store holds nothing to remove (issue 41, item 15): the span was taken.
        assert_eq!(out.status.code(), Some(0), "{taken}: {out:?}");
        assert!(said.contains("no store"), "{taken}: {said}");
    }
    for (refused, says) in [
        ("1m", "`mo`"),
        ("1M", "`min`"),
        ("0", "s, min, h"),
        ("0s", "1s"),
        ("1ms", "mo = 30 days"),
        ("1ns", "mo = 30 days"),
        ("1 fortnight", "y = 365 days"),
    ] {
        let out = rethread(&url, &["sessions", "prune", "--idle", refused], &[]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{refused}: {out:?}");
        assert!(said.contains(says), "{refused}: {said}");
        assert!(!said.contains("jiff"), "{refused}: {said}");
    }
    assert!(!dir.path().join("none.sqlite").exists(), "nothing created");
}

/// (A missing store holds nothing to remove: `newcomer.rs`, issue 41 item 15.)
#[test]
fn prune_refuses_a_span_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("none.sqlite").display());
    for bad in ["30", "-1d", "soon"] {
        let out = rethread(&url, &["sessions", "prune", "--idle", bad], &[]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
    }
    assert!(!dir.path().join("none.sqlite").exists(), "nothing created");
}

#[test]
fn sessions_list_and_show_say_the_bytes_each_session_holds_and_sort_by_them() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("s.sqlite").display());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = open_url(&url, OpenOptions::new()).await.unwrap();
        store.commit_turn(turn("a-small", 1, 10)).await.unwrap();
        store.commit_turn(turn("b-large", 3, 5000)).await.unwrap();
        store.commit_turn(turn("c-medium", 2, 1000)).await.unwrap();
    });
    let show = json_of(&rethread(
        &url,
        &["sessions", "show", "b-large", "--json"],
        &[],
    ));
    assert_eq!(show["mirror_bytes"], 5000);
    let rows = show["row_bytes"].as_u64().unwrap();
    assert!(rows > 30, "{show}");
    assert_eq!(show["stored_bytes"].as_u64().unwrap(), 5000 + rows);
    let out = rethread(&url, &["sessions", "show", "b-large"], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("stored bytes:"));

    let order = |args: &[&str]| -> Vec<String> {
        let list = json_of(&rethread(&url, args, &[]));
        let sessions = list["sessions"].as_array().unwrap().iter();
        sessions
            .map(|s| s["session"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        order(&["sessions", "list", "--json"]),
        ["a-small", "b-large", "c-medium"]
    );
    let by_bytes = ["sessions", "list", "--json", "--sort", "bytes"];
    assert_eq!(order(&by_bytes), ["b-large", "c-medium", "a-small"]);
    let top = [
        "sessions", "list", "--json", "--sort", "bytes", "--limit", "1",
    ];
    assert_eq!(order(&top), ["b-large"]);
    let out = rethread(&url, &["sessions", "list"], &[]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("BYTES"),
        "{out:?}"
    );
}

#[test]
fn doctor_warns_of_a_session_near_its_mirror_cap() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("s.sqlite").display());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = open_url(&url, OpenOptions::new()).await.unwrap();
        store.commit_turn(turn("near", 1, 950)).await.unwrap();
        store.commit_turn(turn("far", 1, 100)).await.unwrap();
    });
    let home = dir.path().join("home");
    let home = home.to_str().unwrap();
    let env = [("RETHREAD_MIRROR_CAP", "1000"), ("CODEX_HOME", home)];
    let out = rethread(&url, &["doctor", "--json"], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("session near mirrors 950 bytes, near its cap of 1000"),
        "{stderr}"
    );
    assert!(!stderr.contains("session far"), "{stderr}");
    let report = json_of(&out);
    assert_eq!(report["mirror_cap_bytes"], 1000, "{report}");
    assert_eq!(
        report["near_mirror_cap"],
        json!([{"session": "near", "mirror_bytes": 950}]),
        "{report}"
    );
    let out = rethread(
        &url,
        &["doctor"],
        &[("RETHREAD_MIRROR_CAP", "lots"), ("CODEX_HOME", home)],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// The cap set by `RETHREAD_MIRROR_CAP` or `chat --mirror-cap`: a turn past it commits
/// without its mirror, says so, and keeps nothing mirrored; a cap that is not a number of bytes
/// is a usage error.
#[test]
fn the_mirror_cap_is_set_by_the_variable_or_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("s.sqlite").display());
    let home = dir.path().join("home");
    let home = home.to_str().unwrap();
    type Run<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)]);
    let runs: [Run; 3] = [
        ("uncapped", &[], &[]),
        ("by-variable", &[], &[("RETHREAD_MIRROR_CAP", "100")]),
        ("by-flag", &["--mirror-cap", "100"], &[]),
    ];
    for (session, flags, env) in runs {
        let mut args = vec!["chat", "--session", session, "--json"];
        args.extend_from_slice(flags);
        args.push("hello");
        let mut env = env.to_vec();
        env.push(("CODEX_HOME", home));
        let out = rethread(&url, &args, &env);
        assert_eq!(out.status.code(), Some(0), "{session}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let show = json_of(&rethread(
            &url,
            &["sessions", "show", session, "--json"],
            &[],
        ));
        let mirrored = show["mirror_bytes"].as_u64().unwrap();
        if session == "uncapped" {
            assert!(mirrored > 100, "{show}");
        } else {
            assert_eq!(mirrored, 0, "{session}: {show}");
            assert!(stderr.contains("stopped mirroring"), "{session}: {stderr}");
        }
    }
    let args = ["chat", "--session", "x", "hello"];
    for (flags, env) in [
        (&["--mirror-cap", "0"][..], &[][..]),
        (&[][..], &[("RETHREAD_MIRROR_CAP", "64MB")][..]),
    ] {
        let mut all: Vec<&str> = args[..3].to_vec();
        all.extend_from_slice(flags);
        all.push("hello");
        let out = rethread(&url, &all, env);
        assert_eq!(out.status.code(), Some(2), "{all:?} {env:?}: {out:?}");
    }
}
