//! `cargo xtask docs`: fails naming every repository path a doc names that does not exist (a
//! stage of `cargo xtask ci`).
//!
//! Read: `README.md`, `docs/*.md`, and the `//!` lines of every `.rs` file of the crates,
//! `xtask/` and `fuzz/`. A path is:
//! - a word starting with `crates/`, `docs/`, `xtask/`, `fuzz/` or `.ci/`, anywhere;
//! - a backticked file path: a span with a `/` that starts with one of those or ends in a
//!   source or doc extension (`.rs`, `.md`, `.toml`, ...), or a bare file name ending in
//!   `.rs`, `.md`, `.sh`, `.py` or `.txt`;
//! - a Markdown link target that is not a URL or an anchor.
//!
//! Spans with placeholders or shell syntax (`<id>`, `$HOME`, `*`, `~`, `:`, spaces), absolute
//! paths, `target/...` and whatever git ignores (built or generated, not kept) are not paths
//! of the repository. A relative path resolves against the root, the doc's directory, or any
//! crate or its `src/` (the docs speak of each other's files); a bare file name against any
//! file of the repository.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::util;

/// The directories a path of the repository starts with.
const ROOTS: [&str; 6] = ["crates/", "docs/", "xtask/", "fuzz/", ".ci/", ".cargo/"];

/// Extensions of a backticked path (with a `/`) of the repository.
const PATH_EXTENSIONS: [&str; 10] = [
    ".rs", ".md", ".toml", ".txt", ".sh", ".py", ".json", ".yml", ".yaml", ".lock",
];

/// Extensions of a bare file name taken as a file of the repository.
const NAME_EXTENSIONS: [&str; 5] = [".rs", ".md", ".sh", ".py", ".txt"];

/// A path a doc names that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Missing {
    /// The doc, relative to the root.
    pub(crate) doc: String,
    /// Its line (1-based).
    pub(crate) line: usize,
    /// The path as written.
    pub(crate) path: String,
}

/// `cargo xtask docs`.
pub(crate) fn command(args: &[String]) -> Result<(), String> {
    if let Some(arg) = args.first() {
        return Err(format!("docs: unknown argument `{arg}`"));
    }
    let root = util::project_root();
    let missing = check(&root)?;
    if missing.is_empty() {
        println!("docs: every path the docs name exists");
        return Ok(());
    }
    let lines: Vec<String> = missing
        .iter()
        .map(|m| format!("  {}:{}: `{}`", m.doc, m.line, m.path))
        .collect();
    Err(format!(
        "{} path(s) named in the docs do not exist:\n{}",
        missing.len(),
        lines.join("\n")
    ))
}

/// Every path the docs under `root` name that does not exist.
pub(crate) fn check(root: &Path) -> Result<Vec<Missing>, String> {
    let files = repository_files(root)?;
    let names: BTreeSet<&str> = files.iter().filter_map(|f| f.rsplit('/').next()).collect();
    // Relative paths resolve against the root, the doc's directory, and every crate and its
    // `src/`: the docs speak of each other's files.
    let mut bases: Vec<PathBuf> = vec![root.to_path_buf()];
    for dir in files.iter().filter_map(|f| f.strip_suffix("Cargo.toml")) {
        bases.push(root.join(dir));
        bases.push(root.join(dir).join("src"));
    }
    let mut candidates = Vec::new();
    for doc in files.iter().filter(|f| is_doc(f)) {
        let text = std::fs::read_to_string(root.join(doc))
            .map_err(|e| format!("cannot read {doc}: {e}"))?;
        let markdown = doc.ends_with(".md");
        let dir = root.join(doc).parent().map(Path::to_path_buf);
        for (index, line) in text.lines().enumerate() {
            let text = if markdown {
                line
            } else {
                match line.trim_start().strip_prefix("//!") {
                    Some(rest) => rest,
                    None => continue,
                }
            };
            for path in paths_in(text, markdown) {
                let found = if path.contains('/') {
                    let relative = path.trim_end_matches('/');
                    dir.iter()
                        .chain(&bases)
                        .any(|base| base.join(relative).exists())
                } else {
                    names.contains(path.as_str())
                };
                if !found {
                    candidates.push(Missing {
                        doc: doc.clone(),
                        line: index + 1,
                        path,
                    });
                }
            }
        }
    }
    // What git ignores is built or generated (`fuzz/corpus/`), not kept in the repository.
    let ignored = ignored(root, candidates.iter().map(|m| m.path.as_str()))?;
    let mut missing: Vec<Missing> = candidates
        .into_iter()
        .filter(|m| !ignored.contains(&m.path))
        .collect();
    missing.sort();
    missing.dedup();
    Ok(missing)
}

/// The files of the repository (tracked, or new and not ignored), relative to `root`.
fn repository_files(root: &Path) -> Result<Vec<String>, String> {
    let output = std::process::Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run git ls-files: {e}"))?;
    if !output.status.success() {
        return Err(format!("git ls-files failed with {}", output.status));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|f| root.join(f).exists())
        .map(str::to_string)
        .collect())
}

/// Those of `paths` that git ignores (they need not exist).
fn ignored<'a>(
    root: &Path,
    paths: impl Iterator<Item = &'a str>,
) -> Result<BTreeSet<String>, String> {
    use std::io::Write;
    let mut child = std::process::Command::new("git")
        .args(["check-ignore", "--no-index", "--stdin"])
        .current_dir(root)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run git check-ignore: {e}"))?;
    let input: String = paths.map(|p| format!("{p}\n")).collect();
    child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(input.as_bytes()))
        .transpose()
        .map_err(|e| format!("cannot write to git check-ignore: {e}"))?;
    let output = child
        .wait_with_output()
        .map_err(|e| format!("git check-ignore failed: {e}"))?;
    // Exit 1: none is ignored.
    if !matches!(output.status.code(), Some(0 | 1)) {
        return Err(format!("git check-ignore failed with {}", output.status));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

/// Whether `file` is a doc this check reads.
fn is_doc(file: &str) -> bool {
    let markdown = file == "README.md"
        || file
            .strip_prefix("docs/")
            .is_some_and(|rest| !rest.contains('/') && rest.ends_with(".md"));
    let rust = file.ends_with(".rs")
        && ["crates/", "xtask/", "fuzz/"]
            .iter()
            .any(|r| file.starts_with(r));
    markdown || rust
}

/// The repository paths `text` (one line) names.
pub(crate) fn paths_in(text: &str, markdown: bool) -> Vec<String> {
    let mut found = Vec::new();
    let mut spans = Vec::new();
    // Backticked spans.
    let mut rest = text;
    while let Some(start) = rest.find('`') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('`') else { break };
        spans.push(&after[..end]);
        rest = &after[end + 1..];
    }
    for span in spans {
        if let Some(path) = backticked_path(span) {
            found.push(path);
        }
    }
    // Words starting with a root, backticked or not.
    for (at, _) in text.match_indices(['c', 'd', 'x', 'f', '.']) {
        let tail = &text[at..];
        if !ROOTS.iter().any(|r| tail.starts_with(r)) {
            continue;
        }
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || "_-./~$<:@".contains(c)) {
            continue;
        }
        let word: String = tail
            .chars()
            .take_while(|c| c.is_alphanumeric() || "_-./".contains(*c))
            .collect();
        let word = word.trim_end_matches('.').to_string();
        let next = tail[word.len()..].chars().next();
        // A placeholder or a pattern follows: only the part before it is a path.
        let word = if next.is_some_and(|c| "<*{$".contains(c)) {
            match word.rfind('/') {
                Some(slash) => word[..=slash].to_string(),
                None => continue,
            }
        } else {
            word
        };
        if !found.contains(&word) {
            found.push(word);
        }
    }
    // Markdown link targets.
    if markdown {
        let mut rest = text;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split('#').next().unwrap_or_default();
            if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
                found.push(target.to_string());
            }
            rest = &after[end + 1..];
        }
    }
    found
}

/// The repository path a backticked span names, if it names one.
fn backticked_path(span: &str) -> Option<String> {
    let span = span.trim();
    if span.is_empty()
        || span.starts_with('/')
        || span.starts_with('-')
        || span.starts_with("target/")
        || span.starts_with("..")
        || span
            .chars()
            .any(|c| c.is_whitespace() || "<>$*{}~@:?=,()[]|\"'#&;!%^+\\".contains(c))
    {
        return None;
    }
    let rooted = ROOTS.iter().any(|r| span.starts_with(r));
    let with_extension = |extensions: &[&str]| extensions.iter().any(|e| span.ends_with(e));
    let named = if span.contains('/') {
        rooted || with_extension(&PATH_EXTENSIONS)
    } else {
        // A name, not an extension alone (`.rs`).
        !span.starts_with('.') && with_extension(&NAME_EXTENSIONS)
    };
    named.then(|| span.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_found_in_backticks_words_and_links() {
        let line =
            "see `crates/store/src/lib.rs`, docs/design.md. and [the card](design.md#rules) \
                    or `chat/reply.rs` and `view.rs`";
        assert_eq!(
            paths_in(line, true),
            [
                "crates/store/src/lib.rs",
                "chat/reply.rs",
                "view.rs",
                "docs/design.md",
                "design.md"
            ]
        );
    }

    #[test]
    fn methods_placeholders_urls_and_built_files_are_not_paths() {
        let line = "`thread/start` `turn/completed` `$CODEX_HOME/config.toml` `~/.codex` \
                    `target/codex/` `/tmp/x.rs` `fuzz/src/<target>.rs` `redb:PATH` \
                    `config.toml` `https://docs.rs/x` [x](https://example.com) \
                    rethread/crates/x `crates/*/src`";
        assert_eq!(paths_in(line, true), ["fuzz/src/", "crates/"]);
    }

    #[test]
    fn a_path_that_does_not_exist_is_named_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        std::fs::create_dir_all(root.join("docs")).unwrap();
        std::fs::create_dir_all(root.join("crates/a/src")).unwrap();
        std::fs::write(root.join("crates/a/Cargo.toml"), "").unwrap();
        std::fs::write(
            root.join("crates/a/src/lib.rs"),
            "//! Uses `src/lib.rs` and `src/gone.rs`.\n// `src/also_gone.rs` is no doc.\n",
        )
        .unwrap();
        std::fs::write(
            root.join("README.md"),
            "Read docs/x.md and `crates/a/src/lib.rs`.\n\nThen `lib.rs`, `nope.md`.\n",
        )
        .unwrap();
        std::fs::write(root.join("docs/x.md"), "[up](../README.md), [gone](y.md)\n").unwrap();
        let git = |args: &[&str]| {
            let status = std::process::Command::new("git")
                .args(args)
                .current_dir(&root)
                .output()
                .unwrap()
                .status;
            assert!(status.success(), "git {args:?}");
        };
        git(&["init", "-q"]);
        let missing = check(&root).unwrap();
        let named: Vec<(String, usize, String)> = missing
            .into_iter()
            .map(|m| (m.doc, m.line, m.path))
            .collect();
        assert_eq!(
            named,
            [
                ("README.md".to_string(), 3, "nope.md".to_string()),
                (
                    "crates/a/src/lib.rs".to_string(),
                    1,
                    "src/gone.rs".to_string()
                ),
                ("docs/x.md".to_string(), 1, "y.md".to_string()),
            ]
        );
    }
}
