//! The Helm chart, played: rendered by Helm's engine (`scripts/render_chart.py`), its
//! ConfigMap, Secret and Deployment run under `podman kube play` with the image of the binary
//! under test, then played again with new values.
//!
//! How the chart is rendered and played, and what the test changes in the rendered objects:
//! `crates/sluice-test-kit/src/chart.rs`.

use sluice_test_kit as kit;

use std::time::Instant;

use kit::chart::*;
use kit::container::*;
use kit::*;
use sluice::proto::Code;

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_played_decides_and_rolls_out_a_values_change() {
    // Its limits are per minute and its counts must carry over the replay: stay in one window.
    avoid_window_edge(60, 20).await;
    let redis = RedisServer::start_with(
        &["--requirepass".to_string(), PASSWORD.to_string()],
        &[
            "--no-auth-warning".to_string(),
            "-a".to_string(),
            PASSWORD.to_string(),
        ],
    );
    let release = unique_name("chart");
    let ports = PodPorts {
        http: free_port(),
        grpc: free_port(),
    };
    let played = Played::new(&release);
    let rendered = render(&release, &values(redis.port, 2));
    played.secret(&rendered);
    let (objects, service) = for_kube_play(&rendered, ports);
    played.play(&objects);
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    probes_pass(deployment, ports, &played);

    // As the pod spec says: uid 65534, nothing writable at the root.
    let container = played.container();
    assert_eq!(podman_ok(&["exec", &container, "id", "-u"]), "65534");
    let write = podman()
        .args(["exec", &container, "touch", "/written"])
        .output()
        .unwrap();
    assert!(!write.status.success(), "the root filesystem is writable");

    // A request through the Service's port is decided, against Redis with the Secret's password.
    let grpc = service_target(&service, deployment);
    let mut client =
        sluice::proto::RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
            .await
            .unwrap();
    let dana = || request("chart", vec![descriptor(&[("user", "dana")])]);
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(ask(&mut client, dana()).await.overall_code);
    }
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );
    assert!(redis.dbsize() > 0, "counters are in Redis");

    // New values (limits raised): played again, the new pod decides under them; the counters
    // in Redis carry over, so dana's 3 calls count against the new 5.
    let (objects, _) = for_kube_play(&render(&release, &values(redis.port, 5)), ports);
    played.play(&objects);
    probes_pass(deployment, ports, &played);
    let mut client =
        sluice::proto::RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
            .await
            .unwrap();
    let rolled = Instant::now();
    let answer = ask(&mut client, dana()).await;
    assert_eq!(
        answer.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        5
    );
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert_eq!(ask(&mut client, dana()).await.overall_code, Code::Ok as i32);
    assert_eq!(
        ask(&mut client, dana()).await.overall_code,
        Code::OverLimit as i32
    );
    println!("new values decided {:?} after the replay", rolled.elapsed());
}
