//! `cargo xtask modules`: no crate's top-level modules import each other in a cycle.
//!
//! A module depends on another when any of its files (the module's file and those under its
//! directory) names `crate::other` outside a comment and outside its inline test module. A
//! cycle is printed as the path that closes it (`a -> b -> a`) and fails the check, which
//! `cargo xtask ci` runs among its fast stages.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::util;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// `cargo xtask modules`.
pub(crate) fn command(args: &[String]) -> Result<(), String> {
    if let Some(arg) = args.first() {
        return Err(format!("modules: unknown argument `{arg}`"));
    }
    let root = util::project_root();
    let mut cycles = Vec::new();
    let mut crates: Vec<_> = std::fs::read_dir(root.join("crates"))
        .map_err(|e| format!("cannot list crates/: {e}"))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|dir| dir.join("src").is_dir())
        .collect();
    crates.sort();
    for dir in &crates {
        let graph = crate_graph(&dir.join("src"))?;
        if let Some(cycle) = find_cycle(&graph) {
            let name = dir.file_name().unwrap_or_default().to_string_lossy();
            cycles.push(format!("{name}: {}", cycle.join(" -> ")));
        }
    }
    if cycles.is_empty() {
        println!("no module import cycle in {} crates", crates.len());
        Ok(())
    } else {
        Err(format!("module import cycles:\n  {}", cycles.join("\n  ")))
    }
}

/// Each top-level module of the crate under `src` and the top-level modules it names.
fn crate_graph(src: &Path) -> Result<Graph, String> {
    let mut files = Vec::new();
    util::rust_files(src, &mut files)?;
    let mut graph = Graph::new();
    for file in files {
        let Ok(relative) = file.strip_prefix(src) else {
            continue;
        };
        let Some(module) = top_module(relative) else {
            continue;
        };
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("read {}: {e}", file.display()))?;
        let named = named_modules(&text);
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(named.into_iter().filter(|m| *m != module));
    }
    // Only modules of this crate count (`crate::SomeType` re-exports are not modules).
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for edges in graph.values_mut() {
        edges.retain(|m| modules.contains(m));
    }
    Ok(graph)
}

/// The top-level module a file belongs to: `a.rs` and `a/...` are `a`; the crate root and
/// binaries (`src/bin/`) belong to none.
fn top_module(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    match name {
        "lib" | "main" | "bin" => None,
        _ => Some(name.to_string()),
    }
}

/// The modules `text` names as `crate::name`, outside comments and the inline test module.
fn named_modules(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let mut named = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                named.insert(name);
            }
        }
    }
    named
}

/// A cycle of `graph`, as the modules along it with the first repeated at the end.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit<'g>(
        graph: &'g Graph,
        module: &'g str,
        path: &mut Vec<&'g str>,
        done: &mut BTreeSet<&'g str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| *m == module) {
            let mut cycle: Vec<String> = path[at..].iter().map(|m| m.to_string()).collect();
            cycle.push(module.to_string());
            return Some(cycle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module);
        for next in graph.get(module).into_iter().flatten() {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(module);
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|module| visit(graph, module, &mut Vec::new(), &mut done))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> Graph {
        edges
            .iter()
            .map(|(m, to)| (m.to_string(), to.iter().map(|t| t.to_string()).collect()))
            .collect()
    }

    #[test]
    fn a_cycle_is_found_and_a_tree_is_not() {
        let tree = graph(&[("a", &["b", "c"]), ("b", &["c"]), ("c", &[])]);
        assert_eq!(find_cycle(&tree), None);
        let cyclic = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"])]);
        assert_eq!(
            find_cycle(&cyclic),
            Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
        );
    }

    #[test]
    fn only_code_outside_comments_and_tests_names_a_module() {
        let text =
            "use crate::a::X;\n/// see [`Y`](crate::b::Y)\nlet x = crate::c::f(); // crate::d\n\
                    #[cfg(test)]\nmod tests {\n    use crate::e;\n}\n";
        let named: Vec<_> = named_modules(text).into_iter().collect();
        assert_eq!(named, ["a", "c"]);
    }

    #[test]
    fn files_belong_to_their_top_module() {
        assert_eq!(top_module(Path::new("a.rs")).as_deref(), Some("a"));
        assert_eq!(top_module(Path::new("a/b/c.rs")).as_deref(), Some("a"));
        assert_eq!(top_module(Path::new("lib.rs")), None);
        assert_eq!(top_module(Path::new("bin/tool.rs")), None);
    }
}
