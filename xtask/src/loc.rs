//! `cargo xtask loc`: the shipped lines of each crate, and their total (issue 42's goal: at most
//! 25,000 once its open issues have landed).
//!
//! Shipped, as the project counts it: each `.rs` file under the `src/` of the shipped crates
//! ([`SHIPPED_CRATES`]), outside any `conformance/` folder, counted up to its test module: the
//! file ends at the first `#[cfg(test)]` attribute whose next code line is a `mod` item. Blank
//! and comment lines count. The code column counts the same `src/` files (conformance suite
//! included) without the items under `#[cfg(test)]` (a test module inline, or the file a
//! `#[cfg(test)] mod name;` names), blank lines and lines that are only a comment (doc comments
//! included). The raw column is every line of the same `src/` files. The total row sums the
//! shipped crates; the others (test support, fakes) are listed apart.

use std::path::{Path, PathBuf};

use crate::util;

/// The crates whose `src/` is shipped code.
pub(crate) const SHIPPED_CRATES: [&str; 6] =
    ["protocol", "store", "runtime", "proxy", "cli", "rethread"];

/// The lines of one crate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Count {
    /// Lines of the files outside `conformance/`, each up to its test module.
    pub(crate) shipped: usize,
    /// Code lines outside `#[cfg(test)]` items.
    pub(crate) code: usize,
    /// Every line of the `src/` files.
    pub(crate) raw: usize,
}

/// `cargo xtask loc`.
pub(crate) fn command(args: &[String]) -> Result<(), String> {
    if let Some(arg) = args.first() {
        return Err(format!("loc: unknown argument `{arg}`"));
    }
    let root = util::project_root();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .map_err(|e| format!("cannot list crates/: {e}"))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|dir| dir.join("Cargo.toml").is_file())
        .collect();
    crates.sort();
    println!("| crate | shipped | code | raw |\n|---|---|---|---|");
    let mut total = Count::default();
    for dir in crates {
        let count = count_crate(&dir.join("src"))?;
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let Count { shipped, code, raw } = count;
        if !SHIPPED_CRATES.contains(&name.as_ref()) {
            println!("| ({name}: not shipped) | {shipped} | {code} | {raw} |");
            continue;
        }
        println!("| {name} | {shipped} | {code} | {raw} |");
        total.shipped += shipped;
        total.code += code;
        total.raw += raw;
    }
    let Count { shipped, code, raw } = total;
    println!("| total (shipped crates) | {shipped} | {code} | {raw} |");
    Ok(())
}

/// The lines of the `.rs` files under `src`.
fn count_crate(src: &Path) -> Result<Count, String> {
    let mut files = Vec::new();
    util::rust_files(src, &mut files)?;
    files.sort();
    let mut excluded: Vec<PathBuf> = Vec::new();
    let mut count = Count::default();
    // Module files first seen as `#[cfg(test)] mod x;` are skipped; a parent sorts before its
    // children (`a.rs` < `a/x.rs`), so exclusions are known by then.
    for file in &files {
        let text =
            std::fs::read_to_string(file).map_err(|e| format!("read {}: {e}", file.display()))?;
        if !in_conformance(file.strip_prefix(src).unwrap_or(file)) {
            count.shipped += lines_before_test_module(&text);
        }
        if excluded.iter().any(|e| file.starts_with(e) || file == e) {
            continue;
        }
        let lines = code_lines(&text);
        count.raw += text.lines().count();
        count.code += lines.code;
        let dir = module_dir(file);
        for module in lines.test_modules {
            excluded.push(dir.join(format!("{module}.rs")));
            excluded.push(dir.join(&module));
        }
    }
    Ok(count)
}

/// Whether `file` (a path under a crate's `src/`) is in a `conformance/` folder: the
/// conformance suite is test support the crate ships for other backends, not its own code.
fn in_conformance(file: &Path) -> bool {
    let folders = file.parent().unwrap_or(Path::new(""));
    folders.components().any(|c| c.as_os_str() == "conformance")
}

/// How many lines of `text` come before its test module: the first `#[cfg(test)]` attribute
/// whose next code line (past further attributes, comments and blank lines) is a `mod` item.
/// All of `text` when it has none. An attribute on any other item does not end the count.
pub(crate) fn lines_before_test_module(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let test_module_at = lines.iter().enumerate().position(|(at, line)| {
        line.trim_start().starts_with("#[cfg(test)]")
            && lines[at + 1..]
                .iter()
                .map(|line| line.trim_start())
                .find(|line| !(line.is_empty() || line.starts_with("#[") || line.starts_with("//")))
                .is_some_and(is_mod_item)
    });
    test_module_at.unwrap_or(lines.len())
}

/// Whether `line` (trimmed at its start) declares a module: `mod`, `pub mod`, `pub(crate) mod`.
fn is_mod_item(line: &str) -> bool {
    let rest = match line.strip_prefix("pub") {
        Some(after) => {
            let after = match after.strip_prefix('(') {
                Some(scoped) => match scoped.split_once(')') {
                    Some((scope, rest)) if is_path(scope) => rest,
                    _ => return false,
                },
                None => after,
            };
            if !after.starts_with(char::is_whitespace) {
                return false;
            }
            after.trim_start()
        }
        None => line,
    };
    rest.strip_prefix("mod")
        .is_some_and(|after| !after.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
}

/// Whether `scope` is a visibility path such as `crate`, `super` or `crate::a`.
fn is_path(scope: &str) -> bool {
    !scope.is_empty()
        && scope
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == ':')
}

/// The directory where the submodules of `file` live.
fn module_dir(file: &Path) -> PathBuf {
    let parent = file.parent().unwrap_or(Path::new("")).to_path_buf();
    match file.file_stem().and_then(|s| s.to_str()) {
        Some("lib" | "main" | "mod") | None => parent,
        Some(stem) => parent.join(stem),
    }
}

/// What [`code_lines`] found in one file.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct FileLines {
    /// Code lines outside `#[cfg(test)]` items.
    pub(crate) code: usize,
    /// Modules declared `#[cfg(test)] mod name;` (in files of their own).
    pub(crate) test_modules: Vec<String>,
}

/// Counts the code lines of `text` outside `#[cfg(test)]` items, without blank or
/// comment-only lines. A small scanner: strings, chars and comments are skipped when matching
/// braces, so a `"{"` in a test does not end its module early.
pub(crate) fn code_lines(text: &str) -> FileLines {
    let bytes = text.as_bytes();
    // Per line: whether it holds code (a byte outside comments and whitespace), and whether
    // that code is inside a `#[cfg(test)]` item.
    let line_count = text.lines().count();
    let mut code = vec![false; line_count + 1];
    let mut test = vec![false; line_count + 1];
    let mut result = FileLines::default();
    let mut line = 0;
    let mut i = 0;
    // The `#[cfg(test)]` item being skipped: its brace depth once it opened a block.
    let mut skipping: Option<Option<usize>> = None;
    let mut depth = 0usize;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\n' {
            line += 1;
            i += 1;
            continue;
        }
        if b.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        // Comments: not code.
        if text[i..].starts_with("//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if text[i..].starts_with("/*") {
            let mut nested = 0;
            while i < bytes.len() {
                if text[i..].starts_with("/*") {
                    nested += 1;
                    i += 2;
                } else if text[i..].starts_with("*/") {
                    nested -= 1;
                    i += 2;
                    if nested == 0 {
                        break;
                    }
                } else {
                    if bytes[i] == b'\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
            continue;
        }
        let start_line = line;
        if skipping.is_none() && text[i..].starts_with("#[cfg(test)]") {
            skipping = Some(None);
            if let Some(module) = declared_module(&text[i + "#[cfg(test)]".len()..]) {
                result.test_modules.push(module);
            }
        }
        // One token (strings and chars whole, so their braces do not count).
        let end = token_end(text, i, &mut line);
        for l in start_line..=line.min(line_count) {
            code[l] = true;
            if skipping.is_some() {
                test[l] = true;
            }
        }
        match (b, skipping) {
            (b'{', _) => {
                depth += 1;
                if skipping == Some(None) {
                    skipping = Some(Some(depth));
                }
            }
            (b'}', Some(Some(open))) if depth == open => {
                depth -= 1;
                skipping = None;
            }
            (b'}', _) => depth = depth.saturating_sub(1),
            (b';', Some(None)) => skipping = None,
            _ => {}
        }
        i = end;
    }
    result.code = (0..line_count).filter(|&l| code[l] && !test[l]).count();
    result
}

/// The module a `#[cfg(test)]` attribute is put on, when it is `mod name;` (a file of its
/// own), after any further attributes.
fn declared_module(after: &str) -> Option<String> {
    let mut rest = after.trim_start();
    while rest.starts_with("#[") {
        rest = rest[rest.find(']')? + 1..].trim_start();
    }
    let rest = rest.strip_prefix("pub(crate) ").unwrap_or(rest);
    let rest = rest.strip_prefix("mod ")?.trim_start();
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    rest[name.len()..]
        .trim_start()
        .starts_with(';')
        .then_some(name)
}

/// Where the token starting at `i` ends; counts the newlines inside it into `line`.
fn token_end(text: &str, i: usize, line: &mut usize) -> usize {
    let bytes = text.as_bytes();
    let newlines = |from: usize, to: usize, line: &mut usize| {
        *line += bytes[from..to].iter().filter(|&&b| b == b'\n').count();
    };
    // Raw strings: r"...", r#"..."#, br#"..."#.
    let raw_start = if text[i..].starts_with("br") {
        Some(i + 2)
    } else if text[i..].starts_with('r') && !is_ident_byte(i.checked_sub(1).map(|p| bytes[p])) {
        Some(i + 1)
    } else {
        None
    };
    if let Some(after) = raw_start {
        let hashes = bytes[after..].iter().take_while(|&&b| b == b'#').count();
        if bytes.get(after + hashes) == Some(&b'"') {
            let closing = format!("\"{}", "#".repeat(hashes));
            let body = after + hashes + 1;
            let end = text[body..]
                .find(&closing)
                .map_or(bytes.len(), |at| body + at + closing.len());
            newlines(i, end, line);
            return end;
        }
    }
    match bytes[i] {
        b'"' => {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(bytes.len());
            newlines(i, end, line);
            end
        }
        // A char literal ('{', '\n', '\u{7f}'); a lifetime ('a) is one byte.
        b'\'' => {
            let close = if bytes.get(i + 1) == Some(&b'\\') {
                text[i + 2..].find('\'').map(|at| i + 2 + at)
            } else {
                text[i + 1..]
                    .char_indices()
                    .nth(1)
                    .filter(|(_, c)| *c == '\'')
                    .map(|(at, _)| i + 1 + at)
            };
            close.map_or(i + 1, |at| at + 1)
        }
        _ => i + text[i..].chars().next().map_or(1, char::len_utf8),
    }
}

fn is_ident_byte(b: Option<u8>) -> bool {
    b.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_comments_and_blank_lines_are_not_shipped() {
        let text = "//! Docs.\n\
                    use std::fmt; // why\n\
                    \n\
                    /// A thing.\n\
                    pub fn f() -> &'static str {\n\
                    \x20   /* a\n\
                    \x20      block */\n\
                    \x20   \"}\"\n\
                    }\n\
                    #[cfg(test)]\n\
                    mod tests {\n\
                    \x20   fn g() -> char { '}' }\n\
                    \x20   const S: &str = r#\"{\"#;\n\
                    }\n\
                    #[cfg(test)]\n\
                    mod more;\n\
                    fn h() {}\n";
        assert_eq!(
            code_lines(text),
            FileLines {
                code: 5,
                test_modules: vec!["more".to_string()],
            }
        );
    }

    #[test]
    fn a_cfg_test_item_without_a_block_ends_at_its_semicolon() {
        let text = "#[cfg(test)]\nuse std::fmt;\nfn a() {}\n";
        assert_eq!(code_lines(text).code, 1);
    }

    #[test]
    fn a_file_ships_its_lines_up_to_its_test_module() {
        // Blank and comment lines count; a `#[cfg(test)]` on a `use` or a `fn` does not end
        // the file, one on a module does, past further attributes and comments.
        let text = "//! Docs.\n\
                    \n\
                    #[cfg(test)]\n\
                    use std::fmt;\n\
                    /// A thing.\n\
                    #[cfg(test)]\n\
                    fn only_in_tests() {}\n\
                    pub fn f() {}\n\
                    \n\
                    #[cfg(test)]\n\
                    // Why the tests are here.\n\
                    #[allow(clippy::unwrap_used)]\n\
                    mod tests {\n\
                    \x20   fn g() {}\n\
                    }\n";
        assert_eq!(lines_before_test_module(text), 9);
        let declared = "fn f() {}\n  #[cfg(test)]\n  pub(crate) mod tests;\n";
        assert_eq!(lines_before_test_module(declared), 1);
        assert_eq!(
            lines_before_test_module("fn f() {}\n#[cfg(test)]\nmod\n"),
            1
        );
        // No test module: every line.
        let plain = "fn f() {}\n\n#[cfg(test)]\nmodule_like!();\n#[cfg(test)]\npub fn g() {}\n";
        assert_eq!(lines_before_test_module(plain), 6);
    }

    #[test]
    fn the_conformance_suite_is_not_shipped() {
        assert!(in_conformance(Path::new("conformance/leases.rs")));
        assert!(in_conformance(Path::new("a/conformance/b/c.rs")));
        assert!(!in_conformance(Path::new("conformance.rs")));
        assert!(!in_conformance(Path::new("store.rs")));
    }
}
