//! The real binary over gRPC and HTTP, on the memory store and on a real Redis.

use sluice_test_kit as kit;

use std::time::Duration;

use kit::*;
use sluice::proto::{Code, OverrideUnit, RateLimitOverride, RateLimitResponse, ResponseUnit};

const CONFIG: &str = r#"
domain: app
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_user}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 1, name: login}
  - key: path
    value: /special
    rate_limit:
      unit: hour
      requests_per_unit: 5
      name: special
      replaces: [{name: per_user}]
  - key: health
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota
    value: a
    quota_mode: true
    metadata: {backend: a}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota
    value: b
    quota_mode: true
    metadata: {backend: b}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: tenant
    value: "team-*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    value: "solo-*"
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tick
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: parent
    value: p
    descriptors:
      - key: child
        rate_limit: {unit: hour, requests_per_unit: 1, name: nested}
"#;

fn codes(r: &RateLimitResponse) -> (Code, Vec<Code>) {
    (
        Code::try_from(r.overall_code).unwrap(),
        r.statuses
            .iter()
            .map(|s| Code::try_from(s.code).unwrap())
            .collect(),
    )
}

fn start(redis: Option<&RedisServer>, env: &[(&str, &str)]) -> (Sluice, tempfile::TempDir) {
    let dir = config_dir(CONFIG);
    (Sluice::start(dir.path(), redis, env), dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn decisions_follow_upstream_on_both_stores() {
    for_each_store(|kind, redis| async move {
        let (sluice, _dir) = start(redis.as_ref(), &[]);
        let mut c = sluice.client().await;
        let ctx = format!("{kind:?}");

        // Counting to the limit, with remaining, limit and reset.
        let first = ask(&mut c, alice()).await;
        assert_eq!(codes(&first), (Code::Ok, vec![Code::Ok]), "{ctx}");
        let status = &first.statuses[0];
        assert_eq!(status.limit_remaining, 2, "{ctx}");
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!(limit.name, "per_user");
        assert_eq!(limit.requests_per_unit, 3);
        assert_eq!(limit.unit, ResponseUnit::Minute as i32);
        let reset = status.duration_until_reset.unwrap().seconds;
        assert!((1..=60).contains(&reset), "{ctx}: reset {reset}");
        ask(&mut c, alice()).await;
        assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 0);
        let over = ask(&mut c, alice()).await;
        assert_eq!(
            codes(&over),
            (Code::OverLimit, vec![Code::OverLimit]),
            "{ctx}"
        );
        assert!(over.statuses[0].current_limit.is_some());
        assert!(over.statuses[0].duration_until_reset.unwrap().seconds >= 1);

        // No limit: bare OK; unknown domain: all bare OK.
        let none = ask(&mut c, request("app", vec![descriptor(&[("nope", "x")])])).await;
        assert_eq!(none.statuses[0], bare_ok(), "{ctx}");
        let other = ask(
            &mut c,
            request("other", vec![descriptor(&[("user", "x")]); 2]),
        )
        .await;
        assert_eq!(codes(&other), (Code::Ok, vec![Code::Ok, Code::Ok]));
        assert!(other.statuses.iter().all(|s| s.current_limit.is_none()));

        // Nested descriptors: the depth must match.
        let nested = || request("app", vec![descriptor(&[("parent", "p"), ("child", "c")])]);
        assert_eq!(
            ask(&mut c, nested()).await.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .name,
            "nested"
        );
        assert_eq!(
            codes(&ask(&mut c, nested()).await).0,
            Code::OverLimit,
            "{ctx}"
        );
        let shallow = ask(&mut c, request("app", vec![descriptor(&[("parent", "p")])])).await;
        assert!(shallow.statuses[0].current_limit.is_none());

        // Unlimited never counts.
        for _ in 0..3 {
            let r = ask(&mut c, request("app", vec![descriptor(&[("health", "x")])])).await;
            assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
            assert!(r.statuses[0].current_limit.is_none());
        }

        // replaces: per_user is dropped when /special is in the same request.
        let both = || {
            request(
                "app",
                vec![
                    descriptor(&[("user", "bob")]),
                    descriptor(&[("path", "/special")]),
                ],
            )
        };
        for _ in 0..4 {
            let r = ask(&mut c, both()).await;
            assert_eq!(codes(&r).0, Code::Ok, "{ctx}");
            assert!(r.statuses[0].current_limit.is_none(), "{ctx}");
        }
        let bob = ask(&mut c, request("app", vec![descriptor(&[("user", "bob")])])).await;
        assert_eq!(
            bob.statuses[0].limit_remaining, 2,
            "{ctx}: replaced hits were not counted"
        );

        // Per-rule shadow mode.
        let shadow = || request("app", vec![descriptor(&[("shadow", "s")])]);
        ask(&mut c, shadow()).await;
        let r = ask(&mut c, shadow()).await;
        assert_eq!(codes(&r), (Code::Ok, vec![Code::Ok]), "{ctx}");
        assert_eq!(r.statuses[0].limit_remaining, 0);

        // Quota mode: OVER_LIMIT only when every quota descriptor is over.
        let qa = descriptor(&[("quota", "a")]);
        let qb = descriptor(&[("quota", "b")]);
        ask(&mut c, request("app", vec![qa.clone()])).await;
        let r = ask(&mut c, request("app", vec![qa.clone(), qb.clone()])).await;
        assert_eq!(
            codes(&r),
            (Code::Ok, vec![Code::OverLimit, Code::Ok]),
            "{ctx}"
        );
        let r = ask(&mut c, request("app", vec![qa, qb])).await;
        assert_eq!(
            codes(&r),
            (Code::OverLimit, vec![Code::OverLimit, Code::OverLimit]),
            "{ctx}"
        );

        // hits_addend: request-level cost, per-descriptor precedence, 0 = check only.
        let mut costly = request("app", vec![descriptor(&[("user", "carol")])]);
        costly.hits_addend = 3;
        assert_eq!(
            ask(&mut c, costly).await.statuses[0].limit_remaining,
            0,
            "{ctx}"
        );
        let mut peek = descriptor(&[("user", "dave")]);
        peek.hits_addend = Some(0);
        let mut r = request("app", vec![peek.clone()]);
        r.hits_addend = 10;
        let looked = ask(&mut c, r).await;
        assert_eq!(
            (codes(&looked).0, looked.statuses[0].limit_remaining),
            (Code::Ok, 3),
            "{ctx}"
        );
        peek.hits_addend = Some(4);
        assert_eq!(
            codes(&ask(&mut c, request("app", vec![peek])).await).0,
            Code::OverLimit
        );

        // Overrides replace the tree's limit.
        let mut overridden = descriptor(&[("user", "erin")]);
        overridden.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: OverrideUnit::Day as i32,
        });
        let r = ask(&mut c, request("app", vec![overridden.clone()])).await;
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit, limit.name.as_str()),
            (1, ResponseUnit::Day as i32, "")
        );
        assert_eq!(
            codes(&ask(&mut c, request("app", vec![overridden])).await).0,
            Code::OverLimit
        );

        // Wildcards: own counter per value, unless share_threshold.
        for v in ["solo-1", "solo-2"] {
            for _ in 0..2 {
                let r = ask(&mut c, request("app", vec![descriptor(&[("tenant", v)])])).await;
                assert_eq!(codes(&r).0, Code::Ok, "{ctx} {v}");
            }
        }
        for (v, want) in [
            ("team-1", Code::Ok),
            ("team-2", Code::Ok),
            ("team-3", Code::OverLimit),
        ] {
            let r = ask(&mut c, request("app", vec![descriptor(&[("tenant", v)])])).await;
            assert_eq!(codes(&r).0, want, "{ctx} {v}");
        }

        // Statuses come back one per descriptor, in request order.
        let r = ask(
            &mut c,
            request(
                "app",
                vec![
                    descriptor(&[("health", "x")]),
                    descriptor(&[("path", "/login")]),
                    descriptor(&[("nope", "x")]),
                    descriptor(&[("path", "/login")]),
                ],
            ),
        )
        .await;
        assert_eq!(r.statuses.len(), 4);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert_eq!(r.statuses[1].current_limit.as_ref().unwrap().name, "login");
        assert!(r.statuses[2].current_limit.is_none());
        assert_eq!(
            codes(&r),
            (
                Code::OverLimit,
                vec![Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]
            ),
            "{ctx}"
        );
    })
    .await;
}

/// A status with code OK and nothing else: upstream's answer for a descriptor without a limit.
fn bare_ok() -> sluice::proto::DescriptorStatus {
    sluice::proto::DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_window_rolls_over() {
    for_each_store(|kind, redis| async move {
        let (sluice, _dir) = start(redis.as_ref(), &[]);
        let mut c = sluice.client().await;
        let tick = || request("app", vec![descriptor(&[("tick", "t")])]);
        // Start just after a second boundary so two requests surely share a window.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        tokio::time::sleep(Duration::from_nanos(
            1_000_000_000 - u64::from(now.subsec_nanos()) + 20_000_000,
        ))
        .await;
        assert_eq!(codes(&ask(&mut c, tick()).await).0, Code::Ok, "{kind:?}");
        let over = ask(&mut c, tick()).await;
        assert_eq!(codes(&over).0, Code::OverLimit, "{kind:?}");
        assert_eq!(over.statuses[0].duration_until_reset.unwrap().seconds, 1);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(
            codes(&ask(&mut c, tick()).await).0,
            Code::Ok,
            "{kind:?}: new window"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn headers_metadata_and_global_shadow() {
    for_each_store(|kind, redis| async move {
        let (sluice, _dir) = start(
            redis.as_ref(),
            &[
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
                ("LIMIT_RESET_HEADER", "X-Reset"),
                ("RESPONSE_DYNAMIC_METADATA", "true"),
                ("SHADOW_MODE", "true"),
            ],
        );
        let mut c = sluice.client().await;
        let login = || {
            request(
                "app",
                vec![
                    descriptor(&[("user", "zed")]),
                    descriptor(&[("path", "/login")]),
                ],
            )
        };
        let r = ask(&mut c, login()).await;
        let headers: Vec<(&str, &str)> = r
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(
            headers[0],
            ("RateLimit-Limit", "1"),
            "{kind:?}: least remaining is /login"
        );
        assert_eq!(headers[1], ("RateLimit-Remaining", "0"));
        assert_eq!(headers[2].0, "X-Reset");
        let meta = r.dynamic_metadata.unwrap();
        assert!(meta.fields.contains_key("domain") && meta.fields.contains_key("descriptors"));

        // Global shadow: overall OK, statuses still say OVER_LIMIT.
        let r = ask(&mut c, login()).await;
        assert_eq!(
            codes(&r),
            (Code::Ok, vec![Code::Ok, Code::OverLimit]),
            "{kind:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_requests_naming_nothing_get_invalid_argument() {
    let (sluice, _dir) = start(None, &[]);
    let mut c = sluice.client().await;
    let cases = [
        (
            request("", vec![descriptor(&[("user", "x")])]),
            "rate limit domain must not be empty",
        ),
        (
            request("app", vec![]),
            "rate limit descriptor list must not be empty",
        ),
    ];
    for (req, message) in cases {
        let status = c.should_rate_limit(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), message);
    }
    // Larger than the 1 MiB request bound: not an error (Envoy would fail open) but
    // OVER_LIMIT, undecoded and uncounted (src/server/oversized.rs).
    let huge = request("app", vec![descriptor(&[("user", &"v".repeat(2 << 20))])]);
    let reply = c.should_rate_limit(huge).await.unwrap().into_inner();
    assert_eq!(reply.overall_code, Code::OverLimit as i32, "{reply:?}");
}

/// A client over its limit cannot switch it off with one long header value (Envoy would fail
/// open on an error): the long value is judged under a digest, and the rest as usual. Beyond
/// the count limits, only the offending descriptor is refused. On both stores.
#[tokio::test(flavor = "multi_thread")]
async fn oversized_input_never_turns_a_decision_into_an_error() {
    for_each_store(|kind, redis| async move {
        let (sluice, _dir) = start(redis.as_ref(), &[("MAX_DESCRIPTORS_PER_REQUEST", "2")]);
        let mut c = sluice.client().await;
        let ctx = format!("{kind:?}");
        let login = || descriptor(&[("path", "/login")]);
        assert_eq!(ask(&mut c, request("app", vec![login()])).await.overall_code, Code::Ok as i32);

        let long = "x".repeat(5_000);
        let both = request("app", vec![descriptor(&[("user", &long)]), login()]);
        let r = ask(&mut c, both).await;
        assert_eq!(codes(&r), (Code::OverLimit, vec![Code::Ok, Code::OverLimit]), "{ctx}");
        assert_eq!(r.statuses[0].limit_remaining, 2, "{ctx}");
        // The long value's counter counts: 3 a minute.
        let alone = || request("app", vec![descriptor(&[("user", &long)])]);
        for remaining in [1, 0] {
            let r = ask(&mut c, alone()).await;
            assert_eq!(r.statuses[0].limit_remaining, remaining, "{ctx}");
        }
        assert_eq!(codes(&ask(&mut c, alone()).await).0, Code::OverLimit, "{ctx}");
        assert_eq!(sluice.metric("sluice_long_descriptor_parts_total{part=\"value\"}"), 4.0);

        // Three descriptors with a maximum of two: the third alone is refused, uncounted.
        let three = request(
            "app",
            vec![
                descriptor(&[("user", "a")]),
                descriptor(&[("health", "h")]),
                descriptor(&[("user", "b")]),
            ],
        );
        let r = ask(&mut c, three).await;
        assert_eq!(
            codes(&r),
            (Code::OverLimit, vec![Code::Ok, Code::Ok, Code::OverLimit]),
            "{ctx}"
        );
        let b = ask(&mut c, request("app", vec![descriptor(&[("user", "b")])])).await;
        assert_eq!(b.statuses[0].limit_remaining, 2, "{ctx}: b was not counted");

        // A bad override unit: that descriptor alone.
        let mut bad_unit = descriptor(&[("user", "c")]);
        bad_unit.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 0,
        });
        let r = ask(&mut c, request("app", vec![bad_unit, descriptor(&[("user", "d")])])).await;
        assert_eq!(codes(&r), (Code::OverLimit, vec![Code::OverLimit, Code::Ok]), "{ctx}");
        assert_eq!(
            sluice.metric("sluice_descriptors_refused_total{reason=\"too_many_descriptors\"}"),
            1.0
        );
        assert_eq!(
            sluice.metric("sluice_descriptors_refused_total{reason=\"bad_override_unit\"}"),
            1.0
        );
        // The same through /json.
        let body = format!(
            r#"{{"domain":"app","descriptors":[{{"entries":[{{"key":"user","value":"{long}"}}]}}]}}"#
        );
        let (status, reply) = sluice.http("POST", "/json", &body);
        assert_eq!(status, 429, "{ctx}: {reply}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_json_and_healthcheck() {
    let (sluice, _dir) = start(None, &[]);
    assert_eq!(
        sluice.http("GET", "/healthcheck", ""),
        (200, "OK".to_string())
    );
    let body = r#"{"domain":"app","descriptors":[{"entries":[{"key":"path","value":"/login"}]}]}"#;
    let (status, ok) = sluice.http("POST", "/json", body);
    assert_eq!(status, 200, "{ok}");
    let ok: serde_json::Value = serde_json::from_str(&ok).unwrap();
    assert_eq!(ok["overallCode"], "OK");
    assert_eq!(ok["statuses"][0]["currentLimit"]["name"], "login");
    assert_eq!(ok["statuses"][0]["currentLimit"]["unit"], "HOUR");
    let (status, over) = sluice.http("POST", "/json", body);
    assert_eq!(status, 429);
    let over: serde_json::Value = serde_json::from_str(&over).unwrap();
    assert_eq!(over["overallCode"], "OVER_LIMIT");
    assert_eq!(over["statuses"][0]["code"], "OVER_LIMIT");

    // Per-descriptor hitsAddend is a UInt64Value in JSON: a string or a number.
    let peek = r#"{"domain":"app","descriptors":[{"entries":[{"key":"user","value":"h"}],"hitsAddend":"0"}]}"#;
    let (status, body) = sluice.http("POST", "/json", peek);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"limitRemaining\":3"), "{body}");

    let (status, dump) = sluice.http("GET", "/rlconfig", "");
    assert_eq!(status, 200);
    assert!(
        dump.contains("app.path_/login: 1/hour fixed_window name=login ("),
        "{dump}"
    );
    assert!(dump.contains("app.health: unlimited"), "{dump}");

    assert_eq!(sluice.http("POST", "/json", "{not json").0, 400);
    assert_eq!(
        sluice
            .http("POST", "/json", r#"{"domain":"app","bogus":1}"#)
            .0,
        400
    );
    let (status, message) = sluice.http("POST", "/json", r#"{"domain":"","descriptors":[]}"#);
    assert_eq!(
        (status, message.as_str()),
        (400, "rate limit domain must not be empty")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn health_reflection_and_graceful_shutdown() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let (sluice, _dir) = start(None, &[]);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", sluice.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    let status = health
        .check(HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32);

    let mut reflection = ServerReflectionClient::new(channel);
    let list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = reflection
        .server_reflection_info(futures::stream::iter([list]))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(services)) = reply.message_response else {
        panic!("unexpected reflection reply {reply:?}");
    };
    let names: Vec<String> = services.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService".to_string()),
        "{names:?}"
    );

    let status = sluice.terminate();
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
}
