//! Reading the workspace's own source as text, for the checks that keep its shape
//! (`tests/it/module_graph.rs`, `tests/it/code_size.rs`): which files there are, each file's module
//! path, its code without comments, string literals and unit tests, and the module paths that
//! code names through `crate::`, `super::` and `self::`.
//!
//! A parser of our own rather than `syn`: the checks need paths and item extents only, and a
//! text reader keeps the test crates free of a proc-macro stack.

use std::path::{Path, PathBuf};

/// One `.rs` file of a crate's library.
pub struct SourceFile {
    pub path: PathBuf,
    /// Relative to its crate's `src/`, e.g. `server/named.rs`.
    pub relative: String,
    /// The module it defines: `["server", "named"]`; a `mod.rs` is its folder's module.
    pub module: Vec<String>,
    pub text: String,
}

impl SourceFile {
    /// The code before the unit tests (`#[cfg(test)] mod …`, at the end of a file), with
    /// comments and the insides of string literals blanked out, line breaks kept.
    pub fn code(&self) -> String {
        blank_comments_and_strings(before_unit_tests(&self.text))
    }

    /// Whether this file is where unit tests live on their own (`tests.rs`).
    pub fn is_test_file(&self) -> bool {
        self.relative.ends_with("/tests.rs") || self.relative == "tests.rs"
    }
}

/// `text` up to its unit-test module: the first `#[cfg(test)]` followed by `mod` (one on a field
/// or a function is code like any other).
pub fn before_unit_tests(text: &str) -> &str {
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]") {
        let at = from + at;
        let rest = text[at + "#[cfg(test)]".len()..].trim_start();
        if rest.starts_with("mod ") || rest.starts_with("pub mod ") {
            return &text[..at];
        }
        from = at + 1;
    }
    text
}

/// The source folders of the workspace's crates whose shape the checks keep, from the root:
/// the server, the library, the protocol and the client. Cargo keeps the crates themselves in
/// one direction (proto ← library ← server; proto ← client); the checks keep what it cannot,
/// the modules inside each.
pub const CRATES: &[&str] = &[
    "src",
    "crates/sluice/src",
    "crates/sluice-proto/src",
    "client/src",
];

/// Every `.rs` file under the crate source folder `src` (one of [`CRATES`]) that belongs to
/// its library (not `main.rs`, `lib.rs`, `bin/`).
pub fn crate_files(src: &str) -> Vec<SourceFile> {
    library_files_in(&crate::workspace_root().join(src))
}

/// Every library file of every crate of [`CRATES`].
pub fn library_files() -> Vec<SourceFile> {
    CRATES.iter().flat_map(|src| crate_files(src)).collect()
}

/// Every `.rs` file of the library whose source folder is `src`.
fn library_files_in(src: &Path) -> Vec<SourceFile> {
    let src = src.to_path_buf();
    let mut files = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "bin") || dir != src {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if relative == "lib.rs" || relative == "main.rs" {
                continue;
            }
            let mut module: Vec<String> = relative
                .trim_end_matches(".rs")
                .split('/')
                .map(str::to_string)
                .collect();
            if module.last().is_some_and(|m| m == "mod") {
                module.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            files.push(SourceFile {
                path,
                relative,
                module,
                text,
            });
        }
    }
    files.sort_by(|a, b| a.relative.cmp(&b.relative));
    files
}

/// `text` with `//` and `/* */` comments and the contents of string and char literals replaced
/// by spaces, so that paths and braces inside them are not read as code. Line breaks stay, so
/// line numbers stay true.
pub fn blank_comments_and_strings(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"…", r#"…"#, with as many hashes closing as opening.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push('"');
            i = j + 1;
            loop {
                if i >= chars.len() {
                    break;
                }
                if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
                    out.push('"');
                    i += 1 + hashes;
                    break;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                    if i < chars.len() {
                        out.push(blank(chars[i]));
                        i += 1;
                    }
                    continue;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
            out.push('"');
            i += 1;
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{7f}', '{'), or a lifetime ('a), which stays.
            let close = if next == Some('\\') {
                chars[i + 2..]
                    .iter()
                    .position(|&c| c == '\'')
                    .map(|p| i + 2 + p)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(end) => {
                    out.push('\'');
                    for _ in i + 1..end {
                        out.push(' ');
                    }
                    out.push('\'');
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// The module paths `code` names, resolved from `module` (the file's own module path):
/// `crate::a::b` is `[a, b]`, `super::x` in `server/named.rs` is `[server, x]`, `self::x` in a
/// `mod.rs` of `store` is `[store, x]`; `use crate::{a::b, c}` gives both, also across lines.
/// The paths run to their last name, which may be an item rather than a module: callers keep
/// the prefix they care about.
pub fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if ident_before(&chars, i) || (i > 0 && chars[i - 1] == ':') {
            i += 1;
            continue;
        }
        let rest: String = chars[i..chars.len().min(i + 8)].iter().collect();
        let (base, skip): (Vec<String>, usize) = if rest.starts_with("crate::") {
            (Vec::new(), 7)
        } else if rest.starts_with("super::") {
            // `super` of a file's module is its parent; a mod.rs is its folder's module, so
            // the same rule holds for it.
            let parent = module[..module.len().saturating_sub(1)].to_vec();
            (parent, 7)
        } else if rest.starts_with("self::") {
            (module.to_vec(), 6)
        } else {
            i += 1;
            continue;
        };
        let mut j = i + skip;
        let mut trees = Vec::new();
        parse_tree(&chars, &mut j, base, &mut trees);
        found.extend(trees);
        i = j.max(i + 1);
    }
    found
}

/// Reads one use-tree at `*at` (`a::b`, `super::x`, `{a, b::{c, d}}`, `*`), starting under
/// `prefix`, and pushes every full path it names.
fn parse_tree(chars: &[char], at: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    loop {
        skip_space(chars, at);
        if chars.get(*at) == Some(&'{') {
            *at += 1;
            loop {
                skip_space(chars, at);
                match chars.get(*at) {
                    None => return,
                    Some('}') => {
                        *at += 1;
                        return;
                    }
                    Some(',') => *at += 1,
                    Some(_) => {
                        let before = *at;
                        parse_tree(chars, at, path.clone(), out);
                        if *at == before {
                            *at += 1;
                        }
                    }
                }
            }
        }
        let start = *at;
        while *at < chars.len() && (chars[*at].is_alphanumeric() || chars[*at] == '_') {
            *at += 1;
        }
        if *at == start {
            if !path.is_empty() {
                out.push(path);
            }
            return;
        }
        let name: String = chars[start..*at].iter().collect();
        if name == "super" {
            path.pop();
        } else if name != "self" {
            path.push(name);
        }
        if chars.get(*at) == Some(&':') && chars.get(*at + 1) == Some(&':') {
            *at += 2;
            continue;
        }
        out.push(path);
        return;
    }
}

fn skip_space(chars: &[char], at: &mut usize) {
    while *at < chars.len() && chars[*at].is_whitespace() {
        *at += 1;
    }
}

/// The `fn` items of `code` with the line their signature starts on (1-based), their name and
/// their length in lines (signature to closing brace). Functions without a body (trait
/// declarations) are left out.
pub fn functions(code: &str) -> Vec<(usize, String, usize)> {
    let chars: Vec<char> = code.chars().collect();
    let line_at = |pos: usize| chars[..pos].iter().filter(|&&c| c == '\n').count() + 1;
    let mut found = Vec::new();
    let mut i = 0;
    while i + 3 < chars.len() {
        let is_fn = chars[i] == 'f'
            && chars[i + 1] == 'n'
            && chars[i + 2].is_whitespace()
            && !ident_before(&chars, i);
        if !is_fn {
            i += 1;
            continue;
        }
        let mut j = i + 2;
        skip_space(&chars, &mut j);
        let start = j;
        while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
            j += 1;
        }
        let name: String = chars[start..j].iter().collect();
        // The body opens at the first `{` outside parentheses and angle brackets after the
        // signature; a `;` first means a declaration without a body.
        let mut depth = 0i32;
        let mut body = None;
        while j < chars.len() {
            match chars[j] {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth == 0 => break,
                '{' if depth == 0 => {
                    body = Some(j);
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        let Some(open) = body else {
            i = j.max(i + 1);
            continue;
        };
        let mut braces = 0i32;
        let mut k = open;
        while k < chars.len() {
            match chars[k] {
                '{' => braces += 1,
                '}' => {
                    braces -= 1;
                    if braces == 0 {
                        break;
                    }
                }
                _ => {}
            }
            k += 1;
        }
        let first = line_at(i);
        let last = line_at(k.min(chars.len() - 1));
        found.push((first, name, last - first + 1));
        // Nested functions are found too: go on inside the body.
        i = open + 1;
    }
    found
}
