//! The container image, run the ways users run it: built from `deploy/docker/Dockerfile`
//! (`runtime-prebuilt`, around the binary under test: `scripts/image.sh`), started with podman
//! on the host's network (free ports), each container removed even when a test fails.
//!
//! - as Envoy Gateway runs it: the whole EG scenario (`crates/sluice-test-kit/src/envoy_gateway.rs`) with the
//!   image's `/bin/ratelimit`, no arguments, uid 65534, a read-only root filesystem, EG's
//!   certificates mounted at EG's `/certs`;
//! - limits mounted as Kubernetes mounts a ConfigMap, updated by swapping `..data`;
//! - the image's HEALTHCHECK passing, failing while Redis is down, passing again;
//! - `podman stop` finishing the calls in flight and exiting 0 within the grace;
//! - Redis in a container of its own, shared by two Sluice containers;
//! - the image's facts (size, start-up to ready, memory), printed for deploy/README.md.
//!
//! Podman is required: scripts/test.sh installs it; without it these tests fail, never skip.

use sluice_test_kit as kit;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kit::container::*;
use kit::envoy_gateway::run_scenario;
use kit::proxy::{FaultProxy, Faults, Leg};
use kit::*;
use sluice::proto::Code;

/// Where the image looks for limits (`RUNTIME_ROOT` + `RUNTIME_APPDIRECTORY`).
const CONFIG_DIR: &str = "/srv/runtime_data/current/config";

/// `podman run` of the image as a user runs it (its entrypoint, `sluice serve`), read-only,
/// with JSON logs on the ports given (0: any, read back from the log), `env` and `args` added.
fn sluice_in_container(
    what: &str,
    ports: Ports,
    env: &[(&str, String)],
    args: &[&str],
) -> SluiceContainer {
    let name = unique_name(what);
    let mut cmd = Container::run_command(&name);
    cmd.arg("--read-only").args(args);
    let listen = [
        ("HOST", "127.0.0.1".to_string()),
        ("PORT", ports.http.to_string()),
        ("GRPC_HOST", "127.0.0.1".to_string()),
        ("GRPC_PORT", "0".to_string()),
        ("DEBUG_HOST", "127.0.0.1".to_string()),
        ("DEBUG_PORT", "0".to_string()),
        ("LOG_FORMAT", "json".to_string()),
    ];
    for (key, value) in listen.into_iter().chain(env.iter().cloned()) {
        cmd.arg("-e").arg(format!("{key}={value}"));
    }
    cmd.arg(image());
    SluiceContainer::start(&name, cmd)
}

/// The ports a container listens on that a test must know before it starts.
#[derive(Clone, Copy)]
struct Ports {
    /// `PORT`: the image's HEALTHCHECK reads it, so it cannot be 0 when the check runs.
    http: u16,
}

impl Ports {
    fn any() -> Ports {
        Ports { http: 0 }
    }

    fn free() -> Ports {
        Ports { http: free_port() }
    }
}

/// Environment selecting a Redis store at `port`.
fn redis_env(port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("REDIS_SOCKET_TYPE", "tcp".to_string()),
        ("REDIS_URL", format!("127.0.0.1:{port}")),
    ]
}

#[test]
fn as_envoy_gateway_runs_it() {
    run_scenario(|launch| {
        readable_by_all(launch.pki.dir.path());
        let name = unique_name("eg");
        let mut cmd = Container::run_command(&name);
        // EG's pod: runAsUser 65534, readOnlyRootFilesystem, `command: ["/bin/ratelimit"]`
        // (which drops the image's CMD), its certificates mounted at /certs.
        cmd.args(["--user", "65534:65534", "--read-only"])
            .args(["--entrypoint", "/bin/ratelimit"])
            .arg("-v")
            .arg(format!("{}:/certs:ro", launch.pki.dir.path().display()));
        for (key, value) in launch.environment(Path::new("/certs")) {
            cmd.arg("-e").arg(format!("{key}={value}"));
        }
        cmd.arg(image());
        let running = SluiceContainer::start(&name, cmd);
        let exec = |args: &[&str]| podman_ok(&[&["exec", &name][..], args].concat());
        assert_eq!(exec(&["id", "-u"]), "65534");
        // PID 1 is the binary, started with no argument at all.
        let cmdline = exec(&["cat", "/proc/1/cmdline"]);
        assert_eq!(cmdline.trim_end_matches('\0'), "/bin/ratelimit");
        running
    });
}

/// One limit, `per_minute` a minute for each `user`, in domain `image`.
fn limits(per_minute: u32) -> String {
    format!(
        "domain: image\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      \
         requests_per_unit: {per_minute}\n"
    )
}

/// A directory laid out as the kubelet lays out a mounted ConfigMap: the files live in a
/// timestamped directory, `..data` links to it, and each key is a link through `..data`.
/// An update writes a new timestamped directory and renames a new link over `..data`, so the
/// reader sees the old files or the new ones, never a mix.
struct ConfigMapVolume {
    dir: tempfile::TempDir,
    generation: u32,
}

impl ConfigMapVolume {
    fn new(files: &[(&str, String)]) -> ConfigMapVolume {
        let mut volume = ConfigMapVolume {
            dir: tempfile::tempdir().unwrap(),
            generation: 0,
        };
        volume.update(files);
        for (name, _) in files {
            let link = volume.dir.path().join(name);
            std::os::unix::fs::symlink(Path::new("..data").join(name), link).unwrap();
        }
        volume
    }

    fn update(&mut self, files: &[(&str, String)]) {
        self.generation += 1;
        let data = format!("..2026_11_26_00_00_0{}.000000001", self.generation);
        let data_dir = self.dir.path().join(&data);
        std::fs::create_dir(&data_dir).unwrap();
        for (name, text) in files {
            std::fs::write(data_dir.join(name), text).unwrap();
        }
        readable_by_all(self.dir.path());
        let staged = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&data, &staged).unwrap();
        std::fs::rename(&staged, self.dir.path().join("..data")).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_mounted_as_a_config_map_update_in_place() {
    let mut volume = ConfigMapVolume::new(&[("limits.yaml", limits(2))]);
    let mount = format!("{}:{CONFIG_DIR}:ro", volume.dir.path().display());
    let running = sluice_in_container("configmap", Ports::any(), &[], &["-v", &mount]);
    let mut client = running.sluice.client().await;
    let alice = || request("image", vec![descriptor(&[("user", "alice")])]);
    let codes: Vec<i32> = overall_codes(&mut client, alice, 3).await;
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );

    volume.update(&[("limits.yaml", limits(50))]);
    // The reload polls every second (CONFIG_RELOAD_INTERVAL); the bound is thirty times that.
    let applied = Instant::now();
    loop {
        let answer = ask(&mut client, alice()).await;
        if answer.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit
            == 50
        {
            assert_eq!(answer.overall_code, Code::Ok as i32, "the new limit admits");
            break;
        }
        assert!(
            applied.elapsed() < Duration::from_secs(30),
            "new limits not applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("new limits applied {:?} after the swap", applied.elapsed());
}

/// The overall codes of `n` calls, one after another.
async fn overall_codes(
    client: &mut sluice::proto::RateLimitServiceClient<tonic::transport::Channel>,
    make: impl Fn() -> sluice::proto::RateLimitRequest,
    n: usize,
) -> Vec<i32> {
    let mut codes = Vec::new();
    for _ in 0..n {
        codes.push(ask(client, make()).await.overall_code);
    }
    codes
}

#[tokio::test(flavor = "multi_thread")]
async fn healthcheck_follows_redis_as_documented() {
    let mut redis = RedisServer::start();
    let mut env = redis_env(redis.port);
    env.push(("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true".to_string()));
    env.push(("REDIS_TIMEOUT", "200ms".to_string()));
    let running = sluice_in_container("health", Ports::free(), &env, &[]);
    let container = &running.container;
    assert!(container.healthcheck(), "healthy while serving");

    // Redis down: calls fail, the breaker opens (after BREAKER_FAILURES), health follows it.
    redis.kill();
    let mut client = running.sluice.client().await;
    let bob = || request("example", vec![descriptor(&[("user", "bob")])]);
    for _ in 0..20 {
        let failed = client.should_rate_limit(bob()).await;
        assert!(failed.is_err(), "an answer without Redis: {failed:?}");
    }
    assert!(
        !container.healthcheck(),
        "unhealthy while the breaker is open"
    );

    // Redis back: the breaker's probe rides on a call (one at least every second), so with
    // calls coming in health is back shortly after. The bound only catches no recovery.
    redis.restart();
    let back = Instant::now();
    loop {
        let _ = client.should_rate_limit(bob()).await;
        if container.healthcheck() {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "not healthy again with Redis back:\n{}",
            container.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("healthy {:?} after Redis came back", back.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn podman_stop_finishes_calls_in_flight_and_exits_zero() {
    // Replies from Redis held 400 ms, so calls are in flight when the stop comes.
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(([127, 0, 0, 1], redis.port).into()).await;
    let config = config_volume(&limits(1_000));
    let mount = format!("{}:{CONFIG_DIR}:ro", config.path().display());
    let running = sluice_in_container(
        "stop",
        Ports::any(),
        &redis_env(proxy.addr.port()),
        &["-v", &mount],
    );
    let mut client = running.sluice.client().await;
    assert_eq!(
        ask(
            &mut client,
            request("image", vec![descriptor(&[("user", "a")])])
        )
        .await
        .overall_code,
        Code::Ok as i32
    );
    proxy.set(Faults {
        down: Leg {
            latency: Duration::from_millis(400),
            ..Leg::default()
        },
        ..Faults::default()
    });
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let user = format!("u{i}");
                client
                    .should_rate_limit(request("image", vec![descriptor(&[("user", &user)])]))
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let name = running.container.name.clone();
    let stopped = Instant::now();
    // The Dockerfile's advice: more than SHUTDOWN_GRACE_PERIOD (10 s).
    let stop = tokio::task::spawn_blocking(move || podman_ok(&["stop", "--time", "15", &name]));
    for call in calls {
        let answer = call
            .await
            .unwrap()
            .expect("a call in flight at the stop was cut");
        assert_eq!(answer.into_inner().overall_code, Code::Ok as i32);
    }
    stop.await.unwrap();
    let took = stopped.elapsed();
    println!("podman stop returned after {took:?}");
    assert_eq!(running.container.inspect("{{.State.ExitCode}}"), "0");
    assert!(
        took < Duration::from_secs(15),
        "podman stop took {took:?}: the grace ran out"
    );
}

/// A plain directory of limits (one file), readable by the image's user.
fn config_volume(yaml: &str) -> tempfile::TempDir {
    let dir = config_dir(yaml);
    readable_by_all(dir.path());
    dir
}

/// Redis in a container of its own (Debian's redis-server on the tests' base), on a free port.
fn redis_in_container() -> (Container, u16) {
    let port = free_port();
    let name = unique_name("redis");
    let container = Container::start_detached(
        &name,
        Container::run_command(&name)
            .args(["-d", "--read-only", REDIS_IMAGE])
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ]),
    );
    let ping = || {
        Command::new("redis-cli")
            .args(["-p", &port.to_string(), "PING"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
    };
    assert!(
        holds_within(Duration::from_secs(30), ping),
        "redis container not answering:\n{}",
        container.logs()
    );
    (container, port)
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_share_redis_in_its_own_container() {
    const LIMIT: usize = 10;
    let (_redis, port) = redis_in_container();
    let config = config_volume(&limits(LIMIT as u32));
    let mount = format!("{}:{CONFIG_DIR}:ro", config.path().display());
    let replicas = [
        sluice_in_container("replica-a", Ports::any(), &redis_env(port), &["-v", &mount]),
        sluice_in_container("replica-b", Ports::any(), &redis_env(port), &["-v", &mount]),
    ];
    // Forty calls at once, half on each replica: exactly LIMIT admitted between them.
    let mut calls = Vec::new();
    for replica in &replicas {
        let client = replica.sluice.client().await;
        for _ in 0..20 {
            let mut client = client.clone();
            calls.push(tokio::spawn(async move {
                ask(
                    &mut client,
                    request("image", vec![descriptor(&[("user", "carol")])]),
                )
                .await
                .overall_code
            }));
        }
    }
    let mut admitted = 0;
    for call in calls {
        if call.await.unwrap() == Code::Ok as i32 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, LIMIT);
}

/// The figures deploy/README.md gives: the image's size, start-up to ready, memory at idle and
/// after a load of distinct counters. Printed (`IMAGE FACTS`), not bounded: they describe
/// the machine as much as the image. What it asserts is that the container serves and counts.
#[tokio::test(flavor = "multi_thread")]
async fn image_facts() {
    const CALLERS: usize = 8;
    const CALLS_EACH: usize = 1_000;
    let size: u64 = podman_ok(&["image", "inspect", "--format", "{{.Size}}", image()])
        .parse()
        .unwrap();
    let ports = Ports::free();
    let started = Instant::now();
    let running = sluice_in_container("facts", ports, &[], &[]);
    let health = std::net::SocketAddr::from(([127, 0, 0, 1], ports.http));
    wait_until("ready", || {
        http_request(health, "GET", "/healthcheck", "").0 == 200
    });
    let ready = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = running.container.memory_kib("VmRSS");

    // Distinct client addresses against the image's own example limits (100 a minute each).
    let mut callers = Vec::new();
    for caller in 0..CALLERS {
        let mut client = running.sluice.client().await;
        callers.push(tokio::spawn(async move {
            let mut admitted = 0;
            for n in 0..CALLS_EACH {
                let address = format!("10.{caller}.{}.{}", n / 256, n % 256);
                let req = request("example", vec![descriptor(&[("remote_address", &address)])]);
                if ask(&mut client, req).await.overall_code == Code::Ok as i32 {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let loaded = Instant::now();
    let mut admitted = 0;
    for caller in callers {
        admitted += caller.await.unwrap();
    }
    let load_took = loaded.elapsed();
    assert_eq!(
        admitted,
        CALLERS * CALLS_EACH,
        "first calls of distinct counters are admitted"
    );
    let after_load = running.container.memory_kib("VmRSS");
    let peak = running.container.memory_kib("VmHWM");
    println!(
        "IMAGE FACTS {image}: size {size_mb:.1} MB; ready {ready:?} after podman run; \
         RSS idle {idle} KiB; after {calls} calls on distinct counters ({load_took:?}): \
         RSS {after_load} KiB, peak {peak} KiB",
        image = image(),
        size_mb = size as f64 / 1e6,
        calls = CALLERS * CALLS_EACH,
    );
}
