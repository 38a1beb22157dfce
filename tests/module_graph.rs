//! The crate's top-level modules import each other in one direction only (ARCHITECTURE.md):
//! no cycle, and only `cli` and `app` read the settings. Read from the `crate::` paths in
//! `src/` (test code left out), so a new import that closes a cycle fails the suite. Inside the
//! Redis store the files form layers (src/store/redis/mod.rs), checked the same way from their
//! `super::` paths.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules it imports.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let relative = path.strip_prefix(&src).unwrap();
            let first = relative
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            // The binaries are not part of the library's graph.
            if first == "bin" {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy();
            if !name.ends_with(".rs") || name == "tests.rs" {
                continue;
            }
            let module = first.trim_end_matches(".rs").to_string();
            if module == "lib" || module == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // Unit tests may reach anywhere; they sit at the end of a file.
            let code = text.split("#[cfg(test)]").next().unwrap();
            let used = graph.entry(module.clone()).or_default();
            for (_, name) in paths_after(code, "crate::") {
                if name != module {
                    used.insert(name.to_string());
                }
            }
        }
    }
    graph
}

/// The first name after each `prefix` (`crate::` or `super::`) in `code`, with the line it is
/// on; `prefix{a, b::c}` on one line gives `a` and `b`. Comments are left out.
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<(&'a str, &'a str)> {
    let mut found = Vec::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap();
        for (at, _) in line.match_indices(prefix) {
            let rest = &line[at + prefix.len()..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => group
                    .split(['}', ','])
                    .map(|p| p.trim().split("::").next().unwrap())
                    .collect(),
                None => vec![
                    rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                        .next()
                        .unwrap(),
                ],
            };
            found.extend(
                names
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .map(|n| (line, n)),
            );
        }
    }
    found
}

/// A path from `from` back to itself, if there is one.
fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut path = vec![from.to_string()];
    let mut seen = BTreeSet::new();
    fn walk(
        graph: &BTreeMap<String, BTreeSet<String>>,
        target: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        let here = path.last().unwrap().clone();
        for next in graph.get(&here).into_iter().flatten() {
            if next == target {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, target, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    walk(graph, from, &mut path, &mut seen).then_some(path)
}

#[test]
fn top_level_modules_import_each_other_in_one_direction() {
    let graph = imports();
    assert!(graph.len() > 5, "the source tree was not found: {graph:?}");
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|m| cycle_through(&graph, m))
        .map(|path| path.join(" -> "))
        .collect();
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn only_cli_and_app_read_the_settings() {
    let readers: Vec<String> = imports()
        .into_iter()
        .filter(|(_, used)| used.contains("settings"))
        .map(|(module, _)| module)
        .collect();
    assert_eq!(readers, ["app", "cli"]);
}

/// The Redis store's files, lowest layer first: a file may import only from a lower layer, and
/// none imports `mod.rs`, which assembles them. A new file must be placed here.
const REDIS_LAYERS: &[&[&str]] = &[
    &["options", "slot", "script"],
    &["wire"],
    &["conn"],
    &["coalesce"],
    &["cluster"],
];

#[test]
fn the_redis_store_files_import_downwards() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/redis");
    let layer_of = |name: &str| REDIS_LAYERS.iter().position(|layer| layer.contains(&name));
    let mut wrong = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "mod" || path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        files += 1;
        let Some(layer) = layer_of(&name) else {
            wrong.push(format!("{name}.rs is in no layer of REDIS_LAYERS"));
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        for (line, used) in paths_after(code, "super::") {
            // `super::super::…` is the store module, outside this check.
            if used == "super" || line.contains("super::super::") {
                continue;
            }
            match layer_of(used) {
                Some(l) if l < layer => {}
                Some(_) => wrong.push(format!("{name}.rs imports {used}, not below it")),
                None => wrong.push(format!("{name}.rs imports {used} from mod.rs")),
            }
        }
    }
    assert!(files >= 5, "src/store/redis was not found");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The checker itself: a cycle written into a graph is found.
#[test]
fn a_cycle_is_found() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    assert_eq!(cycle_through(&graph, "a"), None);
    graph.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        cycle_through(&graph, "a"),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
