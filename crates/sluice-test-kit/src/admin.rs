//! Helpers of the admin API's tests (`tests/it/admin_api.rs`, `tests/it/admin_api_cluster.rs`):
//! the configuration they share, HTTP calls with a bearer token, and the walk from a used-up
//! limit through `GET` and `DELETE` to the next admitted call. Included with `#[path]` so the
//! shared `common/mod.rs` stays as it is.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;
use sluice::proto::{Code, RateLimitServiceClient};
use tonic::transport::Channel;

use crate::{ask, descriptor, request};

/// The admin token the tests start Sluice with.
pub const TOKEN: &str = "admin-token-0123456789";

/// The limit (`ops`, `user`: 3 an hour) and one limit per algorithm, each keyed by its
/// own descriptor key (`algo_<name>`), each admitting 3 before refusing.
pub const CONFIG: &str = "\
domain: ops
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: hour, requests_per_unit: 3}
  - key: algo_fixed_window
    rate_limit: {name: fw, unit: hour, requests_per_unit: 3, algorithm: fixed_window}
  - key: algo_sliding_window_log
    rate_limit: {name: swl, unit: hour, requests_per_unit: 3, algorithm: sliding_window_log}
  - key: algo_sliding_window_counter
    rate_limit: {name: swc, unit: hour, requests_per_unit: 3, algorithm: sliding_window_counter}
  - key: algo_token_bucket
    rate_limit: {name: tb, unit: hour, requests_per_unit: 3, algorithm: token_bucket, burst: 3}
  - key: algo_gcra
    rate_limit: {name: gcra, unit: hour, requests_per_unit: 3, algorithm: gcra, burst: 3}
  - key: algo_leaky_bucket
    rate_limit: {name: lb, unit: hour, requests_per_unit: 3, algorithm: leaky_bucket, burst: 3}
  - key: algo_warm_up
    rate_limit: {name: wu, unit: hour, requests_per_unit: 3, algorithm: warm_up, warmup_period: 1h}
  - key: shadowed
    rate_limit: {name: shadowed, unit: hour, requests_per_unit: 1}
    shadow_mode: true
";

/// Every algorithm's name, as `algorithm:` and the admin API spell it.
pub const ALGORITHMS: [&str; 7] = [
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
    "gcra",
    "leaky_bucket",
    "warm_up",
];

/// `method path` on `addr` with `Authorization: Bearer <token>` when given; (status, body).
pub fn call(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: test\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let status = raw[9..12].parse().unwrap();
    let (_, body) = raw.split_once("\r\n\r\n").unwrap();
    (status, body.to_string())
}

/// `GET` or `DELETE /counters/ops?descriptor=<key>=<value>` with the token, answered 200: the
/// JSON's `counters`.
pub fn counters(debug: SocketAddr, method: &str, key: &str, value: &str) -> Vec<Value> {
    let path = format!("/counters/ops?descriptor={key}={value}");
    let (status, body) = call(debug, method, &path, Some(TOKEN));
    assert_eq!(status, 200, "{method} {path}: {body}");
    let json: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["domain"], "ops");
    json["counters"].as_array().unwrap().clone()
}

/// One RLS call for `key=value`: admitted or not.
pub async fn admitted(
    client: &mut RateLimitServiceClient<Channel>,
    key: &str,
    value: &str,
) -> bool {
    let reply = ask(client, request("ops", vec![descriptor(&[(key, value)])])).await;
    reply.overall_code == Code::Ok as i32
}

/// Calls `key=value` until refused (at most 50 calls); returns how many were admitted.
pub async fn use_up(client: &mut RateLimitServiceClient<Channel>, key: &str, value: &str) -> usize {
    for admitted_so_far in 0..50 {
        if !admitted(client, key, value).await {
            return admitted_so_far;
        }
    }
    panic!("{key}={value} was never refused");
}

/// For every algorithm: use its limit up, read it (`remaining` 0, its name and algorithm),
/// reset it (answered with what it held), and see the next call admitted.
pub async fn every_algorithm_reads_and_resets(
    client: &mut RateLimitServiceClient<Channel>,
    debug: SocketAddr,
    value: &str,
) {
    for algorithm in ALGORITHMS {
        let key = format!("algo_{algorithm}");
        let fresh = counters(debug, "GET", &key, value);
        assert_eq!(fresh.len(), 1, "{algorithm}: {fresh:?}");
        assert_eq!(fresh[0]["algorithm"], algorithm);
        assert!(
            fresh[0]["remaining"].as_u64().unwrap() > 0,
            "{algorithm}: {fresh:?}"
        );
        let took = use_up(client, &key, value).await;
        assert!(took >= 1, "{algorithm} admitted nothing");
        let used_up = counters(debug, "GET", &key, value);
        assert_eq!(used_up[0]["remaining"], 0, "{algorithm}: {used_up:?}");
        assert!(
            used_up[0]["used"].as_u64().unwrap() >= 1,
            "{algorithm}: {used_up:?}"
        );
        assert!(
            used_up[0]["reset_ms"].as_u64().unwrap() > 0,
            "{algorithm}: {used_up:?}"
        );
        // Reading charged nothing: still refused, still 0, and the read again says the same.
        assert!(!admitted(client, &key, value).await, "{algorithm}");
        let reset = counters(debug, "DELETE", &key, value);
        assert_eq!(
            reset[0]["remaining"], 0,
            "{algorithm}: the reset answers what it held"
        );
        assert!(
            admitted(client, &key, value).await,
            "{algorithm}: refused after a reset"
        );
    }
}

/// The done-when on the running Sluice: 3 an hour used up, read with the token
/// (`"remaining": 0`), 401 without it or with another, reset, and the next call admitted.
pub async fn done_when(
    client: &mut RateLimitServiceClient<Channel>,
    debug: SocketAddr,
    user: &str,
) {
    for _ in 0..3 {
        assert!(admitted(client, "user", user).await);
    }
    assert!(!admitted(client, "user", user).await);
    let read = counters(debug, "GET", "user", user);
    assert_eq!(read.len(), 1);
    let counter = &read[0];
    assert_eq!(counter["remaining"], 0, "{counter}");
    assert_eq!(counter["name"], "per_user");
    assert_eq!(counter["algorithm"], "fixed_window");
    assert_eq!(counter["limit"], 3);
    assert_eq!(counter["unit"], "hour");
    assert_eq!(counter["window_seconds"], 3600);
    assert_eq!(counter["shadow_mode"], false);
    // A fixed window counts refused hits too (upstream's rule): 3 admitted + 1 refused.
    assert_eq!(counter["used"], 4, "{counter}");
    let reset_ms = counter["reset_ms"].as_u64().unwrap();
    assert!(reset_ms > 0 && reset_ms <= 3_600_000, "{counter}");

    let path = format!("/counters/ops?descriptor=user={user}");
    for token in [None, Some("admin-token-wrong-12345")] {
        for method in ["GET", "DELETE"] {
            let (status, body) = call(debug, method, &path, token);
            assert_eq!(status, 401, "{method} with {token:?}: {body}");
        }
    }
    // Refused without the token, so still locked out.
    assert!(!admitted(client, "user", user).await);

    let reset = counters(debug, "DELETE", "user", user);
    assert_eq!(
        reset[0]["remaining"], 0,
        "the reset answers the counter as it was"
    );
    assert!(admitted(client, "user", user).await, "refused after DELETE");
    let after = counters(debug, "GET", "user", user);
    assert_eq!(after[0]["remaining"], 2, "{after:?}");
}

/// `POST /counters/ops/refund?descriptor=<key>=<value>&hits=<hits>` with the token, answered
/// 200: the JSON's `counters`.
pub fn refund(debug: SocketAddr, key: &str, value: &str, hits: u64) -> Vec<Value> {
    let path = format!("/counters/ops/refund?descriptor={key}={value}&hits={hits}");
    let (status, body) = call(debug, "POST", &path, Some(TOKEN));
    assert_eq!(status, 200, "{path}: {body}");
    let json: Value = serde_json::from_str(&body).unwrap();
    json["counters"].as_array().unwrap().clone()
}

/// A refund gives back what it says and no more: the fixed window's count down (never below
/// 0), a bucket's tokens back (never past full); the other algorithms are refused with
/// nothing changed.
pub async fn refunds_give_hits_back(
    client: &mut RateLimitServiceClient<Channel>,
    debug: SocketAddr,
    value: &str,
) {
    // The fixed window: 3 admitted, the 4th refused and counted; 2 back leaves 2 counted.
    assert_eq!(use_up(client, "algo_fixed_window", value).await, 3);
    let after = refund(debug, "algo_fixed_window", value, 2);
    assert_eq!(
        (after[0]["used"].clone(), after[0]["remaining"].clone()),
        (2.into(), 1.into())
    );
    assert!(admitted(client, "algo_fixed_window", value).await);
    assert!(!admitted(client, "algo_fixed_window", value).await);
    let emptied = refund(debug, "algo_fixed_window", value, 100);
    assert_eq!(emptied[0]["used"], 0, "never below an empty window");
    assert_eq!(emptied[0]["remaining"], 3);
    for bucket in ["token_bucket", "gcra", "leaky_bucket"] {
        let key = format!("algo_{bucket}");
        assert_eq!(use_up(client, &key, value).await, 3, "{bucket}");
        let after = refund(debug, &key, value, 1);
        assert_eq!(after[0]["remaining"], 1, "{bucket}: {after:?}");
        assert!(admitted(client, &key, value).await, "{bucket}");
        assert!(!admitted(client, &key, value).await, "{bucket}");
        let full = refund(debug, &key, value, 100);
        assert_eq!(
            full[0]["remaining"], 3,
            "{bucket}: never past a full bucket"
        );
    }
    for other in ["sliding_window_log", "sliding_window_counter", "warm_up"] {
        let key = format!("algo_{other}");
        use_up(client, &key, value).await;
        let path = format!("/counters/ops/refund?descriptor={key}={value}&hits=1");
        let (status, body) = call(debug, "POST", &path, Some(TOKEN));
        assert_eq!(status, 400, "{other}: {body}");
        assert!(body.contains(other), "{body}");
        assert!(
            !admitted(client, &key, value).await,
            "{other}: nothing was given back"
        );
    }
}
