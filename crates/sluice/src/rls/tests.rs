//! Decision-path tests on the memory store with a hand-driven clock.

use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use crate::clock::ManualClock;
use crate::config::{LoadOptions, load_sources};
use crate::proto::{
    Code, DescriptorEntry, DescriptorStatus, RateLimitDescriptor, RateLimitOverride,
};
use crate::store::{Charging, Check, MemoryStore, MemoryStoreOptions};

const CONFIG: &str = r#"
domain: app
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per_user}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 1, name: login}
  - key: path
    value: /special
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: special
      replaces: [{name: per_user}]
  - key: health
    rate_limit: {unlimited: true}
  - key: vip
    rate_limit: {unlimited: true, name: vip_free}
  - key: path
    value: /promo
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: promo
      replaces: [{name: vip_free}]
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota
    value: a
    quota_mode: true
    metadata: {backend: a, shared: {from: a}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota
    value: b
    quota_mode: true
    metadata: {backend: b, shared: {from: b, only_b: 1}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    value: "team-*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: tenant
    value: "solo-*"
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: internal
    rate_limit: {unit: minute, requests_per_unit: 1, name: internal, hide_from_headers: true}
"#;

struct Harness {
    limiter: RateLimiter,
    clock: Arc<ManualClock>,
}

fn harness(options: RlsOptions) -> Harness {
    // 1 000 039.5 s: 19.5 s into the minute window that starts at 1 000 020.
    let clock = Arc::new(ManualClock::new(1_000_039_500_000));
    let store = Arc::new(MemoryStore::new(
        MemoryStoreOptions::default(),
        clock.clone(),
    ));
    let limiter = RateLimiter::new(store, KeyBuilder::default(), clock.clone(), options);
    let config = load_sources(
        vec![(PathBuf::from("test.yaml"), CONFIG.to_string())],
        &LoadOptions::default(),
    )
    .unwrap();
    limiter.set_config(Arc::new(config));
    Harness { limiter, clock }
}

fn harness_with_limits(input_limits: InputLimits) -> Harness {
    harness(RlsOptions {
        input_limits,
        ..RlsOptions::default()
    })
}

fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| DescriptorEntry {
                key: k.as_bytes().to_vec(),
                value: v.as_bytes().to_vec(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "app".into(),
        descriptors,
        hits_addend: 0,
    }
}

impl Harness {
    async fn ask(&self, req: &RateLimitRequest) -> RateLimitResponse {
        self.limiter.should_rate_limit(req, None).await.unwrap()
    }

    async fn codes(&self, req: &RateLimitRequest) -> (Code, Vec<Code>) {
        let r = self.ask(req).await;
        (
            Code::try_from(r.overall_code).unwrap(),
            r.statuses
                .iter()
                .map(|s| Code::try_from(s.code).unwrap())
                .collect(),
        )
    }
}

#[tokio::test]
async fn counts_to_the_limit_then_refuses() {
    let h = harness(RlsOptions::default());
    let req = request(vec![descriptor(&[("user", "alice")])]);
    let first = h.ask(&req).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    let status = &first.statuses[0];
    assert_eq!(status.limit_remaining, 1);
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit),
        ("per_user", 2)
    );
    assert_eq!(limit.unit, crate::proto::ResponseUnit::Minute as i32);
    // 19.5 s into the window: 40.5 s left, reported as 41 whole seconds (upstream: 60 - 20).
    assert_eq!(status.duration_until_reset.unwrap().seconds, 41);

    assert_eq!(h.codes(&req).await, (Code::Ok, vec![Code::Ok]));
    let third = h.ask(&req).await;
    assert_eq!(third.overall_code, Code::OverLimit as i32);
    assert_eq!(third.statuses[0].limit_remaining, 0);
    assert!(third.statuses[0].current_limit.is_some());

    // Another value has its own counter; a new window starts over.
    let bob = request(vec![descriptor(&[("user", "bob")])]);
    assert_eq!(h.codes(&bob).await.0, Code::Ok);
    h.clock.advance_micros(41_000_000);
    assert_eq!(h.codes(&req).await.0, Code::Ok);
}

#[tokio::test]
async fn no_limit_and_unknown_domain_are_bare_ok() {
    let h = harness(RlsOptions::default());
    let r = h
        .ask(&request(vec![descriptor(&[("nothing", "here")])]))
        .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(
        r.statuses,
        vec![DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        }]
    );

    let mut other = request(vec![
        descriptor(&[("user", "x")]),
        descriptor(&[("user", "y")]),
    ]);
    other.domain = "elsewhere".into();
    let r = h.ask(&other).await;
    assert_eq!(r.statuses.len(), 2);
    assert!(
        r.statuses
            .iter()
            .all(|s| s.current_limit.is_none() && s.code == Code::Ok as i32)
    );
}

#[tokio::test]
async fn unlimited_reports_max_remaining() {
    let h = harness(RlsOptions::default());
    for _ in 0..5 {
        let r = h.ask(&request(vec![descriptor(&[("health", "x")])])).await;
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert!(r.statuses[0].current_limit.is_none());
        assert!(r.statuses[0].duration_until_reset.is_none());
    }
}

#[tokio::test]
async fn replaces_drops_the_named_limit() {
    let h = harness(RlsOptions::default());
    let req = request(vec![
        descriptor(&[("user", "carol")]),
        descriptor(&[("path", "/special")]),
    ]);
    for _ in 0..4 {
        let r = h.ask(&req).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert!(
            r.statuses[0].current_limit.is_none(),
            "per_user is replaced"
        );
        assert_eq!(
            r.statuses[1].current_limit.as_ref().unwrap().name,
            "special"
        );
    }
    // The replaced limit was never counted.
    let alone = request(vec![descriptor(&[("user", "carol")])]);
    assert_eq!(h.ask(&alone).await.statuses[0].limit_remaining, 1);
}

#[tokio::test]
async fn a_replaced_unlimited_limit_stays_unlimited() {
    let h = harness(RlsOptions::default());
    let req = request(vec![
        descriptor(&[("vip", "v")]),
        descriptor(&[("path", "/promo")]),
    ]);
    let r = h.ask(&req).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    // Upstream sets unlimited descriptors aside before `replaces` is applied.
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(r.statuses[1].current_limit.as_ref().unwrap().name, "promo");
    assert_eq!(r.statuses[1].limit_remaining, 4);
}

#[tokio::test]
async fn per_rule_shadow_mode_answers_ok() {
    let h = harness(RlsOptions::default());
    let req = request(vec![descriptor(&[("shadow", "s")])]);
    h.ask(&req).await;
    let r = h.ask(&req).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!(r.statuses[0].current_limit.is_some());
}

#[tokio::test]
async fn global_shadow_mode_keeps_statuses() {
    let h = harness(RlsOptions {
        shadow_mode: true,
        ..Default::default()
    });
    let req = request(vec![descriptor(&[("path", "/login")])]);
    h.ask(&req).await;
    assert_eq!(h.codes(&req).await, (Code::Ok, vec![Code::OverLimit]));
}

#[tokio::test]
async fn quota_mode_needs_every_quota_descriptor_over() {
    let h = harness(RlsOptions::default());
    let a = descriptor(&[("quota", "a")]);
    let b = descriptor(&[("quota", "b")]);
    // Use up a.
    h.ask(&request(vec![a.clone()])).await;
    assert_eq!(
        h.codes(&request(vec![a.clone(), b.clone()])).await,
        (Code::Ok, vec![Code::OverLimit, Code::Ok])
    );
    // Now both are over.
    assert_eq!(
        h.codes(&request(vec![a.clone(), b.clone()])).await,
        (Code::OverLimit, vec![Code::OverLimit, Code::OverLimit])
    );
    // A non-quota descriptor over the limit decides alone.
    let login = descriptor(&[("path", "/login")]);
    h.ask(&request(vec![login.clone()])).await;
    assert_eq!(h.codes(&request(vec![login])).await.0, Code::OverLimit);
}

#[tokio::test]
async fn global_quota_mode_counts_descriptors_without_a_limit() {
    let h = harness(RlsOptions {
        quota_mode: true,
        ..Default::default()
    });
    let login = descriptor(&[("path", "/login")]);
    h.ask(&request(vec![login.clone()])).await; // /login is now used up
    // Alone, the one quota descriptor is over: OVER_LIMIT.
    assert_eq!(
        h.codes(&request(vec![login.clone()])).await,
        (Code::OverLimit, vec![Code::OverLimit])
    );
    // Upstream counts every descriptor that is not unlimited as a quota descriptor: one that
    // matches nothing is a quota descriptor not over its limit, so the request is OK.
    let unmatched = descriptor(&[("nothing", "x")]);
    assert_eq!(
        h.codes(&request(vec![login.clone(), unmatched])).await,
        (Code::Ok, vec![Code::OverLimit, Code::Ok])
    );
    // A replaced one and an empty one count as well.
    let replaced = descriptor(&[("user", "q")]);
    let replacing = descriptor(&[("path", "/special")]);
    assert_eq!(
        h.codes(&request(vec![login.clone(), replaced, replacing]))
            .await,
        (Code::Ok, vec![Code::OverLimit, Code::Ok, Code::Ok])
    );
    assert_eq!(
        h.codes(&request(vec![
            login.clone(),
            RateLimitDescriptor::default()
        ]))
        .await
        .0,
        Code::Ok
    );
    // An unlimited one does not: the request is over.
    assert_eq!(
        h.codes(&request(vec![login, descriptor(&[("health", "x")])]))
            .await
            .0,
        Code::OverLimit
    );
}

#[tokio::test]
async fn hits_addend_precedence() {
    let h = harness(RlsOptions::default());
    // Request-level cost 2 spends alice's whole budget of 2.
    let mut req = request(vec![descriptor(&[("user", "dave")])]);
    req.hits_addend = 2;
    let r = h.ask(&req).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 0)
    );
    // A per-descriptor 0 checks without counting, and wins over the request's cost.
    let mut look = descriptor(&[("user", "dave")]);
    look.hits_addend = Some(0);
    let mut req = request(vec![look]);
    req.hits_addend = 5;
    let r = h.ask(&req).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 0)
    );
    // Request-level 0 counts as 1.
    let r = h.ask(&request(vec![descriptor(&[("user", "dave")])])).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // A huge cost is simply over, never an overflow.
    let mut huge = descriptor(&[("user", "erin")]);
    huge.hits_addend = Some(u64::MAX);
    let r = h.ask(&request(vec![huge.clone(), huge])).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
}

#[tokio::test]
async fn overrides_bypass_the_tree() {
    let h = harness(RlsOptions::default());
    let mut d = descriptor(&[("anything", "goes")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: crate::proto::OverrideUnit::Hour as i32,
    });
    let r = h.ask(&request(vec![d.clone()])).await;
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.name.as_str(), limit.requests_per_unit), ("", 1));
    assert_eq!(limit.unit, crate::proto::ResponseUnit::Hour as i32);
    assert_eq!(h.codes(&request(vec![d.clone()])).await.0, Code::OverLimit);

    // An unknown unit refuses that descriptor (see descriptors_beyond_the_input_limits_...).
    d.limit.as_mut().unwrap().unit = 0;
    assert_eq!(h.codes(&request(vec![d])).await.0, Code::OverLimit);
}

#[tokio::test]
async fn wildcards_count_per_value_unless_shared() {
    let h = harness(RlsOptions::default());
    let each = |v: &str| request(vec![descriptor(&[("tenant", v)])]);
    // solo-*: each value has its own budget of 2.
    for v in ["solo-a", "solo-b"] {
        h.ask(&each(v)).await;
        assert_eq!(h.codes(&each(v)).await.0, Code::Ok);
    }
    // team-*: all values share one budget of 2.
    h.ask(&each("team-a")).await;
    h.ask(&each("team-b")).await;
    assert_eq!(h.codes(&each("team-c")).await.0, Code::OverLimit);
}

#[tokio::test]
async fn response_headers_follow_upstream_choice() {
    let names = HeaderNames::default();
    let h = harness(RlsOptions {
        response_headers: Some(names),
        ..Default::default()
    });
    let headers = |r: &RateLimitResponse| -> Vec<(String, String)> {
        r.response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect()
    };
    // The least remaining among limited descriptors.
    let r = h
        .ask(&request(vec![
            descriptor(&[("user", "f")]),
            descriptor(&[("path", "/login")]),
        ]))
        .await;
    assert_eq!(
        headers(&r),
        [
            ("RateLimit-Limit".to_string(), "1".to_string()),
            ("RateLimit-Remaining".to_string(), "0".to_string()),
            ("RateLimit-Reset".to_string(), "41".to_string())
        ]
    );
    // Over the limit: /login (limit 1) is over, user f (limit 2) is at 2 of 2 and still OK.
    let r = h
        .ask(&request(vec![
            descriptor(&[("path", "/login")]),
            descriptor(&[("user", "f")]),
        ]))
        .await;
    assert_eq!(
        h.codes(&request(vec![descriptor(&[("path", "/login")])]))
            .await
            .1,
        [Code::OverLimit]
    );
    assert_eq!(
        headers(&r)[0].1,
        "1",
        "the over-limit one, not the least remaining"
    );
    // Both over: the last over-limit descriptor wins, whatever the order.
    let r = h
        .ask(&request(vec![
            descriptor(&[("path", "/login")]),
            descriptor(&[("user", "f")]),
        ]))
        .await;
    assert_eq!(
        r.statuses
            .iter()
            .filter(|s| s.code == Code::OverLimit as i32)
            .count(),
        2
    );
    assert_eq!(headers(&r)[0].1, "2", "user f is last");
    let r = h
        .ask(&request(vec![
            descriptor(&[("user", "f")]),
            descriptor(&[("path", "/login")]),
        ]))
        .await;
    assert_eq!(headers(&r)[0].1, "1", "/login is last");
    // No limit anywhere: no headers.
    let r = h.ask(&request(vec![descriptor(&[("nothing", "x")])])).await;
    assert!(r.response_headers_to_add.is_empty());
}

/// `hide_from_headers`: the headers describe the request's other limits as if the hidden one
/// were not there, whether it has the least remaining or refuses; its status is unchanged.
#[tokio::test]
async fn hidden_limits_are_left_out_of_the_headers() {
    let h = harness(RlsOptions {
        response_headers: Some(HeaderNames::default()),
        draft_headers: true,
        ..Default::default()
    });
    let both = || {
        request(vec![
            descriptor(&[("internal", "i")]),
            descriptor(&[("user", "u")]),
        ])
    };
    let limit_header = |r: &RateLimitResponse| {
        r.response_headers_to_add
            .iter()
            .map(|h| format!("{}: {}", h.key, h.value))
            .collect::<Vec<_>>()
    };
    // internal has 0 left of 1, user 1 of 2: the headers describe user.
    let r = h.ask(&both()).await;
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "internal"
    );
    let shown = limit_header(&r);
    assert!(
        shown.contains(&"RateLimit-Limit: 2".to_string()),
        "{shown:?}"
    );
    assert!(
        shown.contains(&"RateLimit-Remaining: 1".to_string()),
        "{shown:?}"
    );
    assert!(shown.iter().all(|h| !h.contains("internal")), "{shown:?}");
    // internal refuses, user still admits: refused, and the headers still describe user.
    let r = h.ask(&both()).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    let shown = limit_header(&r);
    assert!(
        shown.contains(&"RateLimit-Remaining: 0".to_string()),
        "{shown:?}"
    );
    assert!(shown.iter().any(|h| h.contains("per_user")), "{shown:?}");
    assert!(shown.iter().all(|h| !h.contains("internal")), "{shown:?}");
    // Alone, a hidden limit gives no headers at all.
    let r = h
        .ask(&request(vec![descriptor(&[("internal", "j")])]))
        .await;
    assert!(
        r.response_headers_to_add.is_empty(),
        "{:?}",
        limit_header(&r)
    );
}

#[tokio::test]
async fn dynamic_metadata_merges_descriptors_under_the_limit() {
    use prost_types::value::Kind;
    let h = harness(RlsOptions {
        dynamic_metadata: true,
        ..Default::default()
    });
    let a = descriptor(&[("quota", "a")]);
    let mut b = descriptor(&[("quota", "b")]);
    b.hits_addend = Some(1);
    h.ask(&request(vec![a.clone()])).await; // a is now used up
    let mut req = request(vec![a, b]);
    req.hits_addend = 3;
    let meta = h.ask(&req).await.dynamic_metadata.unwrap();
    let field = |s: &prost_types::Struct, k: &str| s.fields.get(k).and_then(|v| v.kind.clone());
    assert_eq!(
        field(&meta, "domain"),
        Some(Kind::StringValue("app".into()))
    );
    assert_eq!(field(&meta, "hitsAddend"), Some(Kind::NumberValue(3.0)));
    let Some(Kind::StructValue(merged)) = field(&meta, "metadata") else {
        panic!("{meta:?}")
    };
    // Only b is under the limit (b's cost 1 of 1), so only its metadata appears.
    assert_eq!(
        field(&merged, "backend"),
        Some(Kind::StringValue("b".into()))
    );
    let Some(Kind::ListValue(list)) = field(&meta, "descriptors") else {
        panic!()
    };
    let Some(Kind::StructValue(second)) = list.values[1].kind.clone() else {
        panic!()
    };
    assert_eq!(field(&second, "hitsAddend"), Some(Kind::NumberValue(1.0)));
    assert_eq!(
        field(&second, "entries"),
        Some(Kind::ListValue(prost_types::ListValue {
            values: vec![prost_types::Value {
                kind: Some(Kind::StringValue("quota=b".into()))
            }]
        }))
    );
}

#[tokio::test]
async fn only_requests_naming_nothing_are_errors() {
    let h = harness(RlsOptions::default());
    let message = |r: Result<RateLimitResponse, RlsError>| match r {
        Err(RlsError::InvalidRequest(m)) => m,
        other => panic!("expected an invalid request, got {other:?}"),
    };
    let mut empty_domain = request(vec![descriptor(&[("user", "x")])]);
    empty_domain.domain.clear();
    assert_eq!(
        message(h.limiter.should_rate_limit(&empty_domain, None).await),
        "rate limit domain must not be empty"
    );
    assert_eq!(
        message(h.limiter.should_rate_limit(&request(vec![]), None).await),
        "rate limit descriptor list must not be empty"
    );
}

fn statuses(r: &RateLimitResponse) -> (i32, Vec<(i32, u32)>) {
    (
        r.overall_code,
        r.statuses
            .iter()
            .map(|s| (s.code, s.limit_remaining))
            .collect(),
    )
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn a_long_value_is_judged_and_cannot_hide_another_descriptor() {
    let h = harness(RlsOptions::default());
    // The login limit (1 a minute) is spent.
    let login = descriptor(&[("path", "/login")]);
    let r = h
        .limiter
        .should_rate_limit(&request(vec![login.clone()]), None)
        .await;
    assert_eq!(r.unwrap().overall_code, OK);

    // 5 000 bytes, over MAX_DESCRIPTOR_VALUE_BYTES (4 096): still counted under per_user (2 a
    // minute), and the login descriptor beside it is still refused.
    let long = "u".repeat(5_000);
    let both = request(vec![descriptor(&[("user", &long)]), login.clone()]);
    let r = h.limiter.should_rate_limit(&both, None).await.unwrap();
    assert_eq!(statuses(&r), (OVER, vec![(OK, 1), (OVER, 0)]));
    let alone = request(vec![descriptor(&[("user", &long)])]);
    let r = h.limiter.should_rate_limit(&alone, None).await.unwrap();
    assert_eq!(statuses(&r), (OK, vec![(OK, 0)]));
    let r = h.limiter.should_rate_limit(&alone, None).await.unwrap();
    assert_eq!(
        statuses(&r),
        (OVER, vec![(OVER, 0)]),
        "the long value's counter counts"
    );

    // Another long value (differing in its last byte only) has its own counter.
    let other = format!("{}v", &long[..4_999]);
    let r = h
        .limiter
        .should_rate_limit(&request(vec![descriptor(&[("user", &other)])]), None)
        .await
        .unwrap();
    assert_eq!(statuses(&r), (OK, vec![(OK, 1)]));
}

#[tokio::test]
async fn long_keys_and_domains_are_judged_too() {
    let h = harness_with_limits(InputLimits {
        max_key_bytes: 2,
        max_domain_bytes: 2,
        ..InputLimits::default()
    });
    // "user" and "app" are over the (tiny) limits: matched on their text, counted under digests.
    let one = request(vec![descriptor(&[("user", "a")])]);
    for remaining in [1, 0] {
        let r = h.limiter.should_rate_limit(&one, None).await.unwrap();
        assert_eq!(statuses(&r), (OK, vec![(OK, remaining)]));
    }
    let r = h.limiter.should_rate_limit(&one, None).await.unwrap();
    assert_eq!(statuses(&r), (OVER, vec![(OVER, 0)]));
}

#[tokio::test]
async fn descriptors_beyond_the_input_limits_are_refused_alone() {
    let h = harness_with_limits(InputLimits {
        max_descriptors: 2,
        max_entries: 2,
        ..InputLimits::default()
    });
    // The third descriptor is past the count: refused (OVER_LIMIT, not counted); the first two
    // are decided as usual.
    let r = h
        .limiter
        .should_rate_limit(
            &request(vec![
                descriptor(&[("user", "a")]),
                descriptor(&[("health", "x")]),
                descriptor(&[("user", "b")]),
            ]),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        statuses(&r),
        (OVER, vec![(OK, 1), (OK, UNLIMITED_REMAINING), (OVER, 0)])
    );
    assert!(r.statuses[2].current_limit.is_none());
    // ... and "b" was not counted.
    let r = h
        .limiter
        .should_rate_limit(&request(vec![descriptor(&[("user", "b")])]), None)
        .await
        .unwrap();
    assert_eq!(statuses(&r), (OK, vec![(OK, 1)]));

    // Too many entries: that descriptor alone.
    let r = h
        .limiter
        .should_rate_limit(
            &request(vec![
                descriptor(&[("user", "c")]),
                descriptor(&[("a", "1"), ("b", "2"), ("c", "3")]),
            ]),
            None,
        )
        .await
        .unwrap();
    assert_eq!(statuses(&r), (OVER, vec![(OK, 1), (OVER, 0)]));

    // A bad override unit: that descriptor alone.
    let mut bad_unit = descriptor(&[("user", "d")]);
    bad_unit.limit = Some(RateLimitOverride {
        requests_per_unit: 100,
        unit: 0,
    });
    let r = h
        .limiter
        .should_rate_limit(&request(vec![bad_unit, descriptor(&[("user", "e")])]), None)
        .await
        .unwrap();
    assert_eq!(statuses(&r), (OVER, vec![(OVER, 0), (OK, 1)]));

    // No entries: OK with no limit, as upstream answers; the others are decided.
    let r = h
        .limiter
        .should_rate_limit(
            &request(vec![
                RateLimitDescriptor::default(),
                descriptor(&[("user", "f")]),
            ]),
            None,
        )
        .await
        .unwrap();
    assert_eq!(statuses(&r), (OK, vec![(OK, 0), (OK, 1)]));
}

#[tokio::test]
async fn no_config_is_an_error() {
    let clock = Arc::new(ManualClock::new(0));
    let store = Arc::new(MemoryStore::new(
        MemoryStoreOptions::default(),
        clock.clone(),
    ));
    let limiter = RateLimiter::new(store, KeyBuilder::default(), clock, RlsOptions::default());
    let err = limiter
        .should_rate_limit(&request(vec![descriptor(&[("user", "x")])]), None)
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "no rate limit configuration loaded");
}

#[tokio::test]
async fn draft_headers_describe_the_same_status() {
    let h = harness(RlsOptions {
        draft_headers: true,
        ..Default::default()
    });
    let r = h
        .ask(&request(vec![descriptor(&[("path", "/login")])]))
        .await;
    let headers: Vec<(&str, &str)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert_eq!(
        headers,
        [
            ("RateLimit-Policy", "\"login\";q=1;w=60"),
            ("RateLimit", "\"login\";r=0;t=41")
        ]
    );
    // Unnamed limits are "default"; no limit, no headers.
    let r = h.ask(&request(vec![descriptor(&[("shadow", "x")])])).await;
    assert_eq!(r.response_headers_to_add[0].value, "\"default\";q=1;w=60");
    let r = h.ask(&request(vec![descriptor(&[("nothing", "x")])])).await;
    assert!(r.response_headers_to_add.is_empty());
}

/// Counts the checks that reach the memory store, to see which ones the local cache answered.
#[derive(Debug)]
struct CountingStore {
    inner: MemoryStore,
    checks: std::sync::atomic::AtomicUsize,
}

impl crate::store::Store for CountingStore {
    fn kind(&self) -> &'static str {
        "counting"
    }
}

impl CounterStore for CountingStore {
    fn check_with<'a>(
        &'a self,
        call: crate::store::Call<'a>,
        checks: &'a [&'a Check],
        charging: Charging,
    ) -> crate::store::StoreFuture<'a> {
        self.checks.fetch_add(checks.len(), Ordering::SeqCst);
        self.inner.check_with(call, checks, charging)
    }
}

#[tokio::test]
async fn local_cache_refuses_over_limit_windows_without_the_store() {
    let clock = Arc::new(ManualClock::new(1_000_039_500_000));
    let store = Arc::new(CountingStore {
        inner: MemoryStore::new(MemoryStoreOptions::default(), clock.clone()),
        checks: Default::default(),
    });
    let metrics = Arc::new(Metrics::new(0.8));
    let options = RlsOptions {
        local_cache_bytes: 1 << 20,
        ..Default::default()
    };
    let limiter = RateLimiter::new(store.clone(), KeyBuilder::default(), clock.clone(), options)
        .with_metrics(metrics.clone());
    let config = load_sources(
        vec![(PathBuf::from("test.yaml"), CONFIG.to_string())],
        &LoadOptions::default(),
    )
    .unwrap();
    limiter.set_config(Arc::new(config));
    let reached = || store.checks.load(Ordering::SeqCst);

    let alice = request(vec![descriptor(&[("user", "alice")])]);
    let both = request(vec![
        descriptor(&[("user", "alice")]),
        descriptor(&[("user", "bob")]),
    ]);
    for _ in 0..2 {
        let r = limiter.should_rate_limit(&alice, None).await.unwrap();
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    // Admitted at the limit is not cached (a look with 0 hits would still be admitted).
    assert_eq!(reached(), 2);
    let refused = limiter.should_rate_limit(&alice, None).await.unwrap();
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    assert_eq!(reached(), 3, "the first refusal comes from the store");

    // Now alice is answered locally, with the window's remaining time; bob still counts.
    let r = limiter.should_rate_limit(&both, None).await.unwrap();
    assert_eq!(reached(), 4, "only bob reached the store");
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(r.statuses[0].duration_until_reset.unwrap().seconds, 41);
    assert_eq!(r.statuses[1].code, Code::Ok as i32);
    let text = String::from_utf8(metrics.render()).unwrap();
    for line in [
        "ratelimit_service_rate_limit_app_user_over_limit_with_local_cache 1",
        // Cached refusals are over-limit hits too, as upstream counts them.
        "ratelimit_service_rate_limit_over_limit{domain=\"app\",key1=\"user\"} 2",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }

    // The next window is a new key: the store decides again.
    clock.advance_micros(41_000_000);
    let r = limiter.should_rate_limit(&alice, None).await.unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(reached(), 5);
}

#[tokio::test]
async fn stop_increment_counts_nothing_once_the_local_cache_refuses() {
    let h = harness(RlsOptions {
        stop_increment_when_over: true,
        local_cache_bytes: 1 << 20,
        ..Default::default()
    });
    let login = descriptor(&[("path", "/login")]);
    h.ask(&request(vec![login.clone()])).await;
    // Over: the store refuses it and the cache remembers the window.
    assert_eq!(
        h.codes(&request(vec![login.clone()])).await.0,
        Code::OverLimit
    );
    // The cache refuses /login; as upstream, the other descriptor is then only looked at.
    let r = h
        .ask(&request(vec![descriptor(&[("user", "z")]), login]))
        .await;
    assert_eq!(statuses(&r), (OVER, vec![(OK, 2), (OVER, 0)]));
    let mut look = descriptor(&[("user", "z")]);
    look.hits_addend = Some(0);
    assert_eq!(
        h.ask(&request(vec![look])).await.statuses[0].limit_remaining,
        2
    );
}

/// A store that is always down.
#[derive(Debug)]
struct Down;

impl crate::store::Store for Down {
    fn kind(&self) -> &'static str {
        "down"
    }
}

impl CounterStore for Down {
    fn check_with<'a>(
        &'a self,
        _: crate::store::Call<'a>,
        _: &'a [&'a Check],
        _: Charging,
    ) -> crate::store::StoreFuture<'a> {
        Box::pin(async { Err(StoreError::Unavailable("breaker open".into())) })
    }
}

#[tokio::test]
async fn answers_decided_locally_carry_the_mark() {
    use crate::store::layers::Layered;
    use crate::store::layers::local_share::{LocalShare, Replicas};
    let clock = Arc::new(ManualClock::new(1_000_039_500_000));
    let local = Arc::new(MemoryStore::new(
        MemoryStoreOptions::default(),
        clock.clone(),
    ));
    let layer = LocalShare::new(local, Replicas::new(Some(2)), Arc::new(|| {}));
    let layer = Layered::new(layer, Down);
    let options = RlsOptions {
        failure_policy: FailurePolicy::LocalShare,
        dynamic_metadata: true,
        ..Default::default()
    };
    let limiter = RateLimiter::new(Arc::new(layer), KeyBuilder::default(), clock, options);
    let h = harness(RlsOptions::default());
    limiter.set_config(h.limiter.config().unwrap());
    let alice = request(vec![descriptor(&[("user", "alice")])]);
    let marked = |r: &RateLimitResponse| {
        let header = r
            .response_headers_to_add
            .iter()
            .any(|h| h.key == DEGRADED_HEADER && h.value == "true");
        let metadata = r
            .dynamic_metadata
            .as_ref()
            .unwrap()
            .fields
            .get(DEGRADED_METADATA);
        header && metadata.is_some()
    };
    // 2 a minute over 2 replicas: 1 here, then refused; both marked.
    let first = limiter.should_rate_limit(&alice, None).await.unwrap();
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert!(marked(&first), "{first:?}");
    let second = limiter.should_rate_limit(&alice, None).await.unwrap();
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    assert!(marked(&second), "{second:?}");
    // The store's own answers are not marked.
    let exact = h.ask(&alice).await;
    assert!(
        !exact
            .response_headers_to_add
            .iter()
            .any(|h| h.key == DEGRADED_HEADER)
    );
}
