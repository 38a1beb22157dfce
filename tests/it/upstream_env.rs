//! Upstream's environment, as its manifests (and Envoy Gateway) set it, runs Sluice as it runs
//! envoyproxy/ratelimit: Redis without `BACKEND_TYPE`, host names as listen hosts, gRPC on a
//! Unix socket with `GRPC_UDS`, and every variable Sluice does not implement named at start.

use sluice_test_kit as kit;

use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use kit::*;
use redis::Commands;
use sluice::proto::Code;

const CONFIG: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

#[tokio::test(flavor = "multi_thread")]
async fn upstreams_redis_environment_without_backend_type_counts_in_redis() {
    let redis = RedisServer::start();
    let dir = config_dir(CONFIG);
    let mut cmd = sluice_command(dir.path());
    // Upstream's usual environment: REDIS_SOCKET_TYPE and REDIS_URL, no BACKEND_TYPE.
    cmd.env_remove("BACKEND_TYPE")
        .env_remove("REDIS_TIMEOUT")
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", format!("127.0.0.1:{}", redis.port));
    let sluice = Sluice::spawn(cmd);
    let mut client = sluice.client().await;
    let alice = || request("d", vec![descriptor(&[("k", "alice")])]);
    for _ in 0..2 {
        assert_eq!(
            ask(&mut client, alice()).await.overall_code,
            Code::Ok as i32
        );
    }
    assert_eq!(
        ask(&mut client, alice()).await.overall_code,
        Code::OverLimit as i32
    );
    // The decisions were counted in that Redis, under upstream's key.
    let mut conn = redis.connection();
    let keys: Vec<String> = conn.keys("d_k_alice_*").unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let count: u64 = conn.get(&keys[0]).unwrap();
    assert_eq!(count, 3);
}

#[test]
fn the_start_up_log_names_the_store_and_why() {
    let dir = config_dir(CONFIG);
    // No Redis is running on this socket: start-up gives up at once, after saying which store
    // it chose and why.
    let mut cmd = sluice_command(dir.path());
    cmd.env_remove("BACKEND_TYPE")
        .env_remove("REDIS_TIMEOUT")
        .env("REDIS_URL", "/nonexistent/redis.sock")
        .env("REDIS_STARTUP_MAX_ELAPSED_TIME", "1ms");
    let (stdout, _) = refused_start(&mut cmd);
    let line = stdout
        .lines()
        .find(|l| l.contains("store chosen"))
        .unwrap_or_else(|| panic!("no store line in\n{stdout}"));
    assert!(line.contains(r#""store":"redis""#), "{line}");
    assert!(line.contains("REDIS_URL is set"), "{line}");

    let mut cmd = sluice_command(&dir.path().join("missing"));
    cmd.env_remove("BACKEND_TYPE").env_remove("REDIS_TIMEOUT");
    let (stdout, _) = refused_start(&mut cmd);
    let line = stdout.lines().find(|l| l.contains("store chosen")).unwrap();
    assert!(line.contains(r#""store":"memory""#), "{line}");
}

#[test]
fn host_names_are_listen_hosts() {
    let dir = config_dir(CONFIG);
    let mut cmd = sluice_command(dir.path());
    cmd.env("HOST", "localhost").env("GRPC_HOST", "localhost");
    let sluice = Sluice::spawn(cmd);
    assert!(sluice.http.ip().is_loopback(), "{}", sluice.http);
    assert_eq!(sluice.http("GET", "/healthcheck", "").0, 200);
}

#[test]
fn grpc_uds_serves_grpc_on_a_unix_socket_instead_of_tcp() {
    let dir = config_dir(CONFIG);
    let socket_dir = tempfile::tempdir().unwrap();
    let socket = socket_dir.path().join("ratelimit.sock");
    // A socket file left behind by a process that is gone is replaced.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let mut cmd = sluice_command(dir.path());
    cmd.env("GRPC_UDS", &socket);
    let sluice = Sluice::spawn(cmd);
    assert!(
        sluice.grpc.ip().is_unspecified() && sluice.grpc.port() == 0,
        "a TCP gRPC listener too: {}",
        sluice.grpc
    );
    let call = || {
        let stream = UnixStream::connect(&socket).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let request = request("d", vec![descriptor(&[("k", "v")])]);
        raw_h2::should_rate_limit(stream, "localhost", &request)
            .unwrap()
            .overall_code
    };
    assert_eq!(call(), Code::Ok as i32);
    assert_eq!(call(), Code::Ok as i32);
    assert_eq!(call(), Code::OverLimit as i32);
    // Removed on shutdown, as Go's listener does.
    assert!(sluice.terminate().success());
    assert!(!socket.exists());
}

#[test]
fn upstream_variables_that_are_not_implemented_are_named_at_start() {
    let dir = config_dir(CONFIG);
    // `serve` logs them before it loads the config (a missing directory ends it right after).
    let mut cmd = sluice_command(&dir.path().join("missing"));
    cmd.env("REDIS_PIPELINE_WINDOW", "150us")
        .env("MEMCACHE_HOST_PORT", "m:11211");
    let (stdout, _) = refused_start(&mut cmd);
    for name in ["REDIS_PIPELINE_WINDOW", "MEMCACHE_HOST_PORT"] {
        assert!(
            stdout.contains(&format!("not supported: {name} (")),
            "{name} not named in\n{stdout}"
        );
    }
    // check-config names them too.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("check-config")
        .arg(dir.path())
        .env_clear()
        .env("REDIS_PIPELINE_WINDOW", "150us")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: not supported: REDIS_PIPELINE_WINDOW ("),
        "{stderr}"
    );
}
