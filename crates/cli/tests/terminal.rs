//! Issue 22, how output meets a terminal, run under a pseudo-terminal (`script(1)`; skipped
//! where it is not installed) and read back as a person would see it (`vt100`):
//! - colour is decided by the stream written: `verify > file` on a terminal writes no escape
//!   codes into the file, its warnings on the terminal keep theirs; `NO_COLOR`, `CLICOLOR_FORCE`;
//! - tables keep their columns whatever the length of the ids in them;
//! - a log line printed while a progress bar is shown is written above the bar, not over it.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rethread_store::{open_url, OpenOptions, TurnCommit};
use support::{fake_codex, rethread};

/// A store of its own, a CODEX_HOME, and the environment every command gets.
struct Sandbox {
    dir: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        let env = vec![
            (
                "RETHREAD_STORE",
                format!("sqlite:{}", dir.path().join("store.sqlite").display()),
            ),
            ("RETHREAD_CODEX_BIN", fake_codex().display().to_string()),
            (
                "CODEX_HOME",
                dir.path().join("codex-home").display().to_string(),
            ),
            // A terminal with colours, whatever the test runner's own.
            ("TERM", "xterm-256color".into()),
            ("FAKE_CODEX_PROFILE", "release-n".into()),
        ];
        Sandbox { dir, env }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn with(&self, key: &'static str, value: &str) -> Sandbox {
        let mut env = self.env.clone();
        env.retain(|(k, _)| *k != key);
        env.push((key, value.to_string()));
        Sandbox {
            dir: tempfile::tempdir_in(self.dir.path()).unwrap(),
            env,
        }
    }

    fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        for key in [
            "NO_COLOR",
            "CLICOLOR",
            "CLICOLOR_FORCE",
            "RUST_LOG",
            "FAKE_CODEX_FAULTS",
        ] {
            command.env_remove(key);
        }
        for (key, value) in &self.env {
            command.env(key, value);
        }
        command
    }

    /// `rethread args` as a process, not on a terminal.
    fn run(&self, args: &[&str]) -> std::process::Output {
        self.command(&rethread()).args(args).output().unwrap()
    }

    /// The shell line `line` (with `rethread` for the binary) under a pseudo-terminal: what
    /// the terminal received. `None` when `script` is not installed.
    fn on_a_terminal(&self, line: &str) -> Option<Vec<u8>> {
        let line = line.replace("rethread", &format!("'{}'", rethread().display()));
        let out = match self
            .command(Path::new("script"))
            .args(["-qec", &line, "/dev/null"])
            .stdin(Stdio::null())
            .output()
        {
            Ok(out) => out,
            Err(error) => {
                eprintln!("skipping: no script(1) for a pseudo-terminal: {error}");
                return None;
            }
        };
        Some(out.stdout)
    }

    /// Sessions `ids`, each bound to a thread, written through the library.
    fn sessions(&self, ids: &[String]) {
        let url = self.env[0].1.clone();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let store = open_url(&url, OpenOptions::new()).await.unwrap();
            for (i, id) in ids.iter().enumerate() {
                let rows = vec![serde_json::json!({"role": "user", "text": "hi"})];
                let thread = format!("0199aaaa-0000-7000-8000-{i:012}");
                store
                    .commit_turn(TurnCommit::new(id.as_str(), thread, rows))
                    .await
                    .unwrap();
            }
        });
    }

    /// `chat` one turn for each of `sessions` on the fake.
    fn chat(&self, sessions: &[&str]) {
        for session in sessions {
            let out = self.run(&["chat", "--session", session, "hello"]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// What a terminal shows after `bytes`, row by row (tall enough never to scroll).
fn screen(bytes: &[u8]) -> Vec<String> {
    let size = |n| std::num::NonZeroU16::new(n).unwrap();
    let mut parser = vt100::Parser::new(size(1000), size(400), 0);
    parser.process(bytes);
    let rows: Vec<String> = parser.screen().rows(0, 400).collect();
    let used = rows
        .iter()
        .rposition(|r| !r.trim().is_empty())
        .map_or(0, |i| i + 1);
    rows[..used]
        .iter()
        .map(|r| r.trim_end().to_string())
        .collect()
}

const ESC: u8 = 0x1b;

/// Whether `bytes` hold a colour or style (an SGR sequence, `ESC [ ... m`); a progress bar's
/// line clearing (`ESC [ 2K`) is none.
fn coloured(bytes: &[u8]) -> bool {
    bytes.windows(2).enumerate().any(|(i, pair)| {
        pair == [ESC, b'[']
            && bytes[i + 2..]
                .iter()
                .find(|b| !(b.is_ascii_digit() || **b == b';'))
                == Some(&b'm')
    })
}

#[test]
fn colour_is_decided_by_the_stream_written() {
    let sandbox = Sandbox::new();
    let store = sandbox.env[0].1.clone();
    let out = sandbox.run(&["migrate", "--from", "memory:", "--to", &store]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = sandbox.path("report.txt");
    let file = report.display().to_string();

    // stdout a file, stderr the terminal: the report plain, the warning in colour.
    let bad_filter = sandbox.with("RUST_LOG", "=garbage=[");
    let Some(terminal) = bad_filter.on_a_terminal(&format!("rethread verify > '{file}'")) else {
        return;
    };
    let written = std::fs::read(&report).unwrap();
    assert!(
        String::from_utf8_lossy(&written).contains("verified"),
        "{written:?}"
    );
    assert!(
        !coloured(&written),
        "escape codes in a file: {:?}",
        String::from_utf8_lossy(&written)
    );
    let warned = String::from_utf8_lossy(&terminal);
    assert!(warned.contains("warning:"), "{warned:?}");
    assert!(coloured(&terminal), "no colour on the terminal: {warned:?}");

    // Both on the terminal: colour.
    let shown = sandbox.on_a_terminal("rethread verify").unwrap();
    assert!(coloured(&shown), "{:?}", String::from_utf8_lossy(&shown));
    // NO_COLOR: none, even on the terminal.
    let shown = sandbox
        .with("NO_COLOR", "1")
        .on_a_terminal("rethread verify")
        .unwrap();
    assert!(!coloured(&shown), "{:?}", String::from_utf8_lossy(&shown));
    // CLICOLOR_FORCE: colour into the file too.
    sandbox
        .with("CLICOLOR_FORCE", "1")
        .on_a_terminal(&format!("rethread verify > '{file}'"))
        .unwrap();
    assert!(coloured(&std::fs::read(&report).unwrap()));
    // Not a terminal at all: none.
    let out = sandbox.run(&["verify"]);
    assert!(!coloured(&out.stdout) && !coloured(&out.stderr));
}

/// The column where `header` starts in the first line, and in every other line the column
/// where the cell below it starts (the first non-space after the previous cell).
fn columns_line_up(table: &str, header: &str) -> bool {
    let mut lines = table.lines();
    let first = lines.next().unwrap();
    let at = first.find(header).unwrap();
    lines
        .take_while(|line| !line.contains("binding(s)"))
        .all(|line| {
            line.len() > at && line.as_bytes()[at - 1] == b' ' && line.as_bytes()[at] != b' '
        })
}

#[test]
fn tables_keep_their_columns_whatever_the_length_of_the_ids() {
    let sandbox = Sandbox::new();
    let long = "a-session-id-much-longer-than-twenty-four-characters";
    sandbox.chat(&[long, "b", "c\u{1b}[31mred"]);

    let out = sandbox.run(&["sessions", "list"]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(table.starts_with("SESSION"), "{table}");
    for header in ["THREAD", "BOUND AT"] {
        assert!(columns_line_up(&table, header), "{header}:\n{table}");
    }
    // Ids are escaped for people, in the table too.
    assert!(table.contains(r"c\u{1b}[31mred"), "{table}");

    let out = sandbox.run(&["doctor"]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{table}");
    for header in ["THREAD", "STATUS", "DETAIL"] {
        assert!(columns_line_up(&table, header), "{header}:\n{table}");
    }
}

/// `sessions list` prints page by page (256 sessions each): a later page is never narrower
/// than the first.
#[test]
fn sessions_list_pages_keep_the_columns_of_the_first() {
    let sandbox = Sandbox::new();
    let mut ids: Vec<String> = (0..300).map(|i| format!("s{i:03}")).collect();
    ids[0] = format!("s000-{}", "x".repeat(40));
    sandbox.sessions(&ids);
    let out = sandbox.run(&["sessions", "list"]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(table.lines().count(), 301, "{table}");
    assert!(columns_line_up(&table, "THREAD"), "{table}");
}

/// `doctor` on a terminal: a log line said while its progress bar is shown (codex printed a
/// line that is not JSON) is on a row of its own, and no bar is left behind.
#[test]
fn log_lines_are_written_above_the_progress_bar() {
    let sandbox = Sandbox::new();
    sandbox.chat(&["a", "b", "c", "d"]);
    let slow = sandbox.with(
        "FAKE_CODEX_FAULTS",
        r#"{"faults": [{"kind": "delay", "method": "thread/read", "millis": 200},
                       {"kind": "garbage_line", "at_request": 6}]}"#,
    );
    for line in ["rethread doctor --jobs 1", "rethread -v doctor --jobs 1"] {
        let Some(bytes) = slow.on_a_terminal(line) else {
            return;
        };
        let drawn = String::from_utf8_lossy(&bytes);
        assert!(drawn.contains("probing ["), "no bar was drawn: {drawn:?}");
        let rows = screen(&bytes);
        let shown = rows.join("\n");
        let warnings: Vec<&String> = rows.iter().filter(|r| r.contains("WARN")).collect();
        assert_eq!(warnings.len(), 1, "{shown}");
        for row in &rows {
            assert!(
                !row.contains("probing ["),
                "a bar left on screen: {row:?}\n{shown}"
            );
        }
        assert!(
            warnings[0].starts_with("20"),
            "the log line is not on a row of its own: {shown}"
        );
        assert!(shown.ends_with("4 binding(s): 4 live"), "{shown}");
    }
}
