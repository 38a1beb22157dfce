//! The chart's default failure policy, played (issue #42): the rendered chart with
//! `backend: redis` and nothing else about failures set, under `podman kube play`
//! (`crates/sluice-test-kit/src/chart.rs`), Redis killed and the circuit breaker opened by traffic.
//!
//! The chart renders `FAILURE_POLICY=local_share` with `DEGRADED_REPLICAS` from the
//! Deployment's replica count, and `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true`. With Redis down
//! the pod keeps deciding (a limit of 3 a day: 3 admitted, then refused, each answer marked)
//! and its readiness probe, run as the kubelet runs it from the spec (`failureThreshold + 1`
//! probes `periodSeconds` apart, enough to take it out of its Service), answers 200 every time,
//! while `sluice_serving_degraded` and the log say it is degraded; liveness is untouched.
//! The same release with `failurePolicy: fail_closed` leaves the Service as before: its
//! readiness probe fails within what the spec allows.

use sluice_test_kit as kit;

use std::time::Duration;

use kit::chart::*;
use kit::container::*;
use kit::readiness::{grpc_health, marked_degraded, metric_at, open_breaker};
use kit::*;
use serde_json::{Value, json};
use sluice::proto::{Code, RateLimitServiceClient};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

const LIMITS: &str = "\
domain: chart
descriptors:
  - key: user
    rate_limit: { unit: day, requests_per_unit: 3 }
";

/// The container's environment as rendered: name → value (a `valueFrom` as its JSON).
fn env_of(docs: &[Value]) -> std::collections::HashMap<String, String> {
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let value = e["value"]
                .as_str()
                .map_or(e["valueFrom"].to_string(), str::to_string);
            (e["name"].as_str().unwrap().to_string(), value)
        })
        .collect()
}

/// Plays the release with `values`, waits for its probes, and connects to the port the
/// Service leads to; the Deployment as played, for its probes.
async fn play(
    played: &Played,
    rendered: &[Value],
    ports: PodPorts,
) -> (Value, RateLimitServiceClient<Channel>) {
    let (objects, service) = for_kube_play(rendered, ports);
    played.play(&objects);
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .unwrap()
        .clone();
    probes_pass(&deployment, ports, played);
    let grpc = service_target(&service, &deployment);
    let client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .unwrap();
    (deployment, client)
}

/// The readiness probe run as the kubelet runs it: `failureThreshold + 1` times,
/// `periodSeconds` apart (enough failures to take the pod out of its Service).
fn readiness_as_the_kubelet_runs_it(deployment: &Value, ports: PodPorts) -> Vec<u16> {
    let spec = &deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"];
    let period = Duration::from_secs(spec["periodSeconds"].as_u64().unwrap());
    let times = spec["failureThreshold"].as_u64().unwrap() + 1;
    (0..times)
        .map(|i| {
            if i > 0 {
                std::thread::sleep(period);
            }
            probe_status(deployment, "readinessProbe", ports)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_charts_default_keeps_a_pod_ready_while_it_decides_without_redis() {
    // A day's window: the margin is kept before midnight only, not before every hour.
    avoid_window_edge(86_400, 300).await;
    let mut redis = RedisServer::start_with(
        &["--requirepass".to_string(), PASSWORD.to_string()],
        &[
            "--no-auth-warning".to_string(),
            "-a".to_string(),
            PASSWORD.to_string(),
        ],
    );
    let release = unique_name("chart-degraded");
    let ports = PodPorts {
        http: free_port(),
        grpc: free_port(),
    };
    let http = ([127, 0, 0, 1], ports.http).into();
    let played = Played::new(&release);
    let mut values = values(redis.port, 3);
    values["limits"] = json!({ "chart.yaml": LIMITS });
    let rendered = render(&release, &values);
    let env = env_of(&rendered);
    assert_eq!(env["FAILURE_POLICY"], "local_share", "the chart's default");
    assert_eq!(
        env["DEGRADED_REPLICAS"], "1",
        "the Deployment's replicaCount"
    );
    assert_eq!(env["REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"], "true");
    played.secret(&rendered);
    let (deployment, mut client) = play(&played, &rendered, ports).await;
    let u = |name: &str| request("chart", vec![descriptor(&[("user", name)])]);
    let answer = ask(&mut client, u("before")).await;
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert!(!marked_degraded(&answer), "decided on redis");

    redis.kill();
    open_breaker(&mut client, http, "chart", ("user", "trip")).await;
    let statuses = readiness_as_the_kubelet_runs_it(&deployment, ports);
    assert!(
        statuses.iter().all(|s| *s == 200),
        "readiness while deciding with its share: {statuses:?}\n{}",
        played.logs()
    );
    assert_eq!(
        grpc_health(([127, 0, 0, 1], ports.grpc).into(), "ratelimit").await,
        ServingStatus::Serving
    );
    assert_eq!(metric_at(http, "sluice_serving_degraded"), 1.0);
    assert_eq!(
        metric_at(http, "sluice_circuit_breaker_open{store=\"redis\"}"),
        1.0,
        "redis was down through every probe"
    );
    let mut codes = Vec::new();
    for _ in 0..4 {
        let answer = ask(&mut client, u("u1")).await;
        assert!(marked_degraded(&answer), "{answer:?}");
        codes.push(Code::try_from(answer.overall_code).unwrap());
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    assert_eq!(probe_status(&deployment, "livenessProbe", ports), 200);
    assert!(played.logs().contains("staying ready"), "{}", played.logs());

    // The same release with fail_closed: the pod leaves its Service while Redis is down.
    redis.restart();
    values["failurePolicy"] = json!("fail_closed");
    let rendered = render(&release, &values);
    assert!(!env_of(&rendered).contains_key("DEGRADED_REPLICAS"));
    let (deployment, mut client) = play(&played, &rendered, ports).await;
    redis.kill();
    open_breaker(&mut client, http, "chart", ("user", "trip")).await;
    let unready = holds_within(probe_allowance(&deployment, "readinessProbe"), || {
        probe_status(&deployment, "readinessProbe", ports) == 500
    });
    assert!(unready, "fail_closed: readiness still 200 with redis down");
    assert_eq!(probe_status(&deployment, "livenessProbe", ports), 200);
}
