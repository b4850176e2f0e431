//! `codex exec`'s command line, read as codex-cli 0.171.0 reads it (exec's options, then a
//! `PROMPT` or a subcommand with options of its own), for a stand-in of `codex exec`
//! (`rethread exec`, the fake's `exec` mode): the subcommand, prompt, flags and config
//! overrides, and the same run as a `resume <id>`. Two rules matter for that:
//!
//! - exec's `--image` takes **every** value up to the next option, a subcommand name included
//!   (`exec --image a.png resume <id>` attaches three images), so [`ExecArgs::with_resume`]
//!   moves the images behind the `resume <id>`, where `--image` takes one value each.
//! - options `resume` does not take (`--sandbox`, `--cd`, `--add-dir`, `--color`, ...) stay
//!   before it, where exec reads them.
//!
//! An unknown option is read as a flag, or with its value inline (`--name=value`). An option
//! (or `--`) is never read as the value of the one before it: codex refuses a valued option
//! without its value ([`ExecArgs::missing_value`]), and a stand-in refuses such a run rather
//! than rewrite it (`exec -m` with `resume <id>` appended would be `-m resume <id>`).
//!
//! ```
//! use rethread_protocol::exec::ExecArgs;
//!
//! let run = ExecArgs::parse(["--experimental-json", "--cd", "/w", "--image", "a.png", "b.png"]);
//! assert_eq!(run.subcommand(), None);
//! assert_eq!(
//!     run.with_resume("0199"),
//!     ["--experimental-json", "--cd", "/w", "resume", "0199", "--image", "a.png", "--image", "b.png"]
//! );
//! let resumed = ExecArgs::parse(["--experimental-json", "resume", "0199", "--image", "a.png"]);
//! assert_eq!((resumed.subcommand(), resumed.thread_id()), (Some("resume"), Some("0199")));
//! ```

use std::ffi::{OsStr, OsString};

/// The options that take one value: long name, short letter, and whether only exec itself
/// takes it (not its subcommands). `--image` is read apart: exec's takes every value up to the
/// next option, a subcommand's one.
const VALUED: [(&str, Option<char>, bool); 16] = [
    ("config", Some('c'), false),
    ("enable", None, false),
    ("disable", None, false),
    ("remote", None, false),
    ("remote-auth-token-env", None, false),
    ("model", Some('m'), false),
    ("local-provider", None, true),
    ("profile", Some('p'), true),
    ("sandbox", Some('s'), true),
    ("cd", Some('C'), true),
    ("add-dir", None, true),
    ("thread-source", None, false),
    ("cyber-access-program", None, false),
    ("output-schema", None, false),
    ("color", None, true),
    ("output-last-message", Some('o'), false),
];

/// exec's subcommands.
const SUBCOMMANDS: [&str; 4] = ["resume", "fork", "review", "help"];

/// One argument as the parser read it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// An option: its name (long, or the short letter), its inline value, and the indexes of
    /// its value arguments.
    Option {
        name: String,
        inline: Option<String>,
        values: Vec<usize>,
    },
    /// A positional argument.
    Positional,
}

/// A `codex exec` command line (the arguments after `exec`), read (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecArgs {
    args: Vec<OsString>,
    /// Where each token starts, and what it is; option values are not tokens of their own.
    tokens: Vec<(usize, Token)>,
    /// The index of the subcommand's name in `args`.
    subcommand: Option<usize>,
    /// The index of the first valued option given without its value.
    missing_value: Option<usize>,
}

impl ExecArgs {
    /// Reads `args` (those after `exec`); what codex would refuse is left for codex to refuse.
    pub fn parse<I, S>(args: I) -> ExecArgs
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let mut tokens = Vec::new();
        let (mut subcommand, mut missing_value) = (None, None);
        let mut i = 0;
        let mut only_positionals = false;
        while i < args.len() {
            let at = i;
            let text = args[i].to_string_lossy();
            i += 1;
            if only_positionals || text == "-" || !text.starts_with('-') {
                if subcommand.is_none()
                    && !only_positionals
                    && !tokens.iter().any(|(_, t)| *t == Token::Positional)
                    && SUBCOMMANDS.contains(&text.as_ref())
                {
                    subcommand = Some(at);
                    continue;
                }
                tokens.push((at, Token::Positional));
                continue;
            }
            if text == "--" {
                only_positionals = true;
                continue;
            }
            let in_subcommand = subcommand.is_some();
            let mut table = VALUED
                .iter()
                .filter(|(.., exec_only)| !(in_subcommand && *exec_only));
            let (name, inline, takes_value) = match text.strip_prefix("--") {
                Some(long) => {
                    let (name, inline) = match long.split_once('=') {
                        Some((name, value)) => (name.to_string(), Some(value.to_string())),
                        None => (long.to_string(), None),
                    };
                    let takes = table.any(|(l, ..)| *l == name) || name == "image";
                    (name, inline, takes)
                }
                None => {
                    let mut chars = text[1..].chars();
                    let letter = chars.next().unwrap_or('-');
                    let rest: String = chars.collect();
                    let long = table
                        .find(|(_, short, _)| *short == Some(letter))
                        .map(|(long, ..)| long.to_string())
                        .or_else(|| (letter == 'i').then(|| "image".to_string()));
                    match long {
                        Some(long) => {
                            let inline = (!rest.is_empty())
                                .then(|| rest.strip_prefix('=').unwrap_or(&rest).to_string());
                            (long, inline, true)
                        }
                        None => (letter.to_string(), None, false),
                    }
                }
            };
            let mut values = Vec::new();
            if takes_value && inline.is_none() {
                // exec's `--image` takes every value up to the next option.
                let greedy = name == "image" && subcommand.is_none();
                while i < args.len() {
                    let next = args[i].to_string_lossy();
                    if next.starts_with('-') && next != "-" {
                        break;
                    }
                    values.push(i);
                    i += 1;
                    if !greedy {
                        break;
                    }
                }
                if values.is_empty() {
                    missing_value.get_or_insert(at);
                }
            }
            tokens.push((
                at,
                Token::Option {
                    name,
                    inline,
                    values,
                },
            ));
        }
        ExecArgs {
            args,
            tokens,
            subcommand,
            missing_value,
        }
    }

    /// The first valued option given without its value (last, or followed by another option
    /// or `--`), as written: codex refuses the run, so a stand-in must not change it.
    pub fn missing_value(&self) -> Option<&OsStr> {
        self.missing_value.map(|at| self.args[at].as_os_str())
    }

    /// The arguments, as given.
    pub fn args(&self) -> &[OsString] {
        &self.args
    }

    /// The subcommand the run names (`resume`, `fork`, `review`, `help`), if any.
    pub fn subcommand(&self) -> Option<&str> {
        self.subcommand.and_then(|at| self.args[at].to_str())
    }

    /// The thread a `resume` or `fork` names (its first positional, as given; `None` with
    /// `--last`, without an id, or when it is not UTF-8).
    pub fn thread_id(&self) -> Option<&str> {
        if !self.names_thread() {
            return None;
        }
        self.positionals().next().and_then(OsStr::to_str)
    }

    /// Whether the run is a `resume` or `fork` whose first positional is the thread.
    fn names_thread(&self) -> bool {
        matches!(self.subcommand(), Some("resume" | "fork")) && !self.has_flag("last")
    }

    /// The prompt given as an argument (`-` means stdin, as for codex): exec's positional, or
    /// the one after the thread of a `resume` or `fork`. `None`: the prompt comes from stdin.
    pub fn prompt(&self) -> Option<&OsStr> {
        let mut positionals = self.positionals();
        match self.names_thread() {
            true => positionals.nth(1),
            false => positionals.next(),
        }
    }

    /// `resume --last [--all]` as `resume <thread_id>` (`--last` and `--all` left out, the id
    /// first after `resume`); the arguments as given for any other run.
    pub fn with_last_as(&self, thread_id: &str) -> Vec<OsString> {
        let at = match self.subcommand {
            Some(at) if self.subcommand() == Some("resume") && self.has_flag("last") => at,
            _ => return self.args.clone(),
        };
        let dropped: Vec<usize> = (self.tokens.iter())
            .filter(
                |(_, t)| matches!(t, Token::Option { name, .. } if name == "last" || name == "all"),
            )
            .map(|(i, _)| *i)
            .collect();
        let mut args: Vec<OsString> = (self.args.iter().enumerate())
            .filter(|(i, _)| !dropped.contains(i))
            .map(|(_, arg)| arg.clone())
            .collect();
        args.insert(at + 1, OsString::from(thread_id));
        args
    }

    /// The same run naming `thread_id` where it names a thread (`resume <name>` as `resume
    /// <id>`); unchanged when it names none.
    pub fn with_thread(&self, thread_id: &str) -> ExecArgs {
        let at = match self.names_thread() {
            true => self.tokens.iter().find(|(_, t)| *t == Token::Positional),
            false => None,
        };
        let mut args = self.args.clone();
        if let Some((at, _)) = at {
            args[*at] = OsString::from(thread_id);
        }
        ExecArgs::parse(args)
    }

    /// Whether the flag `name` (a long name without `--`, or a short letter) is given.
    pub fn has_flag(&self, name: &str) -> bool {
        self.options().any(|(option, _)| option == name)
    }

    /// The value of the last `-c`/`--config key=value` for `key`, as codex reads it: the
    /// TOML value when the text parses as one (a string without its quotes), the text
    /// itself otherwise.
    pub fn config(&self, key: &str) -> Option<String> {
        let text = self
            .option_values("config")
            .filter_map(|value| {
                let (k, v) = value.split_once('=')?;
                (k.trim() == key).then(|| v.to_string())
            })
            .last()?;
        Some(toml_value_text(&text))
    }

    /// The values of every `--name` option (long name), in order (`--image a b` gives both).
    pub fn option_values(&self, name: &str) -> impl Iterator<Item = String> + '_ {
        let name = name.to_string();
        self.options()
            .filter(move |(option, _)| *option == name)
            .flat_map(|(_, values)| values)
    }

    /// The names of the options given, in order (a short letter for an unknown flag).
    pub fn option_names(&self) -> impl Iterator<Item = String> + '_ {
        self.options().map(|(name, _)| name)
    }

    /// The same run as a `resume` of `thread_id` (see the module docs); the arguments as given
    /// when the run already names a subcommand.
    pub fn with_resume(&self, thread_id: &str) -> Vec<OsString> {
        if self.subcommand.is_some() {
            return self.args.clone();
        }
        let mut before = Vec::new();
        let mut images = Vec::new();
        let mut prompt = Vec::new();
        for (at, token) in &self.tokens {
            match token {
                Token::Positional => prompt.push(self.args[*at].clone()),
                Token::Option {
                    name,
                    inline,
                    values,
                } if name == "image" => {
                    let values = inline
                        .iter()
                        .map(OsString::from)
                        .chain(values.iter().map(|i| self.args[*i].clone()));
                    for value in values {
                        images.push(OsString::from("--image"));
                        images.push(value);
                    }
                }
                Token::Option { values, .. } => {
                    before.push(self.args[*at].clone());
                    before.extend(values.iter().map(|i| self.args[*i].clone()));
                }
            }
        }
        before.push(OsString::from("resume"));
        before.push(OsString::from(thread_id));
        before.extend(prompt);
        before.extend(images);
        before
    }

    /// Every option, by name, with its values as text.
    fn options(&self) -> impl Iterator<Item = (String, Vec<String>)> + '_ {
        self.tokens.iter().filter_map(|(_, token)| match token {
            Token::Option {
                name,
                inline,
                values,
            } => {
                let values = inline
                    .iter()
                    .cloned()
                    .chain(
                        values
                            .iter()
                            .map(|i| self.args[*i].to_string_lossy().into_owned()),
                    )
                    .collect();
                Some((name.clone(), values))
            }
            Token::Positional => None,
        })
    }

    /// The positionals after the subcommand's name (or exec's, without one).
    fn positionals(&self) -> impl Iterator<Item = &OsStr> + '_ {
        let after = self.subcommand;
        self.tokens
            .iter()
            .filter(move |(at, token)| {
                *token == Token::Positional && after.is_none_or(|sub| *at > sub)
            })
            .map(|(at, _)| self.args[*at].as_os_str())
    }
}

/// A `-c` value as codex reads it: TOML when it parses as TOML, the text itself otherwise.
fn toml_value_text(text: &str) -> String {
    match toml::from_str::<toml::Table>(&format!("value = {text}")) {
        Ok(table) => match table.get("value") {
            Some(toml::Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => text.to_string(),
        },
        Err(_) => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    /// What the TypeScript SDK (0.163.0) sends before a run's images.
    const SDK_FLAGS: [&str; 10] = [
        "--experimental-json",
        "--config",
        "approval_policy=\"never\"",
        "--model",
        "m",
        "--sandbox",
        "read-only",
        "--cd",
        "/w",
        "--skip-git-repo-check",
    ];

    /// The SDK's run without a thread, then with one.
    #[test]
    fn the_typescript_sdks_runs_are_read_as_codex_reads_them() {
        let first = ExecArgs::parse(SDK_FLAGS.into_iter().chain(["--image", "a.png"]));
        assert_eq!(first.subcommand(), None);
        assert_eq!(first.thread_id(), None);
        assert_eq!(first.prompt(), None);
        assert_eq!(first.config("approval_policy").as_deref(), Some("never"));
        let resumed = [&SDK_FLAGS[..], &["resume", "t1", "--image", "a.png"]].concat();
        assert_eq!(strings(first.with_resume("t1")), resumed);
        let next = ExecArgs::parse([
            "--experimental-json",
            "--cd",
            "/w",
            "resume",
            "t1",
            "--image",
            "a.png",
        ]);
        assert_eq!(next.subcommand(), Some("resume"));
        assert_eq!(next.thread_id(), Some("t1"));
        assert_eq!(next.prompt(), None);
        assert_eq!(next.option_values("image").collect::<Vec<_>>(), ["a.png"]);
        assert_eq!(next.with_resume("t2"), next.args());
    }

    /// Issue 41, item 3: a thread name is replaced by the id it resolves to, nothing else.
    #[test]
    fn a_named_thread_is_replaced_by_its_id_and_nothing_else() {
        let named = ExecArgs::parse(["--json", "resume", "alices", "-m", "m", "go"]);
        let by_id = named.with_thread("0199");
        assert_eq!(
            (by_id.subcommand(), by_id.thread_id()),
            (Some("resume"), Some("0199"))
        );
        assert_eq!(by_id.prompt(), Some(OsStr::new("go")));
        let expected = ["--json", "resume", "0199", "-m", "m", "go"].map(OsString::from);
        assert_eq!(by_id.args(), expected);
        let fork = ExecArgs::parse(["fork", "alices"]).with_thread("0199");
        assert_eq!(fork.thread_id(), Some("0199"));
        let new = ExecArgs::parse(["alices"]);
        assert_eq!(new.with_thread("0199"), new);
    }

    /// Issue 34: `fork <id>` names its thread as `resume <id>` does, and `resume --last` can
    /// be pinned to one thread.
    #[test]
    fn a_fork_names_its_thread_and_resume_last_is_pinned_to_one() {
        let fork = ExecArgs::parse(["--json", "fork", "T1", "hi"]);
        assert_eq!(
            (fork.thread_id(), fork.prompt()),
            (Some("T1"), Some(OsStr::new("hi")))
        );
        assert_eq!(fork.with_last_as("t2"), fork.args());
        let last = ExecArgs::parse(["--json", "resume", "-m", "x", "--last", "hi", "--all"]);
        assert_eq!(
            (last.thread_id(), last.prompt()),
            (None, Some(OsStr::new("hi")))
        );
        let pinned = ExecArgs::parse(last.with_last_as("t2"));
        assert_eq!(
            strings(pinned.args().to_vec()),
            ["--json", "resume", "t2", "-m", "x", "hi"]
        );
        assert_eq!(
            (pinned.thread_id(), pinned.prompt()),
            (Some("t2"), Some(OsStr::new("hi")))
        );
        let named = ExecArgs::parse(["resume", "t1", "--all"]);
        assert_eq!(named.with_last_as("t2"), named.args());
    }

    #[test]
    fn a_greedy_image_list_swallows_what_follows_until_an_option() {
        // codex attaches `resume` and the id as images here and starts a new thread.
        let run = ExecArgs::parse(["--image", "a.png", "resume", "t1", "--json"]);
        assert_eq!(run.subcommand(), None);
        assert_eq!(
            run.option_values("image").collect::<Vec<_>>(),
            ["a.png", "resume", "t1"]
        );
        assert!(run.has_flag("json"));
        let inline = ExecArgs::parse(["-ia.png", "hello"]);
        assert_eq!(inline.prompt(), Some(OsStr::new("hello")));
        assert_eq!(
            strings(inline.with_resume("t")),
            ["resume", "t", "hello", "--image", "a.png"]
        );
    }

    /// Issue 35: codex refuses a valued option without its value (last, or followed by
    /// another option); reading the next option, or `resume <id>`, as its value changed what
    /// the run meant (`-m` became `-m resume <id>`: a new thread prompted with the id).
    #[test]
    fn an_option_without_its_value_is_found_and_takes_nothing() {
        for (args, missing) in [
            (&["--experimental-json", "-m"][..], "-m"),
            (&["-m", "--cd", "/w", "hi"], "-m"),
            (&["--model", "-"][..], ""),
            (&["--cd", "--", "hi"], "--cd"),
            (&["--image"], "--image"),
            (&["--image", "--json"], "--image"),
            (&["-c"], "-c"),
            (&["resume", "t1", "-m"], "-m"),
            (&["-m", "x", "--config"], "--config"),
        ] {
            let run = ExecArgs::parse(args);
            let found = run.missing_value().map(|o| o.to_str().unwrap().to_string());
            assert_eq!(
                found.as_deref(),
                Some(missing).filter(|m| !m.is_empty()),
                "{args:?}"
            );
        }
        for fine in [
            &["-m", "x"][..],
            &["-mx"],
            &["--model=x"],
            &["--image", "a", "b"],
            &[],
        ] {
            assert_eq!(ExecArgs::parse(fine).missing_value(), None, "{fine:?}");
        }
        let dangling = ExecArgs::parse(["--experimental-json", "-m", "--cd", "/w"]);
        assert!(dangling.has_flag("cd"));
        assert_eq!(dangling.option_values("cd").collect::<Vec<_>>(), ["/w"]);
        assert_eq!(dangling.option_values("model").count(), 0);
    }

    #[test]
    fn prompts_flags_and_config_values_are_found_where_codex_finds_them() {
        let run = ExecArgs::parse([
            "-c",
            "developer_instructions=\"mine\"",
            "--config=model=\"x\"",
            "--ephemeral",
            "do it",
        ]);
        assert_eq!(run.prompt(), Some(OsStr::new("do it")));
        assert!(run.has_flag("ephemeral"));
        assert_eq!(
            run.config("developer_instructions").as_deref(),
            Some("mine")
        );
        assert_eq!(run.config("model").as_deref(), Some("x"));
        assert_eq!(
            strings(run.with_resume("t")),
            [
                "-c",
                "developer_instructions=\"mine\"",
                "--config=model=\"x\"",
                "--ephemeral",
                "resume",
                "t",
                "do it",
            ]
        );
        let resumed = ExecArgs::parse(["resume", "t1", "next", "-m", "x"]);
        assert_eq!(resumed.prompt(), Some(OsStr::new("next")));
        let last = ExecArgs::parse(["resume", "--last", "next"]);
        assert_eq!(
            (last.thread_id(), last.prompt()),
            (None, Some(OsStr::new("next")))
        );
        // A prompt that reads like a subcommand, after another positional, is a prompt.
        let words = ExecArgs::parse(["--", "resume"]);
        assert_eq!(
            (words.subcommand(), words.prompt()),
            (None, Some(OsStr::new("resume")))
        );
        let help = ExecArgs::parse(["-h"]);
        assert!(help.has_flag("h"));
        assert_eq!(ExecArgs::parse(["review"]).subcommand(), Some("review"));
    }
}
