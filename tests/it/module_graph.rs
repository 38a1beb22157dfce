//! Inside each crate the modules import each other in one direction (ARCHITECTURE.md), which
//! Cargo cannot check (it keeps the crates themselves in one direction): no cycle among a
//! crate's top-level modules, none among the modules inside any folder (`server/named.rs` and
//! `server/rls.rs` may not import each other), and only `cli` and `app` read the server's
//! settings. Read from the `crate::`, `super::` and `self::` paths of each crate of
//! `source::CRATES` (unit tests left out, `use` groups followed across lines), so a new import
//! that closes a cycle fails the suite. Inside the Redis store the files form layers
//! (crates/sluice/src/store/redis/mod.rs), checked the same way.

use sluice_test_kit::source;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use source::{CRATES, SourceFile, crate_files, named_paths};

/// A folder's module path (`[]` for `src/` itself, `["store", "redis"]`) → its child modules →
/// the sibling modules each imports.
type Graphs = BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>>;

/// The import graphs of one crate's library `files`: every folder's graph among its child
/// modules. A path named in `a/b/c.rs` that leads to `a/x/…` is an import of `x` by `b` in
/// folder `a` (and nothing at the top level, where both are `a`). A folder's own `mod.rs` is the
/// parent of its children, not one of them.
fn graphs_of(files: &[SourceFile]) -> Graphs {
    let children: BTreeMap<Vec<String>, BTreeSet<String>> =
        files.iter().fold(BTreeMap::new(), |mut map, file| {
            for depth in 0..file.module.len() {
                map.entry(file.module[..depth].to_vec())
                    .or_default()
                    .insert(file.module[depth].clone());
            }
            map
        });
    let mut graphs = Graphs::new();
    for (folder, names) in &children {
        let graph = graphs.entry(folder.clone()).or_default();
        for name in names {
            graph.entry(name.clone()).or_default();
        }
    }
    for file in files.iter().filter(|f| !f.is_test_file()) {
        for path in named_paths(&file.code(), &file.module) {
            let common = file
                .module
                .iter()
                .zip(&path)
                .take_while(|(a, b)| a == b)
                .count();
            if common >= file.module.len() || common >= path.len() {
                continue;
            }
            let folder = file.module[..common].to_vec();
            let (from, to) = (&file.module[common], &path[common]);
            if children.get(&folder).is_some_and(|c| c.contains(to)) {
                graphs
                    .entry(folder)
                    .or_default()
                    .entry(from.clone())
                    .or_default()
                    .insert(to.clone());
            }
        }
    }
    graphs
}

/// The server's top-level modules → the top-level modules each imports.
fn server_imports() -> BTreeMap<String, BTreeSet<String>> {
    graphs_of(&crate_files("src"))
        .remove(&Vec::new())
        .unwrap_or_default()
}

/// The first name after each `super::` in `code`, with the line it is on.
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
fn modules_import_each_other_in_one_direction_in_every_crate() {
    let mut cycles = Vec::new();
    for src in CRATES {
        let graphs = graphs_of(&crate_files(src));
        let top = graphs.get(&Vec::new()).map_or(0, |top| top.len());
        assert!(top >= 1, "{src} was not found: {graphs:?}");
        cycles.extend(cycles_in(&graphs, src));
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

/// Every cycle in every folder of `graphs` (the top level too), named from `src`.
fn cycles_in(graphs: &Graphs, src: &str) -> Vec<String> {
    let mut cycles = Vec::new();
    for (folder, graph) in graphs {
        for module in graph.keys() {
            if let Some(path) = cycle_through(graph, module) {
                let folder = folder.join("/");
                cycles.push(format!("{src}/{folder}: {}", path.join(" -> ")));
            }
        }
    }
    cycles
}

/// The reader itself: `use` groups across lines, `super::` from a file and from a `mod.rs`,
/// paths in comments and strings ignored.
#[test]
fn imports_are_read_from_every_form_of_path() {
    let code = source::blank_comments_and_strings(
        "use crate::{\n    a::b,\n    c::{d, e::f},\n};\nuse super::g; // crate::h\nlet s = \"crate::i\";\nsuper::super::j::k();\n",
    );
    let module = vec!["x".to_string(), "y".to_string()];
    let paths: Vec<String> = named_paths(&code, &module)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(paths, ["a::b", "c::d", "c::e::f", "x::g", "j::k"]);
}

#[test]
fn only_cli_and_app_read_the_settings() {
    let readers: Vec<String> = server_imports()
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
    &["wire", "merge"],
    &["conn", "timeout"],
    &["coalesce", "plain"],
    &["cluster"],
];

/// Files that are part of `mod.rs`, split off for length (`named.rs`: `RedisStore`'s
/// `LimiterStore`): like `mod.rs` they sit above every layer and may import from all of them and
/// from `mod.rs`, so the layer check skips them.
const REDIS_MOD_PARTS: &[&str] = &["named"];

#[test]
fn the_redis_store_files_import_downwards() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/sluice/src/store/redis");
    let layer_of = |name: &str| REDIS_LAYERS.iter().position(|layer| layer.contains(&name));
    let mut wrong = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "mod"
            || REDIS_MOD_PARTS.contains(&name.as_str())
            || path.extension().is_none_or(|e| e != "rs")
        {
            continue;
        }
        files += 1;
        let Some(layer) = layer_of(&name) else {
            wrong.push(format!("{name}.rs is in no layer of REDIS_LAYERS"));
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap();
        let code = source::before_unit_tests(&text);
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
    assert!(files >= 5, "crates/sluice/src/store/redis was not found");
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
