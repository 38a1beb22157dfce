//! The fuzz targets without libFuzzer: a bounded, stable-Rust run for machines where
//! `cargo fuzz` is not available, and a way to replay saved inputs in an ordinary build.
//!
//! ```text
//! plain <target> [--seconds N] [--seed N] [--artifacts DIR] [--max-len N] [PATH...]
//! plain --write-seeds DIR
//! ```
//!
//! Every file under each PATH is run first (a corpus, a seed directory or one crash file), then
//! mutated inputs are run until N seconds have passed (default 60; 0 only replays). There is no
//! coverage feedback, so it finds far less than libFuzzer per second; it is a smoke test.
//!
//! The harness runs in a child process (this binary with `--worker`) fed over a pipe, because a
//! stack overflow or an out-of-memory abort cannot be caught in-process and the input that caused
//! it would be lost. When the child dies or hangs, the parent writes the input to the artifacts
//! directory and exits 1.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// One input may take this long before it is reported as a hang (libFuzzer's default is 1200 s;
/// a config or request that takes 10 s is already a denial of service).
const HANG_AFTER: Duration = Duration::from_secs(10);

/// Fragments a byte-level mutator would almost never produce: YAML structure and the config's
/// own keywords for `config_loader`; they are harmless noise for `request`.
const DICTIONARY: &[&str] = &[
    "domain: ",
    "descriptors:\n",
    "  - key: ",
    "    value: ",
    "rate_limit:",
    " {unit: minute, requests_per_unit: 1}",
    "unit: ",
    "requests_per_unit: ",
    "unlimited: true",
    "share_threshold: true",
    "shadow_mode: true",
    "quota_mode: true",
    "replaces: [{name: a}]",
    "name: a",
    "metadata: ",
    "&a ",
    "*a",
    "<<: *a",
    "- ",
    "[",
    "]",
    "{",
    "}",
    "\n",
    "  ",
    "'",
    "\"",
    "|\n",
    ">-\n",
    "!!str ",
    "~",
    "---\n",
    "...\n",
    "#",
    "*",
    "_",
    "%",
    "4294967296",
    "-1",
];

struct Args {
    target: String,
    seconds: u64,
    seed: u64,
    artifacts: PathBuf,
    max_len: usize,
    paths: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match argv.first().map(String::as_str) {
        Some("--worker") => worker(&argv[1]),
        Some("--write-seeds") => write_seeds(Path::new(&argv[1])),
        Some(_) => match parse(&argv) {
            Ok(args) => fuzz(args),
            Err(message) => {
                eprintln!("{message}");
                ExitCode::from(2)
            }
        },
        None => {
            eprintln!(
                "usage: plain <{}> [--seconds N] [--seed N] [--artifacts DIR] [--max-len N] [PATH...]\n       plain --write-seeds DIR",
                sluice_fuzz::TARGETS.join("|")
            );
            ExitCode::from(2)
        }
    }
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let target = argv[0].clone();
    if !sluice_fuzz::TARGETS.contains(&target.as_str()) {
        return Err(format!(
            "unknown target {target:?}; known: {:?}",
            sluice_fuzz::TARGETS
        ));
    }
    let mut args = Args {
        artifacts: PathBuf::from("artifacts").join(&target),
        target,
        seconds: 60,
        seed: rand::rng().next_u64(),
        max_len: 4096,
        paths: Vec::new(),
    };
    let mut rest = argv[1..].iter();
    while let Some(arg) = rest.next() {
        let mut value = |name: &str| rest.next().ok_or(format!("{name} needs a value")).cloned();
        let number = |text: String| text.parse::<u64>().map_err(|e| format!("{text:?}: {e}"));
        match arg.as_str() {
            "--seconds" => args.seconds = number(value("--seconds")?)?,
            "--seed" => args.seed = number(value("--seed")?)?,
            "--max-len" => args.max_len = number(value("--max-len")?)? as usize,
            "--artifacts" => args.artifacts = PathBuf::from(value("--artifacts")?),
            path => args.paths.push(PathBuf::from(path)),
        }
    }
    Ok(args)
}

/// The child: reads length-prefixed inputs from stdin, runs each, acknowledges with one byte.
fn worker(target: &str) -> ExitCode {
    let mut input = BufReader::new(io::stdin().lock());
    let mut output = io::stdout().lock();
    let mut data = Vec::new();
    loop {
        let mut len = [0u8; 4];
        if input.read_exact(&mut len).is_err() {
            return ExitCode::SUCCESS;
        }
        data.resize(u32::from_le_bytes(len) as usize, 0);
        input
            .read_exact(&mut data)
            .expect("parent sends whole inputs");
        sluice_fuzz::run(target, &data);
        if output
            .write_all(b".")
            .and_then(|()| output.flush())
            .is_err()
        {
            return ExitCode::SUCCESS;
        }
    }
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    acks: Receiver<()>,
}

impl Worker {
    fn start(target: &str) -> Worker {
        let mut child = Command::new(std::env::current_exe().expect("own path"))
            .args(["--worker", target])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start worker");
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
        let (send, acks) = mpsc::channel();
        // A reader thread, so that waiting for an ack can time out (a hang is a finding too).
        std::thread::spawn(move || {
            let mut byte = [0u8; 1];
            while stdout.read_exact(&mut byte).is_ok() {
                if send.send(()).is_err() {
                    return;
                }
            }
        });
        Worker { child, stdin, acks }
    }

    /// `Err` describes how the child failed on `data`.
    fn run(&mut self, data: &[u8]) -> Result<(), String> {
        let len = u32::try_from(data.len()).expect("inputs are far below 4 GiB");
        let sent = self
            .stdin
            .write_all(&len.to_le_bytes())
            .and_then(|()| self.stdin.write_all(data))
            .and_then(|()| self.stdin.flush());
        let acked = match sent {
            Ok(()) => self.acks.recv_timeout(HANG_AFTER),
            Err(_) => Err(RecvTimeoutError::Disconnected),
        };
        match acked {
            Ok(()) => Ok(()),
            Err(RecvTimeoutError::Timeout) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                Err(format!("no answer after {HANG_AFTER:?} (hang)"))
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().expect("wait for worker");
                Err(format!("worker died: {status}"))
            }
        }
    }
}

fn fuzz(args: Args) -> ExitCode {
    let mut corpus: Vec<Vec<u8>> = Vec::new();
    for path in &args.paths {
        collect(path, &mut corpus);
    }
    let replayed = corpus.len();
    if corpus.is_empty() {
        corpus = sluice_fuzz::seeds(&args.target)
            .into_iter()
            .map(|(_, bytes)| bytes)
            .collect();
    }
    println!(
        "plain: target {} seed {} for {} s, {} input(s) to replay",
        args.target, args.seed, args.seconds, replayed
    );
    let mut worker = Worker::start(&args.target);
    let started = Instant::now();
    let mut executions = 0u64;
    let report = |data: &[u8], why: String, executions: u64| {
        let path = save(&args.artifacts, data);
        eprintln!(
            "plain: {} failed after {executions} executions: {why}\nplain: input saved to {}",
            args.target,
            path.display()
        );
        ExitCode::FAILURE
    };
    for data in corpus.iter().take(replayed) {
        if let Err(why) = worker.run(data) {
            return report(data, why, executions);
        }
        executions += 1;
    }
    let mut rng = StdRng::seed_from_u64(args.seed);
    let deadline = Duration::from_secs(args.seconds);
    while started.elapsed() < deadline {
        let data = mutate(&mut rng, &corpus, args.max_len);
        if let Err(why) = worker.run(&data) {
            return report(&data, why, executions);
        }
        executions += 1;
        // Without coverage there is no way to tell a useful input; keeping a small random share
        // still lets mutations stack up over time.
        if rng.random_ratio(1, 64) && corpus.len() < 4096 {
            corpus.push(data);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "plain: target {} done: {executions} executions in {elapsed:.1} s ({:.0}/s), 0 crashes",
        args.target,
        executions as f64 / elapsed.max(0.001)
    );
    ExitCode::SUCCESS
}

fn collect(path: &Path, into: &mut Vec<Vec<u8>>) {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        entries.sort();
        for entry in entries {
            collect(&entry, into);
        }
    } else if let Ok(bytes) = std::fs::read(path) {
        into.push(bytes);
    }
}

fn mutate(rng: &mut StdRng, corpus: &[Vec<u8>], max_len: usize) -> Vec<u8> {
    let mut data = if corpus.is_empty() || rng.random_ratio(1, 32) {
        let len = rng.random_range(0..=64);
        (0..len).map(|_| rng.random()).collect()
    } else {
        corpus[rng.random_range(0..corpus.len())].clone()
    };
    for _ in 0..rng.random_range(1..=8) {
        let at = rng.random_range(0..=data.len());
        match rng.random_range(0..7) {
            0 if !data.is_empty() => {
                let i = rng.random_range(0..data.len());
                data[i] ^= 1 << rng.random_range(0..8);
            }
            1 if !data.is_empty() => {
                let i = rng.random_range(0..data.len());
                data[i] = rng.random();
            }
            2 => {
                let word = DICTIONARY[rng.random_range(0..DICTIONARY.len())];
                data.splice(at..at, word.bytes());
            }
            3 if at < data.len() => {
                let end = rng.random_range(at..=data.len().min(at + 64));
                data.drain(at..end);
            }
            4 if at < data.len() => {
                // Repetition is how nesting and long values arise.
                let end = rng.random_range(at..=data.len().min(at + 32));
                let piece = data[at..end].to_vec();
                for _ in 0..rng.random_range(1..=16) {
                    data.splice(at..at, piece.iter().copied());
                }
            }
            5 if !corpus.is_empty() => {
                let other = &corpus[rng.random_range(0..corpus.len())];
                let from = rng.random_range(0..=other.len());
                let end = rng.random_range(from..=other.len());
                data.splice(at..at, other[from..end].iter().copied());
            }
            _ => {
                let byte = rng.random();
                data.insert(at, byte);
            }
        }
    }
    data.truncate(max_len);
    data
}

fn save(dir: &Path, data: &[u8]) -> PathBuf {
    let mut hasher = DefaultHasher::new();
    data.hash(&mut hasher);
    let path = dir.join(format!("plain-crash-{:016x}", hasher.finish()));
    std::fs::create_dir_all(dir).expect("create artifacts directory");
    std::fs::write(&path, data).expect("write crash input");
    path
}

fn write_seeds(dir: &Path) -> ExitCode {
    for target in sluice_fuzz::TARGETS {
        let target_dir = dir.join(target);
        std::fs::create_dir_all(&target_dir).expect("create seed directory");
        for (name, bytes) in sluice_fuzz::seeds(target) {
            std::fs::write(target_dir.join(name), bytes).expect("write seed");
        }
    }
    ExitCode::SUCCESS
}
