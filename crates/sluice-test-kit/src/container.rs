//! Containers for the tests that run Sluice's image: the image, built once per test binary from
//! the binary under test (`scripts/image.sh build`), and containers run with podman on the
//! host's network, each removed when its handle drops, so a failing test leaves none behind.
//!
//! Podman is required, never skipped: `scripts/test.sh` installs it (`scripts/image.sh setup`),
//! so a missing podman is a broken machine and the test fails saying so. Podman's settings for
//! these hosts (runc, the rlimits) come from `tests/containers/containers.conf`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::Sluice;

/// Redis in its own container: Debian's redis-server on the tests' base (`scripts/image.sh setup`).
pub const REDIS_IMAGE: &str = "localhost/sluice-redis:bookworm";

fn repo() -> PathBuf {
    crate::workspace_root()
}

/// `podman` with the hosts' settings.
pub fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.env(
        "CONTAINERS_CONF",
        repo().join("tests/containers/containers.conf"),
    );
    cmd
}

/// Runs podman to completion; panics with its output when it fails.
pub fn podman_ok(args: &[&str]) -> String {
    let out = run(podman().args(args));
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run podman ({e}): the image tests need it; scripts/test.sh installs it \
             (scripts/image.sh setup)"
        )
    })
}

/// The image of the binary under test, built on first use (a tag named by the binary's
/// digest, so parallel runs from other checkouts never replace an image in use).
/// `SLUICE_TEST_IMAGE_BINARY` names another binary to build it from (the release build, for
/// the figures in deploy/README.md).
pub fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let started = Instant::now();
        let binary = std::env::var("SLUICE_TEST_IMAGE_BINARY")
            .unwrap_or_else(|_| crate::sluice_binary().display().to_string());
        let out = run(Command::new(repo().join("scripts/image.sh"))
            .args(["build", &binary])
            .stderr(Stdio::inherit()));
        assert!(out.status.success(), "scripts/image.sh build failed");
        let tag = String::from_utf8_lossy(&out.stdout).trim().to_string();
        eprintln!("image {tag} ready in {:?}", started.elapsed());
        tag
    })
}

/// A name no other test run uses.
pub fn unique_name(what: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "sluice-test-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A container by name, removed (killed if running) when dropped.
pub struct Container {
    pub name: String,
}

impl Container {
    /// `podman run` for a container named `name` on the host's network, with the flags
    /// every test uses; the caller adds its own, then the image and its arguments.
    pub fn run_command(name: &str) -> Command {
        let mut cmd = podman();
        cmd.args(["run", "--name", name, "--network=host"]);
        cmd
    }

    /// Starts `cmd` (from [`Container::run_command`], with `-d`) and returns the guard.
    pub fn start_detached(name: &str, cmd: &mut Command) -> Container {
        let container = Container {
            name: name.to_string(),
        };
        let out = run(cmd);
        assert!(
            out.status.success(),
            "podman run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        container
    }

    /// `podman inspect` of one field (a Go template, `{{.State.ExitCode}}`).
    pub fn inspect(&self, format: &str) -> String {
        podman_ok(&["inspect", "--format", format, &self.name])
    }

    /// `podman healthcheck run`: whether the image's HEALTHCHECK passes now.
    pub fn healthcheck(&self) -> bool {
        run(podman().args(["healthcheck", "run", &self.name]))
            .status
            .success()
    }

    /// The resident memory of the container's first process (VmRSS, or VmHWM for the peak),
    /// in KiB, read from the host's /proc.
    pub fn memory_kib(&self, field: &str) -> u64 {
        let pid = self.inspect("{{.State.Pid}}");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
    }

    pub fn logs(&self) -> String {
        let out = run(podman().args(["logs", &self.name]));
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman()
            .args(["rm", "--force", "--time", "0", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Sluice in a container, run in the foreground so the harness reads its log as it reads a
/// process's ([`Sluice::spawn`]). The container is removed before the podman client is killed.
pub struct SluiceContainer {
    pub container: Container,
    pub sluice: Sluice,
}

impl SluiceContainer {
    /// Runs `cmd` (from [`Container::run_command`], image and arguments added) in the
    /// foreground. The process must log JSON (`LOG_FORMAT=json`) on ports it is told.
    pub fn start(name: &str, cmd: Command) -> SluiceContainer {
        // The guard first: should Sluice not come up, the container still goes.
        let container = Container {
            name: name.to_string(),
        };
        let sluice = Sluice::spawn(cmd);
        SluiceContainer { container, sluice }
    }
}

impl std::borrow::Borrow<Sluice> for SluiceContainer {
    fn borrow(&self) -> &Sluice {
        &self.sluice
    }
}

/// A directory every user in a container can read (the tests' temporary directories are
/// private to root, and the image runs as uid 65534).
pub fn readable_by_all(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    mode(dir, 0o755).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path: PathBuf = entry.unwrap().path();
        if path.is_dir() {
            readable_by_all(&path);
        } else if !path.is_symlink() {
            mode(&path, 0o644).unwrap();
        }
    }
}

/// Polls `check` every 100 ms for up to `within`; whether it held.
pub fn holds_within(within: Duration, check: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
