//! Store keys from the command line (issue 43): `rethread keygen PATH`, `--store-key-file` /
//! `RETHREAD_STORE_KEY_FILE` on the commands that keep sessions, `migrate --from-key-file /
//! --to-key-file`. A key file is checked before anything else happens, and the key is never
//! printed. Nothing here needs the sealing itself: these hold whether a key seals or not.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use rethread_store::{open_url, OpenOptions, TurnCommit};
use serde_json::json;
use support::{describe, fake_codex, rethread, stderr, stdout};

/// `rethread ARGS` with `env`, none of the ambient rethread variables, and no stdin.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(rethread());
    command
        .args(args)
        .env_remove("RETHREAD_STORE")
        .env_remove("RETHREAD_STORE_KEY_FILE")
        .env_remove("RETHREAD_CODEX_BIN")
        .env_remove("RETHREAD_SESSION")
        .env("RUST_LOG", "off")
        .stdin(Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

/// Variables for a run.
type Env<'a> = &'a [(&'a str, &'a str)];

/// The arguments and variables of a run.
type Run<'a> = (Vec<&'a str>, Env<'a>);

fn sqlite(dir: &Path, name: &str) -> (String, PathBuf) {
    let path = dir.join(name);
    (format!("sqlite:{}", path.display()), path)
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A new key file at `path` by `rethread keygen`; its text (64 hex digits and a newline).
fn keygen(path: &Path) -> String {
    let out = run(&["keygen", path.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    std::fs::read_to_string(path).unwrap()
}

/// Session `id` with two rows, written through the library into the unsealed store `url`.
fn fill(url: &str, id: &str) {
    support::block_on(async {
        let store = open_url(url, OpenOptions::new()).await.unwrap();
        let rows = vec![json!({"role": "user", "text": "hi"})];
        let commit = TurnCommit::new(id, format!("t-{id}"), rows);
        store.commit_turn(commit).await.unwrap();
    });
}

#[test]
fn keygen_writes_an_owner_only_key_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.key");
    let out = run(&["keygen", path.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        stdout(&out).contains(&path.display().to_string()),
        "{}",
        describe(&out)
    );
    let metadata = std::fs::metadata(&path).unwrap();
    assert_eq!(metadata.permissions().mode() & 0o777, 0o600);
    let key = std::fs::read_to_string(&path).unwrap();
    let hex = key.strip_suffix('\n').expect("a newline at the end");
    assert!(
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key:?}"
    );
    assert!(!stdout(&out).contains(hex) && !stderr(&out).contains(hex));

    // Anything at the path is kept: a key, another file, a link (even a dangling one).
    let other = dir.path().join("notes.txt");
    std::fs::write(&other, "keep me").unwrap();
    let dangling = dir.path().join("dangling.key");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
    for taken in [&path, &other, &dangling] {
        let out = run(&["keygen", taken.to_str().unwrap()], &[]);
        assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
        assert!(
            stderr(&out).contains(&taken.display().to_string()),
            "{}",
            describe(&out)
        );
        assert!(out.stdout.is_empty());
    }
    assert_eq!(std::fs::read_to_string(&path).unwrap(), key);
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "keep me");
    assert!(!dir.path().join("nowhere").exists());

    let help = run(&["keygen", "--help"], &[]);
    assert!(help.status.success(), "{}", describe(&help));
    assert!(stdout(&help).contains("0600"), "{}", stdout(&help));
}

/// A key file that may be read by others, is not a key, is missing or is not a file: exit 2,
/// naming the file, whichever way it is named, before any store is opened or created.
#[test]
fn a_key_file_that_cannot_be_used_is_refused_before_anything_happens() {
    let dir = tempfile::tempdir().unwrap();
    let (store, store_path) = sqlite(dir.path(), "rethread.sqlite");
    let exposed = dir.path().join("exposed.key");
    keygen(&exposed);
    set_mode(&exposed, 0o644);
    let group = dir.path().join("group.key");
    keygen(&group);
    set_mode(&group, 0o640);
    let malformed = dir.path().join("malformed.key");
    std::fs::write(&malformed, "not a key: s3cret-passphrase\n").unwrap();
    set_mode(&malformed, 0o600);
    let missing = dir.path().join("missing.key");
    let home = dir.path().join("codex-home");
    let codex = fake_codex();
    let sandbox = [
        ("RETHREAD_CODEX_BIN", codex.to_str().unwrap()),
        ("CODEX_HOME", home.to_str().unwrap()),
    ];
    let cases = [
        (&exposed, "chmod 600"),
        (&group, "chmod 600"),
        (&malformed, "64 hexadecimal digits"),
        (&missing, "cannot read"),
        (&dir.path().to_path_buf(), "not a regular file"),
    ];
    for (key, said) in cases {
        let key = key.to_str().unwrap();
        let with_env = [&sandbox[..], &[("RETHREAD_STORE_KEY_FILE", key)]].concat();
        let runs: [Run; 5] = [
            (
                vec![
                    "chat",
                    "--store",
                    &store,
                    "--store-key-file",
                    key,
                    "--session",
                    "s",
                    "hi",
                ],
                &sandbox,
            ),
            (
                vec![
                    "--store-key-file",
                    key,
                    "sessions",
                    "list",
                    "--store",
                    &store,
                ],
                &sandbox,
            ),
            (vec!["verify", "--store", &store], &with_env),
            (vec!["doctor", "--store", &store], &with_env),
            (
                vec!["exec", "--store", &store, "--skip-git-repo-check", "hi"],
                &with_env,
            ),
        ];
        for (args, env) in runs {
            let out = run(&args, env);
            let context = format!("{args:?}: {}", describe(&out));
            assert_eq!(out.status.code(), Some(2), "{context}");
            let message = stderr(&out);
            assert!(message.contains(key) && message.contains(said), "{context}");
            assert!(!message.contains("s3cret"), "{context}");
            assert!(out.stdout.is_empty(), "{context}");
            assert!(!store_path.exists(), "{context}: the store was created");
            assert!(!home.exists(), "{context}: codex was started");
        }
    }
}

/// An empty `RETHREAD_STORE_KEY_FILE` is unset, as an empty `RETHREAD_STORE` is; typed empty,
/// `--store-key-file` is a usage error; before the command it goes to the command.
#[test]
fn an_empty_key_file_variable_is_unset_and_a_typed_empty_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = sqlite(dir.path(), "rethread.sqlite");
    fill(&store, "s1");
    let env = [("RETHREAD_STORE_KEY_FILE", "")];
    let out = run(&["sessions", "list", "--store", &store], &env);
    assert!(out.status.success(), "{}", describe(&out));
    for args in [
        &[
            "sessions",
            "list",
            "--store",
            &store,
            "--store-key-file",
            "",
        ][..],
        &[
            "--store-key-file",
            "",
            "sessions",
            "list",
            "--store",
            &store,
        ],
        &["--store-key-file", "/k", "completions", "bash"],
    ] {
        let out = run(args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", describe(&out));
    }
}

/// `migrate` takes a key file for each side (either may be absent) and refuses the one-store
/// `--store-key-file` and `RETHREAD_STORE_KEY_FILE`; a refused key file changes nothing.
#[test]
fn migrate_takes_a_key_file_for_each_store() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, _) = sqlite(dir.path(), "plain.sqlite");
    let (sealed, sealed_path) = sqlite(dir.path(), "sealed.sqlite");
    let (back, _) = sqlite(dir.path(), "back.sqlite");
    fill(&plain, "s1");
    let key = dir.path().join("store.key");
    keygen(&key);
    let key = key.to_str().unwrap();

    // Refused: the one-store flag and variable, and a key file others may read.
    let exposed = dir.path().join("exposed.key");
    keygen(&exposed);
    set_mode(&exposed, 0o644);
    let exposed = exposed.to_str().unwrap();
    let refused: [(Vec<&str>, Env, &str); 4] = [
        (
            vec![
                "--store-key-file",
                key,
                "migrate",
                "--from",
                &plain,
                "--to",
                &sealed,
            ],
            &[],
            "--to-key-file",
        ),
        (
            vec![
                "migrate",
                "--store-key-file",
                key,
                "--from",
                &plain,
                "--to",
                &sealed,
            ],
            &[],
            "--store-key-file",
        ),
        (
            vec!["migrate", "--from", &plain, "--to", &sealed],
            &[("RETHREAD_STORE_KEY_FILE", key)],
            "--to-key-file",
        ),
        (
            vec![
                "migrate",
                "--from",
                &plain,
                "--to",
                &sealed,
                "--to-key-file",
                exposed,
            ],
            &[],
            "chmod 600",
        ),
    ];
    for (args, env, said) in refused {
        let out = run(&args, env);
        let context = format!("{args:?}: {}", describe(&out));
        assert_eq!(out.status.code(), Some(2), "{context}");
        assert!(stderr(&out).contains(said), "{context}");
        assert!(
            !sealed_path.exists(),
            "{context}: the destination was created"
        );
    }

    // Taken: into a store with a key, and out of it with the same key.
    let env = [("RETHREAD_STORE_KEY_FILE", "")];
    let to_sealed = [
        "migrate",
        "--from",
        &plain,
        "--to",
        &sealed,
        "--to-key-file",
        key,
        "--json",
    ];
    let out = run(&to_sealed, &env);
    assert!(out.status.success(), "{}", describe(&out));
    let out = run(
        &[
            "migrate",
            "--from",
            &sealed,
            "--from-key-file",
            key,
            "--to",
            &back,
        ],
        &[],
    );
    assert!(out.status.success(), "{}", describe(&out));
    let shown = run(&["sessions", "show", "s1", "--json", "--store", &back], &[]);
    assert!(shown.status.success(), "{}", describe(&shown));
    assert_eq!(support::json_of(&shown)["thread_id"], "t-s1");
}

/// Issue 43: the key is in nothing a command prints, at the most verbose logging, nor in
/// help with the variable set.
#[test]
fn the_key_is_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("store.key");
    let key_text = keygen(&key_path);
    let hex = key_text.trim_end().to_string();
    let bytes: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let key = key_path.to_str().unwrap();
    let (store, _) = sqlite(dir.path(), "rethread.sqlite");
    let (copy, _) = sqlite(dir.path(), "copy.sqlite");
    let home = dir.path().join("codex-home");
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let codex = fake_codex();
    let env = [
        ("RUST_LOG", "trace"),
        ("RETHREAD_CODEX_BIN", codex.to_str().unwrap()),
        ("CODEX_HOME", home.to_str().unwrap()),
    ];
    let with_var = [&env[..], &[("RETHREAD_STORE_KEY_FILE", key)]].concat();
    let work = work.to_str().unwrap();
    let runs: Vec<Run> = vec![
        (
            vec![
                "chat",
                "--store",
                &store,
                "--store-key-file",
                key,
                "--session",
                "s1",
                "hello",
            ],
            &env,
        ),
        (
            vec![
                "--store-key-file",
                key,
                "sessions",
                "list",
                "--store",
                &store,
            ],
            &env,
        ),
        (
            vec!["sessions", "show", "s1", "--rows", "--store", &store],
            &with_var,
        ),
        (vec!["doctor", "--store", &store], &with_var),
        (vec!["verify", "--store", &store, "--json"], &with_var),
        (
            vec![
                "exec",
                "--store",
                &store,
                "--skip-git-repo-check",
                "--cd",
                work,
                "hi",
            ],
            &with_var,
        ),
        (vec!["app-server", "--store", &store], &with_var),
        (
            vec![
                "migrate",
                "--from",
                &store,
                "--from-key-file",
                key,
                "--to",
                &copy,
                "--to-key-file",
                key,
            ],
            &env,
        ),
        (
            vec!["sessions", "prune", "--idle", "1s", "--store", &store],
            &with_var,
        ),
        (
            vec!["sessions", "forget", "s1", "--store", &store],
            &with_var,
        ),
        (vec!["--help"], &with_var),
        (vec!["chat", "--help"], &with_var),
        (vec!["keygen", "--help"], &with_var),
        (vec!["migrate", "--help"], &with_var),
    ];
    for (args, env) in runs {
        let out = run(&args, env);
        let context = format!("{args:?}: {}", describe(&out));
        if args[0] == "chat" && args.len() > 2 {
            assert!(out.status.success(), "{context}");
        }
        for stream in [&out.stdout, &out.stderr] {
            let text = String::from_utf8_lossy(stream).to_lowercase();
            assert!(!text.contains(&hex), "{context}");
            assert!(!stream.windows(32).any(|w| w == bytes), "{context}");
        }
    }
}

/// rethread installed as `codex` reads `RETHREAD_STORE_KEY_FILE` for the commands that open
/// the store (`exec`, `app-server`), refusing an exposed key before anything happens, and
/// not for the commands it hands to the real codex.
#[test]
fn installed_as_codex_the_key_file_variable_is_checked_where_a_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let as_codex = bin.join("codex");
    std::os::unix::fs::symlink(rethread(), &as_codex).unwrap();
    let exposed = dir.path().join("exposed.key");
    keygen(&exposed);
    set_mode(&exposed, 0o644);
    let (store, store_path) = sqlite(dir.path(), "rethread.sqlite");
    let home = dir.path().join("codex-home");
    let codex = fake_codex();
    let run_as_codex = |args: &[&str]| {
        Command::new(&as_codex)
            .args(args)
            .env("RETHREAD_STORE", &store)
            .env("RETHREAD_STORE_KEY_FILE", &exposed)
            .env("RETHREAD_CODEX_BIN", &codex)
            .env("CODEX_HOME", &home)
            .env_remove("RETHREAD_SESSION")
            .env("RUST_LOG", "off")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    for args in [
        &["exec", "--skip-git-repo-check", "hi"][..],
        &["app-server"],
    ] {
        let out = run_as_codex(args);
        let context = format!("{args:?}: {}", describe(&out));
        assert_eq!(out.status.code(), Some(2), "{context}");
        assert!(
            stderr(&out).contains(exposed.to_str().unwrap()),
            "{context}"
        );
        assert!(!store_path.exists() && !home.exists(), "{context}");
    }
    let out = run_as_codex(&["--version"]);
    assert!(out.status.success(), "{}", describe(&out));
}

/// Issue 43: a sealed store never opens without its key, nor with another: exit 2 naming
/// what to give (the key file, for a wrong key), nothing changed; with its key it opens; a
/// key given for an unsealed store holding sessions is refused (seal a copy with migrate).
#[test]
fn a_sealed_store_opens_only_with_its_key_and_a_refusal_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, _) = sqlite(dir.path(), "plain.sqlite");
    let (sealed, sealed_path) = sqlite(dir.path(), "sealed.sqlite");
    fill(&plain, "s1");
    let (key, other) = (dir.path().join("a.key"), dir.path().join("b.key"));
    keygen(&key);
    keygen(&other);
    let (key, other) = (key.to_str().unwrap(), other.to_str().unwrap());
    let copy = [
        "migrate",
        "--from",
        &plain,
        "--to",
        &sealed,
        "--to-key-file",
        key,
    ];
    assert!(run(&copy, &[]).status.success());
    let before = std::fs::read(&sealed_path).unwrap();
    let show = |extra: &[&str]| {
        let mut args = vec!["sessions", "show", "s1", "--json", "--store", &sealed];
        args.extend_from_slice(extra);
        run(&args, &[])
    };
    let none = show(&[]);
    assert_eq!(none.status.code(), Some(2), "{}", describe(&none));
    assert!(stderr(&none).contains("is sealed"), "{}", describe(&none));
    let wrong = show(&["--store-key-file", other]);
    assert_eq!(wrong.status.code(), Some(2), "{}", describe(&wrong));
    assert!(
        stderr(&wrong).contains(other),
        "the key file is named: {}",
        describe(&wrong)
    );
    assert_eq!(
        std::fs::read(&sealed_path).unwrap(),
        before,
        "a refusal changes nothing"
    );
    let right = show(&["--store-key-file", key]);
    assert!(right.status.success(), "{}", describe(&right));
    assert_eq!(support::json_of(&right)["thread_id"], "t-s1");
    let unsealed = run(
        &[
            "sessions",
            "show",
            "s1",
            "--store",
            &plain,
            "--store-key-file",
            key,
        ],
        &[],
    );
    assert_eq!(unsealed.status.code(), Some(2), "{}", describe(&unsealed));
    assert!(
        stderr(&unsealed).contains("migrate --to-key-file"),
        "{}",
        describe(&unsealed)
    );
}
