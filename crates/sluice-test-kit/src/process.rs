//! Processes the tests start besides servers: a CPU hog that keeps both cores busy, a watcher
//! that ends a process when the test binary ends (for servers kept in a `static`), and signals.

use std::process::{Child, Command, Stdio};

/// Both cores kept busy while it lives, for tests that must hold on a saturated machine: two
/// shell loops, killed on drop (and by the watcher [`stop_when_this_process_ends`] starts,
/// should the test process die first).
pub struct CpuHog(Vec<Child>);

impl CpuHog {
    pub fn start() -> CpuHog {
        CpuHog(
            (0..2)
                .map(|_| {
                    let child = Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdin(Stdio::null())
                        .spawn()
                        .expect("sh");
                    stop_when_this_process_ends(child.id(), "sh");
                    child
                })
                .collect(),
        )
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Stops process `pid` (still named `name`) when this test process ends. A server that a test
/// keeps in a `static` (shared by several tests) is never dropped, so `Drop` alone would leave
/// it running after the test binary exits; a one-line shell watcher ends it instead.
pub fn stop_when_this_process_ends(pid: u32, name: &str) {
    // The kernel keeps the first 15 bytes of a process's name in /proc/PID/comm.
    let name: String = name.bytes().take(15).map(char::from).collect();
    // The watcher also ends with the server: one started by each of hundreds of tests would
    // otherwise each wake every second until the whole test binary ends.
    let script = format!(
        "while kill -0 {test} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 1; done; \
         kill -0 {test} 2>/dev/null || \
         {{ [ \"$(cat /proc/{pid}/comm 2>/dev/null)\" = {name} ] && kill {pid}; }}",
        test = std::process::id(),
    );
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// Sends `signal` (`TERM`, `STOP`, `CONT`, ...) to process `pid` with `kill`.
pub fn send_signal(pid: u32, signal: &str) {
    Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
}
