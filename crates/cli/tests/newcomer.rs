//! Issue 41, items 13 to 16: what a new user met following the README, through the `rethread`
//! binary on `fake-codex`: the fake's temporary home left behind by a normal `chat`, `sessions
//! prune` on a store that does not exist yet, `--help` showing the variables' values, a dry
//! run that did not name the lease records it would remove, the busy message that did not say
//! how to wait, and `verify`'s full bar over an empty store.

mod support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rethread_store::{open_url, LeaseOwner, LocalOwner, OpenOptions};
use support::{
    block_on, describe, fake_codex, json_of, rethread, stderr, stdout, wait_out_the_shortest_idle,
};

/// `rethread args` with `env`, rethread's own variables and `CODEX_HOME` unset otherwise.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(rethread());
    command.args(args).env("RUST_LOG", "error");
    for var in [
        "RETHREAD_STORE",
        "RETHREAD_CODEX_BIN",
        "RETHREAD_SESSION",
        "RETHREAD_MIRROR",
        "RETHREAD_MIRROR_CAP",
        "CODEX_HOME",
        "FAKE_CODEX_PROFILE",
        "FAKE_CODEX_FAULTS",
    ] {
        command.env_remove(var);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

/// Issue 41, item 13: `rethread chat` on `fake-codex` without `CODEX_HOME` (the README's
/// offline try) ended normally and left `/tmp/fake-codex-home-*` behind each time, where the
/// README says the fake's temporary home is removed when it exits.
#[test]
fn a_normal_chat_on_the_fake_leaves_no_temporary_home_behind() {
    let dir = tempfile::tempdir().unwrap();
    let temp = dir.path().join("tmp");
    std::fs::create_dir(&temp).unwrap();
    let store = format!("sqlite:{}", dir.path().join("s.sqlite").display());
    let fake = fake_codex();
    let out = run(
        &["chat", "--session", "s", "hello"],
        &[
            ("RETHREAD_STORE", &store),
            ("RETHREAD_CODEX_BIN", fake.to_str().unwrap()),
            ("TMPDIR", temp.to_str().unwrap()),
            // The binder's home is then `~/.codex`: this test's own.
            ("HOME", dir.path().to_str().unwrap()),
        ],
    );
    assert!(out.status.success(), "{}", describe(&out));
    // The home goes once the fake is gone (its remover may finish just after `chat`).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<_> = std::fs::read_dir(&temp)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|name| name.to_string_lossy().starts_with("fake-codex-home-"))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left behind: {left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 41, item 15: the README's cron line, `sessions prune --idle 30d --json`, before the
/// store exists failed (exit 1) and printed nothing on stdout, so its log stayed empty, where
/// `list`, `doctor` and `verify` read a missing store as empty. A missing store holds nothing
/// to remove: exit 0, the usual report, `no store yet` on stderr, and nothing created.
#[test]
fn prune_on_a_missing_store_removes_nothing_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for url in ["sqlite", "redb"].map(|scheme| {
        let path = dir.path().join("typo").join(format!("rethread.{scheme}"));
        format!("{scheme}:{}", path.display())
    }) {
        let env = [("RETHREAD_STORE", url.as_str())];
        let out = run(&["sessions", "prune", "--idle", "30d", "--json"], &env);
        assert_eq!(out.status.code(), Some(0), "{url}: {}", describe(&out));
        let report = json_of(&out);
        assert_eq!(report["removed"], serde_json::json!([]), "{report}");
        assert_eq!(report["dry_run"], false, "{report}");
        assert!(
            stderr(&out).contains("no store yet at"),
            "{}",
            describe(&out)
        );
        for args in [&["--dry-run"][..], &[]] {
            let mut line = vec!["sessions", "prune", "--idle", "30d"];
            line.extend(args);
            let out = run(&line, &env);
            assert_eq!(out.status.code(), Some(0), "{args:?}: {}", describe(&out));
            assert!(
                stdout(&out).contains("remove") && stdout(&out).contains(" 0 idle sessions"),
                "{}",
                describe(&out)
            );
        }
        assert!(!dir.path().join("typo").exists(), "{url}: nothing created");
    }
}

/// Issue 41, item 15: under `--json` a prune that fails is still one JSON object on stdout,
/// with `error` (`kind`, `message`), as the CLI contract says of every `--json` command.
#[test]
fn a_failed_prune_under_json_is_one_object_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    // A store path that is a directory: refused at once.
    let url = format!("sqlite:{}", dir.path().display());
    let out = run(
        &["sessions", "prune", "--idle", "30d", "--json"],
        &[("RETHREAD_STORE", &url)],
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let report = json_of(&out);
    assert_eq!(report["error"]["kind"], "store", "{report}");
    assert!(
        report["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot open store"),
        "{report}"
    );
}

/// Issue 41, item 16: `--help` printed `[env: RETHREAD_CODEX_BIN=]` with the variable unset,
/// and would print its value when set. No command's help shows a variable's value.
#[test]
fn help_names_the_variables_and_shows_none_of_their_values() {
    let commands: [&[&str]; 9] = [
        &["--help"],
        &["help", "chat"],
        &["help", "doctor"],
        &["help", "verify"],
        &["help", "sessions", "list"],
        &["help", "sessions", "show"],
        &["help", "sessions", "forget"],
        &["help", "sessions", "prune"],
        &["help", "exec"],
    ];
    for env in [
        &[][..],
        &[
            ("RETHREAD_CODEX_BIN", "/secret/codex"),
            ("RETHREAD_STORE", "postgres://u:secret@db/rethread"),
        ],
    ] {
        let mut seen = [false; 2];
        for args in commands {
            let out = run(args, env);
            assert!(out.status.success(), "{args:?}: {}", describe(&out));
            let help = stdout(&out);
            for (i, var) in ["RETHREAD_CODEX_BIN", "RETHREAD_STORE"].iter().enumerate() {
                assert!(
                    !help.contains(&format!("{var}=")),
                    "{args:?} {env:?}:\n{help}"
                );
                seen[i] |= help.contains(&format!("[env: {var}]"));
            }
            assert!(!help.contains("secret"), "{args:?}:\n{help}");
        }
        assert_eq!(seen, [true, true], "the variables are still named");
    }
}

/// Issue 41, item 16: `sessions prune --dry-run` said how many lease records it would remove
/// but not which; they are listed with the sessions, as `--json` lists them (`kind` lease).
#[test]
fn a_dry_run_names_the_lease_records_it_would_remove() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("s.sqlite").display());
    let holder = LocalOwner::new();
    block_on(async {
        let store = open_url(&url, OpenOptions::new()).await.unwrap();
        // A host that took a session and left before its first turn: a lease record only.
        let day = Duration::from_secs(86_400);
        let left = store
            .acquire_lease("left-before-its-turn", holder.owner(), day)
            .await
            .unwrap();
        assert!(store.release_lease(&left).await.unwrap());
    });
    wait_out_the_shortest_idle();
    for dry_run in [true, false] {
        let mut args = vec!["sessions", "prune", "--idle", "1s"];
        if dry_run {
            args.push("--dry-run");
        }
        let out = run(&args, &[("RETHREAD_STORE", &url)]);
        assert!(out.status.success(), "{}", describe(&out));
        let said = stdout(&out);
        let row = said
            .lines()
            .find(|line| line.contains("left-before-its-turn"))
            .unwrap_or_else(|| panic!("dry_run={dry_run}: not named:\n{said}"));
        assert!(row.contains("lease"), "{said}");
    }
}

/// Issue 41, item 16: `chat` on a session another host holds exits 75 with a message that
/// did not say how to wait for it; it names `--wait SECS` now (the setting is `chat`'s flag).
#[test]
fn the_busy_message_says_how_to_wait() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("s.sqlite").display());
    let remote = LeaseOwner {
        host: "gateway-7".into(),
        pid: 31337,
        started_at_ms: 1_700_000_000_000,
        instance: 1,
        process: None,
    };
    block_on(async {
        let store = open_url(&url, OpenOptions::new()).await.unwrap();
        store
            .acquire_lease("held", &remote, Duration::from_secs(120))
            .await
            .unwrap();
    });
    let fake = fake_codex();
    let home = dir.path().join("home");
    let env = [
        ("RETHREAD_STORE", url.as_str()),
        ("RETHREAD_CODEX_BIN", fake.to_str().unwrap()),
        ("CODEX_HOME", home.to_str().unwrap()),
    ];
    let out = run(&["chat", "--session", "held", "hello"], &env);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let said = stderr(&out);
    assert_eq!(said.trim().lines().count(), 1, "{said}");
    assert!(
        said.contains("is busy") && said.contains("--wait SECS"),
        "{said}"
    );
    let out = run(&["chat", "--session", "held", "--json", "hello"], &env);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let report = json_of(&out);
    assert_eq!(report["error"]["kind"], "session_busy", "{report}");
    assert!(
        report["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--wait SECS"),
        "{report}"
    );
}

/// Issue 41, item 16: `verify` on a terminal drew a full bar over an empty store (0/0 taken
/// as done). An empty store shows no bar.
#[test]
fn verify_of_an_empty_store_draws_no_full_bar() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("s.sqlite").display());
    // An existing store, with nothing in it.
    block_on(async { drop(open_url(&url, OpenOptions::new()).await.unwrap()) });
    let line = format!("'{}' --store '{url}' verify", rethread().display());
    let out = match Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("TERM", "xterm-256color")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => out,
        Err(error) => {
            eprintln!("skipping: no script(1) for a pseudo-terminal: {error}");
            return;
        }
    };
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("0 session(s)"), "{shown}");
    assert!(!shown.contains("[====="), "a full bar at 0/0: {shown:?}");
}

/// Issue 41, item 14: the README's line that installs bash completions failed where
/// `~/.local/share/bash-completion/completions` did not exist yet (a new user's home). The
/// line, taken from the README's shell block as it stands, is run in a new, empty home.
#[test]
fn the_readmes_completions_line_works_in_a_new_home() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let line = readme
        .split("```sh\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .flat_map(str::lines)
        .map(|line| line.split(" #").next().unwrap_or_default().trim())
        .find(|line| line.contains("rethread completions bash"))
        .expect("README.md gives the bash completions line in a ```sh block");
    let home = tempfile::tempdir().unwrap();
    let bin = rethread();
    let path = std::env::join_paths(std::iter::once(bin.parent().unwrap().to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let out = Command::new("sh")
        .args(["-ec", line])
        .env("HOME", home.path())
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(out.status.success(), "`{line}`: {}", describe(&out));
    let script = home
        .path()
        .join(".local/share/bash-completion/completions/rethread");
    let script = std::fs::read_to_string(&script).unwrap();
    assert!(script.contains("_rethread"), "{script}");
}
