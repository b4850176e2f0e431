//! How `rethread` meets a person and a shell, as a process against the `fake-codex` binary:
//! `chat -` reads the message from stdin; the spinner shows on a terminal only (run under a
//! pseudo-terminal through `script(1)`); `chat --image` sends a file by path;
//! `completions SHELL` prints a completion script.

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use support::in_sandbox;

/// A store and a CODEX_HOME of its own.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        in_sandbox(&mut command, self.dir.path())
            .env("RUST_LOG", "off")
            .env_remove("FAKE_CODEX_FAULTS");
        command
    }

    fn rethread(&self, args: &[&str]) -> Command {
        let mut command = self.command(Path::new(env!("CARGO_BIN_EXE_rethread")));
        command.args(args);
        command
    }

    /// Runs `rethread args` with `input` on its stdin.
    fn with_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        let mut child = self
            .rethread(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    }
}

fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn chat_dash_reads_the_message_from_stdin() {
    let sandbox = Sandbox::new();
    let out = sandbox.with_stdin(&["chat", "--session", "s1", "-"], b"from stdin\n");
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "echo: from stdin\n");

    // Lines are kept; only the trailing newlines go.
    let out = sandbox.with_stdin(
        &["chat", "--json", "--session", "s1", "-"],
        b"line one\nline two\n\n",
    );
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    let reply: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(reply["reply"], "echo: line one\nline two");
    assert_eq!(reply["outcome"], "resumed");

    // Without `-` stdin is not read.
    let out = sandbox.with_stdin(&["chat", "--session", "s1", "argument"], b"ignored");
    assert_eq!(texts(&out).0, "echo: argument\n");
}

#[test]
fn chat_dash_with_nothing_or_not_utf8_on_stdin_is_a_usage_error_that_writes_nothing() {
    let sandbox = Sandbox::new();
    for input in [&b""[..], b"\n\n", b"  \n", b"\xff\xfe"] {
        let out = sandbox.with_stdin(&["chat", "--session", "s1", "-"], input);
        let (stdout, stderr) = texts(&out);
        assert_eq!(out.status.code(), Some(2), "{input:?}: {stderr}");
        assert_eq!(stdout, "");
        assert!(stderr.starts_with("rethread: "), "{stderr}");
        assert!(stderr.contains("stdin"), "{stderr}");
    }
    let out = sandbox.with_stdin(&["chat", "--json", "--session", "s1", "-"], b"");
    assert_eq!(out.status.code(), Some(2));
    let failure: Value = serde_json::from_str(&texts(&out).0).unwrap();
    assert_eq!(failure["error"]["kind"], "usage", "{failure}");
    // Nothing was written: the session does not exist.
    let out = sandbox
        .rethread(&["sessions", "show", "s1", "--json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// An empty message is refused the same way, given as the argument or on stdin: exit 2, one
/// line on stderr (the `--json` object's `error` of kind `usage`), nothing sent or stored.
#[test]
fn an_empty_message_argument_is_the_usage_error_an_empty_stdin_is() {
    let sandbox = Sandbox::new();
    let (_, from_stdin) = texts(&sandbox.with_stdin(&["chat", "--session", "s1", "-"], b""));
    for message in ["", "  ", "\n"] {
        let out = sandbox.with_stdin(&["chat", "--session", "s1", message], b"");
        let (stdout, stderr) = texts(&out);
        assert_eq!(out.status.code(), Some(2), "{message:?}: {stderr}");
        assert_eq!(stdout, "");
        assert_eq!(stderr, from_stdin, "{message:?}");
        let out = sandbox.with_stdin(&["chat", "--json", "--session", "s1", message], b"");
        assert_eq!(out.status.code(), Some(2));
        let failure: Value = serde_json::from_str(&texts(&out).0).unwrap();
        assert_eq!(failure["error"]["kind"], "usage", "{failure}");
    }
    let out = sandbox
        .rethread(&["sessions", "show", "s1", "--json"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "nothing was stored");
    assert!(
        !sandbox.dir.path().join("codex-home").exists(),
        "codex never started"
    );
}

/// `rethread args` under a pseudo-terminal (`script(1)`): stdout and stderr both a terminal.
/// `None` when `script` is not installed.
fn on_a_terminal(sandbox: &Sandbox, args: &[&str]) -> Option<String> {
    let rethread = env!("CARGO_BIN_EXE_rethread");
    let line = std::iter::once(rethread)
        .chain(args.iter().copied())
        .map(|word| format!("'{}'", word.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ");
    let mut command = sandbox.command(Path::new("script"));
    command
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::null());
    let out = match command.output() {
        Ok(out) => out,
        Err(error) => {
            eprintln!("skipping: no script(1) for a pseudo-terminal: {error}");
            return None;
        }
    };
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{args:?}: {stdout}{stderr}");
    Some(stdout)
}

#[test]
fn a_spinner_turns_on_a_terminal_only_and_never_with_json() {
    let sandbox = Sandbox::new();
    let Some(screen) = on_a_terminal(&sandbox, &["chat", "--session", "s1", "hello"]) else {
        return;
    };
    assert!(screen.contains("waiting for codex"), "{screen:?}");
    assert!(screen.contains("echo: hello"), "{screen:?}");
    // Cleared before the reply: the reply line does not carry it.
    let reply_line = screen
        .split(['\r', '\n'])
        .find(|l| l.contains("echo: hello"))
        .unwrap();
    assert!(!reply_line.contains("waiting"), "{screen:?}");

    let screen = on_a_terminal(&sandbox, &["chat", "--json", "--session", "s1", "hi"]).unwrap();
    assert!(!screen.contains("waiting for codex"), "{screen:?}");
    let json = screen.trim();
    let reply: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json:?}"));
    assert_eq!(reply["reply"], "echo: hi");

    // Not a terminal: no spinner.
    let out = sandbox
        .rethread(&["chat", "--session", "s1", "piped"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&out);
    assert_eq!(stdout, "echo: piped\n");
    assert!(!stderr.contains("waiting for codex"), "{stderr:?}");
}

#[test]
fn completions_print_a_script_for_every_shell_and_reject_others() {
    let sandbox = Sandbox::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = sandbox.rethread(&["completions", shell]).output().unwrap();
        let (script, stderr) = texts(&out);
        assert!(out.status.success(), "{shell}: {stderr}");
        for word in ["doctor", "completions", "sessions", "jobs", "log-format"] {
            assert!(script.contains(word), "{shell} lacks {word}");
        }
    }
    let out = sandbox.rethread(&["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = sandbox.rethread(&["completions"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The bash script loads and completes the commands (where bash is installed).
#[test]
fn the_bash_completion_script_completes_commands() {
    let rethread = env!("CARGO_BIN_EXE_rethread");
    let probe = format!(
        "source <('{rethread}' completions bash) && complete -p rethread && \
         COMP_WORDS=(rethread do) COMP_CWORD=1 && _rethread rethread do rethread && \
         echo \"${{COMPREPLY[@]}}\""
    );
    let out = match Command::new("bash").args(["-c", &probe]).output() {
        Ok(out) => out,
        Err(error) => {
            eprintln!("skipping: no bash: {error}");
            return;
        }
    };
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("_rethread"), "{stdout}");
    assert_eq!(stdout.lines().last(), Some("doctor"), "{stdout}");
}

/// `--image PATH` sends the file by path with the message (`localImage`, made absolute); the
/// turn's user row keeps it under `attachments`. A missing file is a usage error before
/// anything is sent or written.
#[test]
fn chat_image_sends_the_file_by_absolute_path_and_a_missing_one_is_a_usage_error() {
    let sandbox = Sandbox::new();
    std::fs::write(sandbox.dir.path().join("dot.png"), b"\x89PNG").unwrap();
    let out = sandbox
        .rethread(&["chat", "--session", "s1", "--image", "dot.png", "look"])
        .current_dir(sandbox.dir.path())
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "echo: look\n");
    let url = format!("redb:{}", sandbox.dir.path().join("store.redb").display());
    let rows = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = rethread_store::open_url(&url, rethread_store::OpenOptions::new())
            .await
            .unwrap();
        store.rows("s1", 0..10).await.unwrap()
    });
    assert_eq!(rows[0].body["text"], "look");
    let attachments = rows[0].body["attachments"].as_array().unwrap();
    assert_eq!(attachments.len(), 1, "{attachments:?}");
    assert_eq!(attachments[0]["type"], "localImage");
    let sent = Path::new(attachments[0]["path"].as_str().unwrap());
    assert!(sent.is_absolute(), "{sent:?}");
    assert_eq!(
        std::fs::canonicalize(sent).unwrap(),
        std::fs::canonicalize(sandbox.dir.path().join("dot.png")).unwrap()
    );

    for missing in ["nowhere.png", "."] {
        let out = sandbox
            .rethread(&[
                "chat",
                "--json",
                "--session",
                "s2",
                "--image",
                missing,
                "look",
            ])
            .current_dir(sandbox.dir.path())
            .output()
            .unwrap();
        let (stdout, stderr) = texts(&out);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        let failure: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(failure["error"]["kind"], "usage", "{failure}");
        assert!(stderr.contains("--image"), "{stderr}");
    }
}
