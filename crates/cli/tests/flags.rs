//! Issue 22, the CLI's flags: `--store` and `--codex-bin` show only on the commands that use
//! them and are a usage error (exit 2) elsewhere, before the command or after it;
//! `rethread app-server --session ID` works after `app-server` too (the other arguments still
//! go to codex verbatim), and so does `--no-mirror`, never passed to codex; `rethread help
//! app-server` lists rethread's own settings, while `rethread app-server --help` stays codex's.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use rethread_testkit::real::{thread_id, AppServerProcess};
use serde_json::Value;
use support::{fake_codex, rethread};

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(rethread());
    command
        .args(args)
        .env_remove("RETHREAD_STORE")
        .env_remove("RETHREAD_CODEX_BIN")
        .env_remove("RETHREAD_SESSION")
        .env("RUST_LOG", "off");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Each command's `--help` lists `--store` exactly when the command keeps sessions, and
/// `--codex-bin` exactly when it starts codex.
#[test]
fn global_flags_show_only_on_commands_that_use_them() {
    let commands: [(&[&str], bool, bool); 10] = [
        (&["chat"], true, true),
        (&["sessions", "list"], true, false),
        (&["sessions", "show"], true, false),
        (&["sessions", "forget"], true, false),
        (&["doctor"], true, true),
        (&["verify"], true, false),
        (&["migrate"], false, false),
        (&["completions"], false, false),
        (&["demo"], false, false),
        (&["app-server"], true, true),
    ];
    for (command, store, codex_bin) in commands {
        let mut args = vec!["help"];
        args.extend_from_slice(command);
        let out = run(&args, &[]);
        let help = text(&out.stdout);
        assert!(out.status.success(), "{command:?}: {}", text(&out.stderr));
        assert_eq!(help.contains("--store"), store, "{command:?}:\n{help}");
        assert_eq!(
            help.contains("--codex-bin"),
            codex_bin,
            "{command:?}:\n{help}"
        );
    }
}

#[test]
fn a_flag_where_it_does_not_apply_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("s.sqlite").display());
    let other = format!("sqlite:{}", dir.path().join("t.sqlite").display());
    let misplaced: [&[&str]; 7] = [
        &[
            "--store", "memory:", "migrate", "--from", &store, "--to", &other,
        ],
        &[
            "migrate", "--store", "memory:", "--from", &store, "--to", &other,
        ],
        &["--codex-bin", "/bin/true", "sessions", "list"],
        &["sessions", "list", "--codex-bin", "/bin/true"],
        &["--codex-bin", "/bin/true", "verify"],
        &["--store", "memory:", "completions", "bash"],
        &["completions", "bash", "--store", "memory:"],
    ];
    for args in misplaced {
        let out = run(args, &[]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert!(!dir.path().join("t.sqlite").exists(), "nothing was written");
    // Where they apply, before or after the command, and from the environment.
    let out = run(&["migrate", "--from", "memory:", "--to", &store], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for (args, env) in [
        (vec!["--store", store.as_str(), "sessions", "list"], vec![]),
        (vec!["sessions", "list", "--store", store.as_str()], vec![]),
        (
            vec!["sessions", "list"],
            vec![("RETHREAD_STORE", store.as_str())],
        ),
        (vec!["verify", "--store", store.as_str()], vec![]),
    ] {
        let out = run(&args, &env);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
    // The variable is ambient: a command that keeps no sessions ignores it.
    let out = run(
        &["completions", "bash"],
        &[
            ("RETHREAD_STORE", "memory:"),
            ("RETHREAD_CODEX_BIN", "/bin/true"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn help_app_server_lists_rethreads_own_settings_and_its_help_flag_stays_codexs() {
    let out = run(&["help", "app-server"], &[]);
    let help = text(&out.stdout);
    assert!(out.status.success());
    for setting in [
        "--session",
        "RETHREAD_SESSION",
        "RETHREAD_SESSION_WAIT",
        "RETHREAD_STORE",
        "RETHREAD_CODEX_BIN",
        "RETHREAD_LEASE_TTL",
        "RETHREAD_MIRROR",
        "--no-mirror",
    ] {
        assert!(help.contains(setting), "{setting}:\n{help}");
    }
    // `--help` after `app-server` is codex's: the fake answers it, rethread points the way,
    // and nothing else is said at the default log level (codex's help is no JSON-RPC).
    let fake = fake_codex();
    let out = run(
        &["app-server", "--help"],
        &[
            ("RETHREAD_CODEX_BIN", fake.to_str().unwrap()),
            ("RUST_LOG", ""),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("fake-codex"),
        "{}",
        text(&out.stdout)
    );
    assert!(!text(&out.stdout).contains("RETHREAD_LEASE_TTL"));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("rethread help app-server"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// A codex that writes the arguments it was given to `seen`, then is the fake.
fn recording_codex(dir: &Path, seen: &Path) -> PathBuf {
    let path = dir.join("codex");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > '{}'\nexec '{}' app-server\n",
            seen.display(),
            fake_codex().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn app_server_takes_its_session_after_app_server_too() {
    let home = tempfile::tempdir().unwrap();
    let seen = home.path().join("args");
    let codex = recording_codex(home.path(), &seen);
    let store = format!("sqlite:{}", home.path().join("rethread.sqlite").display());
    let cases: [(&str, &[&str], &[&str]); 3] = [
        (
            "leading",
            &["--session", "s1", "--listen", "stdio://"],
            &["--listen", "stdio://"],
        ),
        (
            "among codex's arguments",
            &["--listen", "stdio://", "--session", "s2", "-c", "k=v"],
            &["--listen", "stdio://", "-c", "k=v"],
        ),
        ("=", &["--session=s3"], &[]),
    ];
    for (case, args, to_codex) in cases {
        let session = match args.iter().position(|a| *a == "--session") {
            Some(i) => args[i + 1].to_string(),
            None => args[0].trim_start_matches("--session=").to_string(),
        };
        let env = [
            ("RETHREAD_CODEX_BIN", codex.to_str().unwrap()),
            ("RETHREAD_STORE", store.as_str()),
        ];
        let mut server = AppServerProcess::spawn_with(&rethread(), home.path(), args, &env)
            .await
            .unwrap();
        server.peer.initialize(false).await.unwrap();
        let started = server.peer.start_thread().await.unwrap();
        let thread = thread_id(&started);
        server.peer.run_turn(&thread, "hello", None).await.unwrap();
        server.peer.close_writer().await;
        let status = tokio::time::timeout(Duration::from_secs(20), server.wait())
            .await
            .expect("rethread exits")
            .unwrap();
        assert_eq!(status.code(), Some(0), "{case}");
        // codex got everything but rethread's own option.
        let got = std::fs::read_to_string(&seen).unwrap();
        let mut expected = vec!["app-server"];
        expected.extend_from_slice(to_codex);
        assert_eq!(got.lines().collect::<Vec<_>>(), expected, "{case}");
        // ... and the session was kept.
        let out = run(
            &["sessions", "show", &session, "--json", "--store", &store],
            &[],
        );
        assert!(out.status.success(), "{case}: {}", text(&out.stderr));
        let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(shown["thread_id"], thread.as_str(), "{case}");
    }
    // Named twice, or without an id: a usage error before codex starts.
    let codex_bin = codex.display().to_string();
    for args in [
        &["--session", "a", "app-server", "--session", "b"][..],
        &[
            "app-server",
            "--session",
            "a",
            "--listen",
            "stdio://",
            "--session",
            "b",
        ],
        &["app-server", "--listen", "stdio://", "--session"],
        &["app-server", "--session="],
    ] {
        let _ = std::fs::remove_file(&seen);
        let out = run(args, &[("RETHREAD_CODEX_BIN", &codex_bin)]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(!seen.exists(), "{args:?} started codex");
    }
}

/// `--no-mirror` is rethread's before `app-server` and right after it: codex never gets it, and
/// the session's turn is kept without its rollout mirrored (mirrored without the flag).
#[tokio::test]
async fn app_server_takes_no_mirror_after_app_server_too() {
    let home = tempfile::tempdir().unwrap();
    let seen = home.path().join("args");
    let codex = recording_codex(home.path(), &seen);
    // `AppServerProcess` runs `<binary> app-server ARGS`: a wrapper puts the flag before it.
    let before = home.path().join("rethread-no-mirror");
    std::fs::write(
        &before,
        format!(
            "#!/bin/sh\nshift\nexec '{}' --no-mirror app-server \"$@\"\n",
            rethread().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&before, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cases: [(&str, PathBuf, &[&str], u64); 3] = [
        ("before app-server", before, &[], 0),
        ("after app-server", rethread(), &["--no-mirror"], 0),
        ("not given", rethread(), &[], 1),
    ];
    for (case, binary, args, mirror_files) in cases {
        let store = format!(
            "sqlite:{}",
            home.path().join(format!("{case}.sqlite")).display()
        );
        let env = [
            ("RETHREAD_CODEX_BIN", codex.to_str().unwrap()),
            ("RETHREAD_STORE", store.as_str()),
            ("RETHREAD_SESSION", "s1"),
            ("RETHREAD_MIRROR", "on"),
        ];
        let mut server = AppServerProcess::spawn_with(&binary, home.path(), args, &env)
            .await
            .unwrap();
        server.peer.initialize(false).await.unwrap();
        let thread = thread_id(&server.peer.start_thread().await.unwrap());
        server.peer.run_turn(&thread, "hello", None).await.unwrap();
        server.peer.close_writer().await;
        let status = tokio::time::timeout(Duration::from_secs(20), server.wait())
            .await
            .expect("rethread exits")
            .unwrap();
        assert_eq!(status.code(), Some(0), "{case}");
        let got = std::fs::read_to_string(&seen).unwrap();
        assert_eq!(got.lines().collect::<Vec<_>>(), ["app-server"], "{case}");
        let out = run(&["verify", "--json", "--store", &store], &[]);
        assert!(out.status.success(), "{case}: {}", text(&out.stderr));
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["sessions"], 1, "{case}: {report}");
        assert_eq!(report["mirror_files"], mirror_files, "{case}: {report}");
    }
}

/// An empty `RETHREAD_STORE` or `RETHREAD_CODEX_BIN` is unset, as an empty `RETHREAD_SESSION`
/// is: the default store, `codex` on `PATH`. An empty `--store` or `--codex-bin` typed on the
/// command line is a usage error, as `--session ""` is.
#[test]
fn an_empty_store_or_codex_bin_variable_is_unset() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let default_store = format!(
        "sqlite:{}",
        data.join("rethread").join("rethread.sqlite").display()
    );
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(fake_codex(), bin.join("codex")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let home = dir.path().join("codex-home");
    let env = [
        ("RETHREAD_STORE", ""),
        ("RETHREAD_CODEX_BIN", ""),
        ("XDG_DATA_HOME", data.to_str().unwrap()),
        ("PATH", path.as_str()),
        ("CODEX_HOME", home.to_str().unwrap()),
    ];
    let out = run(&["chat", "--session", "s1", "--json", "hello"], &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["reply"], "echo: hello", "{reply}");
    // It went to the default store, which the empty variable reads too.
    for (args, env) in [
        (
            vec![
                "sessions",
                "show",
                "s1",
                "--json",
                "--store",
                &default_store,
            ],
            &[][..],
        ),
        (vec!["sessions", "show", "s1", "--json"], &env[..]),
    ] {
        let out = run(&args, env);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(shown["thread_id"], reply["thread_id"], "{args:?}");
    }
    // app-server and doctor find codex on PATH too.
    for args in [&["app-server"][..], &["doctor", "--json"]] {
        let out = run(args, &env);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    // Typed empty, before the command or after it: a usage error; nothing is started.
    for args in [
        &["sessions", "list", "--store", ""][..],
        &["--store", "", "sessions", "list"],
        &["chat", "--session", "s1", "--codex-bin", "", "hi"],
        &["--codex-bin", "", "chat", "--session", "s1", "hi"],
        &["--store=", "doctor"],
    ] {
        let out = run(args, &env);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

/// The options only `app-server` takes are listed in its help, not the top-level one (they
/// are still taken before `app-server`: `tests/app_server.rs`).
#[test]
fn the_top_level_help_lists_no_option_of_app_server_alone() {
    let top = text(&run(&["--help"], &[]).stdout);
    let app_server = text(&run(&["help", "app-server"], &[]).stdout);
    for option in [
        "--session",
        "--config",
        "--enable",
        "--disable",
        "--no-mirror",
    ] {
        assert!(!top.contains(option), "{option}:\n{top}");
        assert!(app_server.contains(option), "{option}:\n{app_server}");
    }
    assert!(top.contains("--store"), "{top}");
}

/// A usage error's usage line says what was typed: `--codex-bin` and `--store` set by
/// `RETHREAD_CODEX_BIN` / `RETHREAD_STORE` do not show there as if required. Help, which
/// shows the variables, is unchanged.
#[test]
fn a_usage_line_does_not_list_the_variables_as_required() {
    let env = [
        ("RETHREAD_CODEX_BIN", "/bin/true"),
        ("RETHREAD_STORE", "memory:"),
    ];
    for args in [
        &["chat"][..],
        &["chat", "--session", "s1"],
        &["sessions", "show"],
    ] {
        let plain = run(args, &[]);
        let out = run(args, &env);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        assert_eq!(stderr, text(&plain.stderr), "{args:?}");
        assert!(stderr.contains("Usage: rethread"), "{stderr}");
    }
    let help = text(&run(&["chat", "--help"], &env).stdout);
    assert!(help.contains("RETHREAD_CODEX_BIN"), "{help}");
}

/// Issue 35, defect 9: `--help` names `RETHREAD_STORE` but never prints its value (a store
/// URL may hold a password), whichever command and however help is asked for.
#[test]
fn help_never_prints_the_store_variables_value() {
    let env = [("RETHREAD_STORE", "postgres://alice:s3cret@127.0.0.1:9/db")];
    let commands: [&[&str]; 9] = [
        &[],
        &["chat"],
        &["sessions"],
        &["sessions", "list"],
        &["sessions", "show"],
        &["sessions", "forget"],
        &["doctor"],
        &["verify"],
        &["app-server"],
    ];
    for command in commands {
        let asked = [
            [&["help"][..], command].concat(),
            [command, &["--help"][..]].concat(),
            [command, &["-h"][..]].concat(),
        ];
        for args in asked {
            if command == ["app-server"] && args[0] != "help" {
                continue; // codex's own help
            }
            let out = run(&args, &env);
            let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
            assert!(!stdout.contains("s3cret"), "{args:?}:\n{stdout}");
            assert!(!stderr.contains("s3cret"), "{args:?}:\n{stderr}");
            if !command.is_empty() && command != ["sessions"] {
                assert!(stdout.contains("RETHREAD_STORE"), "{args:?}:\n{stdout}");
            }
        }
    }
}
