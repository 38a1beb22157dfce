//! The docs say what is true, and what they tell a reader to type runs. Read from every Markdown
//! file of the repository (vendor/ and target/ left out):
//!
//! - every fenced block names its language, and every shell block says how it runs, by the
//!   convention of docs/development.md ("Commands in the docs"): ```` ```sh ```` runs as written,
//!   ```` ```sh serves ```` starts the service (the test waits for its health, then stops it),
//!   ```` ```sh server ```` calls a service the test started the way the README's first command
//!   does, ```` ```sh norun: why ```` is not run, for the reason given, and `needs=TOOL` runs a
//!   block only where the tool is found;
//! - the runnable blocks run, each within [`BLOCK_TIMEOUT`], against the `sluice` binary cargo
//!   built for this test (`cargo run [--release] -- ARGS` and `sluice` both mean it);
//! - the paths ARCHITECTURE.md's recipes name exist, and so do the files and headings the docs
//!   link to, so that neither rots when code or a guide moves;
//! - the README stays a front page (at most [`README_MAX_LINES`] lines) and names the test
//!   command CI runs.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// How long one block may run, and a served block may take to listen. A quiet machine runs
/// every block here in well under a second.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(60);
const README_MAX_LINES: usize = 400;
/// The service the `server` blocks call: the README's first command.
const SERVICE: &str = "cargo run --release -- serve --config-dir examples/config";
/// Folders that hold no docs of ours.
const SKIPPED_DIRS: &[&str] = &["target", "vendor", "node_modules"];

/// The shell every runnable block runs in: strict, with `cargo run [--release] --` as the binary
/// under test and `curl` failing on an HTTP error, so a call a guide shows answering must answer.
const PREAMBLE: &str = r#"set -euo pipefail
cargo() {
  if [ "${1-}" = run ]; then
    shift
    if [ "${1-}" = --release ]; then shift; fi
    if [ "${1-}" = -- ]; then shift; "$SLUICE_BIN" "$@"; return; fi
  fi
  echo "tests/it/docs.rs runs only 'cargo run [--release] -- ARGS' (the built sluice); mark this block norun" >&2
  return 127
}
curl() { command curl --fail-with-body "$@"; }
"#;

/// One fenced block of a Markdown file.
#[derive(Debug)]
struct Block {
    /// The file, from the repository root.
    file: String,
    /// The line of the opening fence.
    line: usize,
    /// What follows the opening fence (` ```sh norun: why ` → `sh norun: why`).
    info: String,
    text: String,
}

impl Block {
    fn at(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// How a shell block runs.
#[derive(Debug, PartialEq)]
enum Shell {
    /// Run as written; it must exit 0.
    Runs { how: How, needs: Option<String> },
    /// Not run, for this reason.
    NoRun(String),
}

#[derive(Debug, PartialEq)]
enum How {
    /// Runs to its end.
    Plain,
    /// Starts the service and keeps it running.
    Serves,
    /// Calls a service the test starts first.
    Server,
}

/// The languages that are shells: written `sh`, so that one convention covers them.
const SHELLS: &[&str] = &[
    "sh",
    "bash",
    "shell",
    "console",
    "zsh",
    "shell-session",
    "terminal",
];

/// How the block with this info string runs: `None` when it is not a shell block.
fn shell_of(info: &str) -> Result<Option<Shell>, String> {
    let language = info.split_whitespace().next().unwrap_or("");
    if !SHELLS.contains(&language.to_lowercase().as_str()) {
        return Ok(None);
    }
    if language != "sh" {
        return Err(format!("a shell block is written ```sh, not ```{language}"));
    }
    let rest = info["sh".len()..].trim();
    if let Some(reason) = rest.strip_prefix("norun") {
        let reason = reason.strip_prefix(':').map(str::trim).unwrap_or("");
        if reason.is_empty() {
            return Err("```sh norun needs a reason: ```sh norun: why it cannot run here".into());
        }
        return Ok(Some(Shell::NoRun(reason.to_string())));
    }
    let (mut how, mut needs) = (How::Plain, None);
    for word in rest.split_whitespace() {
        match word {
            "serves" if how == How::Plain => how = How::Serves,
            "server" if how == How::Plain => how = How::Server,
            _ if word.starts_with("needs=") && needs.is_none() && word.len() > 6 => {
                needs = Some(word["needs=".len()..].to_string())
            }
            _ => {
                return Err(format!(
                    "```sh does not know `{word}` (see docs/development.md)"
                ));
            }
        }
    }
    Ok(Some(Shell::Runs { how, needs }))
}

/// Every Markdown file of the repository, from the root, sorted.
fn markdown_files() -> Vec<String> {
    let mut files = Vec::new();
    let mut pending = vec![PathBuf::from(ROOT)];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !name.starts_with('.') && !SKIPPED_DIRS.contains(&name.as_str()) {
                    pending.push(path);
                }
            } else if name.ends_with(".md") {
                files.push(relative(&path));
            }
        }
    }
    files.sort();
    files
}

fn relative(path: &Path) -> String {
    path.strip_prefix(ROOT)
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn read(file: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(file)).unwrap()
}

/// The fenced blocks of `text` (a fence may be indented, in a list; its lines lose as much).
fn fenced_blocks(file: &str, text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, usize, String, Vec<&str>)> = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some((index + 1, indent, info.trim().to_string(), Vec::new()));
                }
            }
            Some((start, indent, info, lines)) => {
                if trimmed.trim_end() == "```" {
                    blocks.push(Block {
                        file: file.to_string(),
                        line: *start,
                        info: std::mem::take(info),
                        text: lines.join("\n"),
                    });
                    open = None;
                } else {
                    let cut = line.len() - line.trim_start().len();
                    lines.push(&line[cut.min(*indent)..]);
                }
            }
        }
    }
    assert!(open.is_none(), "{file}: a fenced block is never closed");
    blocks
}

fn all_blocks() -> Vec<Block> {
    markdown_files()
        .iter()
        .flat_map(|file| fenced_blocks(file, &read(file)))
        .collect()
}

#[test]
fn every_block_names_its_language_and_every_shell_block_how_it_runs() {
    let mut wrong = Vec::new();
    let mut shells = 0;
    for block in all_blocks() {
        if block.info.is_empty() {
            wrong.push(format!(
                "{}: a fenced block names no language (```text for output, ```sh for commands)",
                block.at()
            ));
            continue;
        }
        match shell_of(&block.info) {
            Ok(Some(_)) => shells += 1,
            Ok(None) => {}
            Err(why) => wrong.push(format!("{}: {why}", block.at())),
        }
    }
    assert!(
        shells >= 10,
        "only {shells} shell blocks found under {ROOT}"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn info_strings_say_how_a_block_runs() {
    let runs = |how, needs: Option<&str>| {
        Ok(Some(Shell::Runs {
            how,
            needs: needs.map(String::from),
        }))
    };
    assert_eq!(shell_of("yaml"), Ok(None));
    assert_eq!(shell_of("sh"), runs(How::Plain, None));
    assert_eq!(shell_of("sh serves"), runs(How::Serves, None));
    assert_eq!(
        shell_of("sh server needs=grpcurl"),
        runs(How::Server, Some("grpcurl"))
    );
    assert_eq!(
        shell_of("sh norun: needs a Kubernetes cluster"),
        Ok(Some(Shell::NoRun("needs a Kubernetes cluster".into())))
    );
    for wrong in [
        "bash",
        "sh norun",
        "sh norun:",
        "sh serves server",
        "sh later",
        "sh needs=",
    ] {
        assert!(shell_of(wrong).is_err(), "{wrong} was accepted");
    }
}

/// Where the `sluice` binary under test and the tools of `needs=` are found: a folder put first
/// on a block's `PATH`.
struct Tools {
    dir: tempfile::TempDir,
}

impl Tools {
    fn new() -> Tools {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), dir.path().join("sluice"))
            .unwrap();
        if let Some(envoy) = envoy() {
            std::os::unix::fs::symlink(envoy, dir.path().join("envoy")).unwrap();
        }
        Tools { dir }
    }

    /// Whether `tool` is here or on the test's `PATH`.
    fn has(&self, tool: &str) -> bool {
        let path = std::env::var("PATH").unwrap_or_default();
        std::iter::once(self.dir.path().to_path_buf())
            .chain(std::env::split_paths(&path))
            .any(|dir| dir.join(tool).is_file())
    }

    /// `bash` running `script` after [`PREAMBLE`] from the repository root, in an environment
    /// of its own (nothing of the test's but `PATH`), in a process group of its own, its output
    /// into `out`.
    fn shell(&self, script: &str, env: &[(&str, String)], out: &File) -> Child {
        let path = std::env::var("PATH").unwrap_or_default();
        Command::new("bash")
            .arg("-c")
            .arg(format!("{PREAMBLE}{script}\n"))
            .current_dir(ROOT)
            .env_clear()
            .env("PATH", format!("{}:{path}", self.dir.path().display()))
            .env("HOME", self.dir.path())
            .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out.try_clone().unwrap())
            .process_group(0)
            .spawn()
            .unwrap()
    }
}

/// The Envoy scripts/test.sh installs: `SLUICE_TEST_ENVOY`, else its virtualenv among the
/// tests' tools.
fn envoy() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SLUICE_TEST_ENVOY") {
        return Some(PathBuf::from(path));
    }
    Some(sluice_test_kit::test_tools().join("envoy-venv/bin/envoy")).filter(|p| p.is_file())
}

/// A block's shell, killed with its whole process group when dropped.
struct Running {
    child: Child,
    out: tempfile::NamedTempFile,
}

impl Running {
    fn output(&self) -> String {
        let mut text = String::new();
        File::open(self.out.path())
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text
    }

    /// The exit status, or `None` when it ran past `limit`.
    fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

fn start(tools: &Tools, script: &str, env: &[(&str, String)]) -> Running {
    let out = tempfile::NamedTempFile::new().unwrap();
    let child = tools.shell(script, env, out.as_file());
    Running { child, out }
}

/// Where a served block's service listens.
struct Listening {
    grpc: SocketAddr,
    http: SocketAddr,
    debug: SocketAddr,
}

/// The environment a served service gets: free ports on loopback, and JSON logs whose
/// "sluice is listening" line tells the test where.
fn serving_env() -> Vec<(&'static str, String)> {
    [
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
        ("LOG_FORMAT", "json"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_string()))
    .collect()
}

/// Starts `script`, which serves, and waits until it listens and its health is OK.
fn serve(tools: &Tools, script: &str) -> Result<(Running, Listening), String> {
    let mut running = start(tools, script, &serving_env());
    let deadline = Instant::now() + BLOCK_TIMEOUT;
    let listening = loop {
        if let Some(found) = listening_in(&running.output()) {
            break found;
        }
        if let Some(status) = running.wait(Duration::from_millis(50)) {
            return Err(format!(
                "exited ({status}) before it listened:\n{}",
                running.output()
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not listening after {BLOCK_TIMEOUT:?}:\n{}",
                running.output()
            ));
        }
    };
    match http_get(listening.http, "/healthcheck") {
        Ok((200, body)) if body.trim() == "OK" => Ok((running, listening)),
        answer => Err(format!(
            "/healthcheck answered {answer:?}:\n{}",
            running.output()
        )),
    }
}

fn listening_in(log: &str) -> Option<Listening> {
    log.lines().find_map(|line| {
        let event: serde_json::Value = serde_json::from_str(line).ok()?;
        if event["@message"] != "sluice is listening" {
            return None;
        }
        let addr = |k: &str| event[k].as_str()?.parse().ok();
        Some(Listening {
            grpc: addr("grpc")?,
            http: addr("http")?,
            debug: addr("debug")?,
        })
    })
}

/// A plain HTTP/1.1 GET: (status, body).
fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(BLOCK_TIMEOUT)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {answer:?}"))?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_string()))
}

/// `script` with the README's addresses (HTTP :8080, gRPC :8081, debug :6070) turned into the
/// ones the test's service listens on.
fn aimed_at(script: &str, service: &Listening) -> String {
    let mut script = script.to_string();
    for host in ["localhost", "127.0.0.1"] {
        for (port, addr) in [
            (8080, service.http),
            (8081, service.grpc),
            (6070, service.debug),
        ] {
            script = script.replace(&format!("{host}:{port}"), &addr.to_string());
        }
    }
    script
}

/// Runs a block as its info string says: `Ok` when it did what the convention asks.
fn run(tools: &Tools, how: &How, script: &str) -> Result<(), String> {
    let (script, _service) = match how {
        How::Serves => return serve(tools, script).map(|_| ()),
        How::Plain => (script.to_string(), None),
        How::Server => {
            let (service, listening) = serve(tools, SERVICE)
                .map_err(|e| format!("the service for this block did not start: {e}"))?;
            (aimed_at(script, &listening), Some(service))
        }
    };
    let mut running = start(tools, &script, &[]);
    match running.wait(BLOCK_TIMEOUT) {
        Some(status) if status.success() => Ok(()),
        Some(status) => Err(format!("exited {status}:\n{}", running.output())),
        None => Err(format!(
            "still running after {BLOCK_TIMEOUT:?}:\n{}",
            running.output()
        )),
    }
}

#[test]
fn the_shell_blocks_of_the_docs_run() {
    let tools = Tools::new();
    let (mut ran, mut skipped, mut failed) = (0, Vec::new(), Vec::new());
    for block in all_blocks() {
        let Ok(Some(Shell::Runs { how, needs })) = shell_of(&block.info) else {
            continue;
        };
        if let Some(tool) = needs.filter(|tool| !tools.has(tool)) {
            skipped.push(format!("{} (needs {tool})", block.at()));
            continue;
        }
        let started = Instant::now();
        match run(&tools, &how, &block.text) {
            Ok(()) => ran += 1,
            Err(why) => failed.push(format!("{} ```{}: {why}", block.at(), block.info)),
        }
        eprintln!("{} ```{}: {:?}", block.at(), block.info, started.elapsed());
    }
    eprintln!("ran {ran} blocks; skipped, their tool missing: {skipped:?}");
    assert!(ran >= 3, "only {ran} blocks ran");
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// The runner itself: what fails, fails.
#[test]
fn a_block_that_fails_fails_the_check() {
    let tools = Tools::new();
    let fails = |how, script: &str| run(&tools, &how, script).is_err();
    assert!(fails(How::Plain, "false"));
    assert!(fails(How::Plain, "cargo build"));
    assert!(fails(
        How::Plain,
        "sluice check-config deploy/no-such-directory"
    ));
    assert!(fails(How::Server, "curl -s localhost:8080/no-such-path"));
    assert!(fails(How::Serves, "true"));
    assert!(!fails(How::Server, "curl -s localhost:8080/healthcheck"));
    assert!(!fails(
        How::Plain,
        "cargo run -- check-config examples/config"
    ));
}

#[test]
fn the_readme_is_a_front_page_that_names_the_test_command() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; move the rest into a guide in docs/"
    );
    let commands: Vec<String> = fenced_blocks("README.md", &readme)
        .iter()
        .filter(|b| b.info.starts_with("sh"))
        .flat_map(|b| b.text.lines().map(str::to_string).collect::<Vec<_>>())
        .collect();
    assert!(
        commands.iter().any(|c| c == SERVICE),
        "README.md lost `{SERVICE}`"
    );
    assert!(commands.iter().any(|c| c == "scripts/test.sh"));
    assert!(read(".ci/run").contains("exec scripts/test.sh"));
}

/// The text of `markdown` under the heading `## {title}`, up to the next `## `.
fn section<'a>(markdown: &'a str, title: &str) -> &'a str {
    let heading = format!("\n## {title}\n");
    let start = markdown
        .find(&heading)
        .unwrap_or_else(|| panic!("no heading `## {title}`"))
        + heading.len();
    let length = markdown[start..]
        .find("\n## ")
        .unwrap_or(markdown.len() - start);
    &markdown[start..start + length]
}

/// Whether `token` names a file or folder: no spaces, and a `/` or a file's extension.
fn is_path(token: &str) -> bool {
    const EXTENSIONS: &[&str] = &[
        ".rs", ".lua", ".proto", ".md", ".toml", ".sh", ".yaml", ".svg",
    ];
    !token.contains(char::is_whitespace)
        && !token.contains("::")
        && (token.contains('/') || EXTENSIONS.iter().any(|e| token.ends_with(e)))
}

/// The code spans of `text`: what lies between a run of backticks and the next run of the same
/// length (so `` ```sh `` is one span, as Markdown reads it).
fn code_spans(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let run_at = |at: usize| bytes[at..].iter().take_while(|&&b| b == b'`').count();
    let mut spans = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'`' {
            at += 1;
            continue;
        }
        let opening = run_at(at);
        let inside = at + opening;
        let mut close = inside;
        while close < bytes.len() && (bytes[close] != b'`' || run_at(close) != opening) {
            close += if bytes[close] == b'`' {
                run_at(close)
            } else {
                1
            };
        }
        if close >= bytes.len() {
            at = inside;
            continue;
        }
        spans.push(text[inside..close].trim());
        at = close + opening;
    }
    spans
}

/// The paths `text` names in code spans (a `::item` or `:line` after a file left off).
fn paths_in(text: &str) -> Vec<&str> {
    code_spans(text)
        .into_iter()
        .map(|span| span.split("::").next().unwrap())
        .map(|span| match span.rsplit_once(':') {
            Some((path, line)) if line.chars().all(|c| c.is_ascii_digit()) => path,
            _ => span,
        })
        .filter(|span| is_path(span))
        .collect()
}

#[test]
fn the_paths_the_recipes_name_exist() {
    let architecture = read("ARCHITECTURE.md");
    let recipes = section(&architecture, "Recipes");
    let paths = paths_in(recipes);
    let missing: Vec<&&str> = paths
        .iter()
        .filter(|path| !Path::new(ROOT).join(path).exists())
        .collect();
    assert!(
        paths.len() >= 40,
        "only {} paths in the recipes",
        paths.len()
    );
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's recipes name paths that do not exist: {missing:?}"
    );
}

#[test]
fn paths_are_told_from_other_code_words() {
    let text = "`crates/sluice/src/rls/mod.rs`, `Rule`, `rls::rule_for`, `docs/algorithms.md`, \
                `tests/a.rs::a_test`, `ConnectionLimit::new(caps, \"x\", …)`, `SECURITY.md`, `lua/`, \
                `` ```sh `` then `src/b.rs:62` and ``x `y` z``, and a lone ` backtick";
    assert_eq!(
        paths_in(text),
        [
            "crates/sluice/src/rls/mod.rs",
            "docs/algorithms.md",
            "tests/a.rs",
            "SECURITY.md",
            "lua/",
            "src/b.rs"
        ]
    );
}

/// The repository's folders whose paths the docs name from the root (or from the doc's own
/// folder, as docs/BENCHMARKS.md names `bench/latest.md`).
const TOP_FOLDERS: &[&str] = &[
    "crates/",
    "src/",
    "tests/",
    "docs/",
    "deploy/",
    "scripts/",
    "client/",
    "bench/",
    "fuzz/",
    "examples/",
    "vendor/",
];
/// Paths the docs name that exist only once something happens.
const MADE_LATER: &[&str] = &["tests/it/key_isolation.proptest-regressions"];

#[test]
fn the_paths_the_docs_name_exist() {
    let mut missing = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = read(&file);
        let dir = Path::new(ROOT).join(&file).parent().unwrap().to_path_buf();
        let prose: Vec<&str> = prose(&text).into_iter().map(|(_, line)| line).collect();
        let prose = prose.join("\n");
        for path in paths_in(&prose) {
            let placeholder = path.contains(['{', '<', '*', '…']) || path.contains("NAME");
            if placeholder
                || MADE_LATER.contains(&path)
                || !TOP_FOLDERS.iter().any(|top| path.starts_with(top))
            {
                continue;
            }
            checked += 1;
            if !Path::new(ROOT).join(path).exists() && !dir.join(path).exists() {
                missing.push(format!("{file}: `{path}`"));
            }
        }
    }
    assert!(checked >= 200, "only {checked} paths found in the docs");
    assert!(
        missing.is_empty(),
        "the docs name paths that do not exist:\n{}",
        missing.join("\n")
    );
}

/// A heading's anchor as GitHub makes it: lower case, spaces as `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The lines of `markdown` outside its fenced blocks, with their numbers.
fn prose(markdown: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (index, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push((index + 1, line));
        }
    }
    lines
}

/// The anchors of `markdown`'s headings (a repeated heading gets `-1`, `-2`, … as on GitHub).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose(markdown) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let base = anchor(heading.trim_start_matches('#'));
        let mut name = base.clone();
        let mut n = 0;
        while !seen.insert(name.clone()) {
            n += 1;
            name = format!("{base}-{n}");
        }
    }
    seen
}

#[test]
fn the_links_of_the_docs_reach_their_files_and_headings() {
    let link = regex::Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = read(&file);
        let dir = Path::new(&file).parent().unwrap_or(Path::new(""));
        for (line, content) in prose(&text) {
            for target in link.captures_iter(content).map(|c| c[1].to_string()) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                if let Err(why) = reaches(&file, dir, &text, &target) {
                    broken.push(format!("{file}:{line}: ({target}) {why}"));
                }
            }
        }
    }
    assert!(checked >= 50, "only {checked} relative links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Whether the link `target`, written in `file` (in `dir`, holding `text`), reaches a file and,
/// with `#anchor`, a heading of it.
fn reaches(file: &str, dir: &Path, text: &str, target: &str) -> Result<(), String> {
    let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
    let (shown, linked) = if path.is_empty() {
        (file.to_string(), text.to_string())
    } else {
        let full = Path::new(ROOT).join(dir).join(path);
        if !full.exists() {
            return Err("no such file".into());
        }
        let shown = relative(&full.canonicalize().unwrap());
        let is_markdown = full.is_file() && path.ends_with(".md");
        (
            shown,
            if is_markdown {
                std::fs::read_to_string(&full).unwrap()
            } else {
                String::new()
            },
        )
    };
    if fragment.is_empty() || !shown.ends_with(".md") {
        return Ok(());
    }
    if anchors(&linked).contains(fragment) {
        Ok(())
    } else {
        Err(format!("{shown} has no heading #{fragment}"))
    }
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    assert_eq!(
        anchor("Errors and `failure_mode_deny`"),
        "errors-and-failure_mode_deny"
    );
    assert_eq!(
        anchor("Issue #30, part 3: merged (2026-11-27, `9e23b02` → `8c88692`)"),
        "issue-30-part-3-merged-2026-11-27-9e23b02--8c88692"
    );
    let text = "# A\n## B\n```sh\n# not a heading\n```\n## B\n";
    let found: Vec<String> = anchors(text).into_iter().collect();
    assert_eq!(found, ["a", "b", "b-1"]);
}
