//! Issue 35 item 11: every key a command's `--json` object has is named in that command's
//! `--help` and in the README, read from what the commands print (on the `fake-codex` binary),
//! so that neither lists fewer fields than the output has.

mod support;

use std::process::{Command, Output};

use serde_json::Value;
use support::{fake_codex, rethread};

struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn run(&self, args: &[&str]) -> Output {
        let store = format!("sqlite:{}", self.dir.path().join("s.sqlite").display());
        Command::new(rethread())
            .args(args)
            .env("RETHREAD_STORE", store)
            .env("RETHREAD_CODEX_BIN", fake_codex())
            .env("CODEX_HOME", self.dir.path().join("home"))
            .env("RUST_LOG", "off")
            .env_remove("RETHREAD_MIRROR")
            .env_remove("FAKE_CODEX_PROFILE")
            .output()
            .unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            let stderr = String::from_utf8_lossy(&out.stderr);
            panic!("{args:?}: {e}: {stderr}")
        })
    }
}

/// The keys of `value` (an object), and of the objects `nested` names in it (an object, or
/// the first object of an array).
fn keys(value: &Value, nested: &[&str]) -> Vec<String> {
    let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
    for name in nested {
        let inner = match &value[name] {
            Value::Array(items) => items[0].clone(),
            other => other.clone(),
        };
        keys.extend(inner.as_object().unwrap().keys().cloned());
    }
    keys
}

/// Whether `text` names `key` as a field: `` `key` `` or `"key"`.
fn names(text: &str, key: &str) -> bool {
    text.contains(&format!("`{key}`")) || text.contains(&format!("\"{key}\""))
}

#[test]
fn help_and_readme_name_every_json_field() {
    let sandbox = Sandbox {
        dir: tempfile::tempdir().unwrap(),
    };
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let copy = format!(
        "sqlite:{}",
        sandbox.dir.path().join("copy.sqlite").display()
    );
    let store = format!("sqlite:{}", sandbox.dir.path().join("s.sqlite").display());
    let chat = sandbox.json(&["chat", "--session", "s1", "--json", "hello"]);
    let failed_chat = sandbox.json(&["chat", "--session", "s1", "--json", " "]);
    let outputs: Vec<(&[&str], Vec<String>)> = vec![
        (&["chat"], keys(&chat, &[])),
        (&["chat"], keys(&failed_chat, &["error"])),
        (
            &["sessions", "list"],
            keys(&sandbox.json(&["sessions", "list", "--json"]), &[]),
        ),
        (
            &["sessions", "show"],
            keys(&sandbox.json(&["sessions", "show", "s1", "--json"]), &[]),
        ),
        (
            &["sessions", "show"],
            keys(
                &sandbox.json(&["sessions", "show", "s1", "--rows", "--json"]),
                &["rows"],
            ),
        ),
        (
            &["sessions", "show"],
            keys(
                &sandbox.json(&["sessions", "show", "none", "--json"]),
                &["error"],
            ),
        ),
        (
            &["sessions", "forget"],
            keys(
                &sandbox.json(&["sessions", "forget", "none", "--json"]),
                &["error"],
            ),
        ),
        (
            &["doctor"],
            keys(&sandbox.json(&["doctor", "--json"]), &["bindings"]),
        ),
        (&["verify"], keys(&sandbox.json(&["verify", "--json"]), &[])),
        (
            &["migrate"],
            keys(
                &sandbox.json(&["migrate", "--from", &store, "--to", &copy, "--json"]),
                &[],
            ),
        ),
        (
            &["sessions", "prune"],
            keys(
                &{
                    support::wait_out_the_shortest_idle();
                    let idle = support::SHORTEST_IDLE;
                    sandbox.json(&["sessions", "prune", "--idle", idle, "--dry-run", "--json"])
                },
                &["removed"],
            ),
        ),
        (
            &["sessions", "forget"],
            keys(&sandbox.json(&["sessions", "forget", "s1", "--json"]), &[]),
        ),
        (
            &["demo"],
            keys(&sandbox.json(&["demo", "--json"]), &["steps"]),
        ),
    ];
    for (command, keys) in outputs {
        let help = sandbox.run(&[&["help"][..], command].concat()).stdout;
        let help = String::from_utf8_lossy(&help);
        for key in keys {
            assert!(
                names(&help, &key),
                "{command:?} --help lacks `{key}`:\n{help}"
            );
            assert!(
                names(&readme, &key),
                "the README lacks {command:?}'s `{key}`"
            );
        }
    }
}
