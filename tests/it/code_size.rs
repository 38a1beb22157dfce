//! Files and functions a newcomer can read: a library file over [`MAX_FILE_LINES`] lines of code
//! (its unit-test module at the end not counted) or a function over [`MAX_FUNCTION_LINES`] lines fails
//! this check, unless the file says at its top why it is long, in a line of its opening doc
//! comment that starts with `//! Long because` (for a file) or a comment right above the
//! function that starts with `// Long because`. Splitting is the usual answer; the reason is
//! for the rare piece that reads better whole (a table, a state machine).

use sluice_test_kit::source;

use source::{functions, library_files};

/// Lines of code, before the unit-test module, above which a file must say why it is long.
const MAX_FILE_LINES: usize = 800;
/// Lines, signature to closing brace, above which a function must say why it is long.
const MAX_FUNCTION_LINES: usize = 80;

/// The file says at its top (in its opening `//!` comment) why it is long.
fn file_says_why(text: &str) -> bool {
    text.lines()
        .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
        .any(|l| {
            l.trim_start_matches("//!")
                .trim()
                .starts_with("Long because")
        })
}

/// The comment lines right above line `line` (1-based) of `text`, past attributes, say why the
/// function there is long.
fn function_says_why(text: &str, line: usize) -> bool {
    let lines: Vec<&str> = text.lines().collect();
    lines[..line.saturating_sub(1)]
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("//") || l.starts_with("#["))
        .any(|l| {
            l.trim_start_matches('/')
                .trim_start_matches('!')
                .trim()
                .starts_with("Long because")
        })
}

/// Everything too long that does not say why, one line each, in the service's library and the
/// client crate's.
fn too_long() -> Vec<String> {
    let mut found = Vec::new();
    let files = library_files().into_iter();
    for file in files.filter(|f| !f.is_test_file()) {
        let shown = file
            .path
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(&file.path)
            .display()
            .to_string();
        let code = file.code();
        let lines = code.lines().count();
        if lines > MAX_FILE_LINES && !file_says_why(&file.text) {
            found.push(format!(
                "{shown}: {lines} lines of code (over {MAX_FILE_LINES}); split it, or say at its \
                 top why it is long (`//! Long because …`)"
            ));
        }
        for (line, name, length) in functions(&code) {
            if length > MAX_FUNCTION_LINES && !function_says_why(&file.text, line) {
                found.push(format!(
                    "{shown}:{line}: fn {name} is {length} lines (over {MAX_FUNCTION_LINES}); \
                     split it, or say above it why it is long (`// Long because …`)"
                ));
            }
        }
    }
    found
}

#[test]
fn files_and_functions_are_short_or_say_why() {
    let found = too_long();
    assert!(found.is_empty(), "too long:\n{}", found.join("\n"));
}

/// The measure itself: a function's lines run from its signature to its closing brace, braces
/// in strings and comments do not count, nested functions are measured too, bodiless trait
/// functions are not.
#[test]
fn functions_are_measured_from_signature_to_closing_brace() {
    let text = "fn a() {\n    let s = \"}\"; // }\n}\n\ntrait T {\n    fn b(&self);\n}\n\nfn c(\n    x: u32,\n) -> u32 {\n    fn d() {}\n    x\n}\n";
    let code = source::blank_comments_and_strings(text);
    assert_eq!(
        functions(&code),
        [
            (1, "a".to_string(), 3),
            (9, "c".to_string(), 6),
            (12, "d".to_string(), 1),
        ]
    );
}

/// Only a `#[cfg(test)]` on a module ends the code; one on a field does not.
#[test]
fn code_runs_to_the_unit_test_module() {
    let text =
        "struct S {\n    #[cfg(test)]\n    x: u8,\n}\nfn f() {}\n#[cfg(test)]\nmod tests {}\n";
    assert_eq!(
        source::before_unit_tests(text),
        "struct S {\n    #[cfg(test)]\n    x: u8,\n}\nfn f() {}\n"
    );
}

#[test]
fn a_reason_above_a_function_or_at_a_file_top_is_found() {
    let text = "//! A file.\n//! Long because it is a table.\n\n// Long because a state machine.\n#[allow(x)]\nfn f() {}\n";
    assert!(file_says_why(text));
    assert!(function_says_why(text, 6));
    assert!(!function_says_why("fn g() {}\n", 1));
    assert!(!file_says_why(
        "//! A file.\nuse x;\n//! Long because it is late.\n"
    ));
}
