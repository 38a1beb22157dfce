//! The fuzz harnesses: what each target does with one input, shared by the libFuzzer entry points
//! in `fuzz_targets/` and the stable-Rust runner in `src/bin/plain.rs`.
//!
//! * [`config_loader`]: the bytes are one YAML config file for `sluice::config::load_sources`.
//!   Config files are operator input, but a loader that panics or aborts takes the service (or
//!   `check-config`) down with it instead of naming the bad line, so it must return errors.
//! * [`request`]: the bytes become one `RateLimitRequest` (protobuf-decoded, or built field by
//!   field with `arbitrary`, chosen by the first byte) that goes through
//!   `RateLimiter::should_rate_limit` on the memory store with [`EXAMPLE_CONFIG`] loaded. This
//!   is the input a client controls. Errors are fine; panics are not, and neither is a response
//!   that breaks the protocol's shape (one status per descriptor, known codes).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use arbitrary::Unstructured;
use prost::Message;
use sluice::clock::ManualClock;
use sluice::config::{LoadOptions, RateLimitConfig, load_sources};
use sluice::proto::{
    Code, DescriptorEntry, RateLimitDescriptor, RateLimitOverride, RateLimitRequest,
    RateLimitResponse,
};
use sluice::rls::{HeaderNames, InputLimits, KeyBuilder, RateLimiter, RlsError, RlsOptions};
use sluice::store::{MemoryStore, MemoryStoreOptions};

/// The fuzz targets, by the names `cargo fuzz` and the plain runner use.
pub const TARGETS: &[&str] = &["config_loader", "request"];

/// Runs the harness of `target` on one input. Panics (that is the finding) on a bug.
pub fn run(target: &str, data: &[u8]) {
    match target {
        "config_loader" => config_loader(data),
        "request" => request(data),
        other => panic!("unknown fuzz target {other:?} (known: {TARGETS:?})"),
    }
}

/// A copy of `examples/config/example.yaml`: it uses every feature of the format (key-only,
/// exact and wildcard values, nesting, unlimited, replaces, share_threshold, shadow and quota
/// mode, metadata). Copied rather than included so edits to the example cannot silently change
/// what a recorded crash input exercises.
pub const EXAMPLE_CONFIG: &str = r#"# Limits for the Envoy example in deploy/envoy (domain "example"), in envoyproxy/ratelimit's format.
# Each feature of the format appears at least once; `sluice check-config examples/config` lists
# what they compile to.
domain: example
descriptors:
  # Key only: one counter per distinct value (here, per client address).
  - key: remote_address
    rate_limit:
      name: per_address
      unit: minute
      requests_per_unit: 100

  # Exact value, with a nested level: POST /login per address.
  - key: generic_key
    value: login
    descriptors:
      - key: remote_address
        rate_limit:
          name: login_per_address
          unit: hour
          requests_per_unit: 20

  # A user header (Envoy request_headers action with descriptor_key: user).
  - key: user
    rate_limit:
      name: per_user
      unit: day
      requests_per_unit: 10000
    descriptors:
      # Nested limit for one path prefix; a request with both entries is limited here only.
      - key: path
        value: "/api/*"
        detailed_metric: true
        rate_limit:
          name: per_user_api
          unit: second
          requests_per_unit: 10

  # Internal traffic is never limited and never touches the store.
  - key: generic_key
    value: internal
    rate_limit:
      unlimited: true

  # Premium users: when this descriptor is in the request, the per_user limit is dropped.
  - key: plan
    value: premium
    rate_limit:
      name: premium
      unit: day
      requests_per_unit: 100000
      replaces:
        - name: per_user

  # Wildcard with share_threshold: every /static/... path shares ONE counter.
  - key: path
    value: "/static/*"
    share_threshold: true
    rate_limit:
      unit: second
      requests_per_unit: 500

  # Wildcard in the middle: one counter per matching value (v1/users, v1/orders...).
  - key: path
    value: "/v*/reports"
    value_to_metric: true
    rate_limit:
      unit: week
      requests_per_unit: 50

  # Shadow mode: counted and reported, never enforced. Try a new limit this way first.
  - key: experiment
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 5

  # Quota mode: the request is refused only when every quota descriptor in it is over; the
  # metadata of those still under quota comes back in dynamic metadata
  # (RESPONSE_DYNAMIC_METADATA=true) so a filter can pick a backend.
  - key: backend
    value: primary
    quota_mode: true
    metadata:
      cluster: primary
    rate_limit:
      unit: month
      requests_per_unit: 1000000
  - key: backend
    value: overflow
    quota_mode: true
    metadata:
      cluster: overflow
    rate_limit:
      unit: year
      requests_per_unit: 5000000
"#;

/// A second domain with tiny limits, so that OVER_LIMIT, quota exhaustion and a refuse-all
/// limit are reached within a few hits instead of never, and with every `algorithm`, which the
/// example does not use.
pub const SMALL_LIMITS_CONFIG: &str = r#"domain: small
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1, name: one}
    descriptors:
      - key: path
        value: "*_*"
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: "a*b*c"
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: quota
    value: x
    quota_mode: true
    metadata: {pick: x, nested: {deep: [1, 2, {k: v}]}}
    rate_limit: {unit: minute, requests_per_unit: 1, replaces: [{name: one}]}
  - key: quota
    value: y
    quota_mode: true
    metadata: {pick: y, nested: {other: true}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  # Sluice's own algorithms (`rate_limit.algorithm`): state keys instead of window keys.
  - key: algo
    value: log
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window_log}
  - key: algo
    value: counter
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window_counter}
  - key: algo
    value: token
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 3}
  - key: algo
    value: gcra
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: gcra, burst: 1}
  - key: algo
    value: leaky
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: leaky_bucket}
  - key: algo
    value: "warm*"
    share_threshold: true
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: warm_up
      warmup_period: 1s
      cold_factor: 3
"#;

// ---------------------------------------------------------------------------------------------
// config_loader

/// One input = one YAML file. Invalid UTF-8 is converted lossily rather than skipped, so the
/// fuzzer's byte mutations are never wasted.
pub fn config_loader(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    let line_count = yaml_lines(&text);
    match load_sources(
        vec![(PathBuf::from("fuzz.yaml"), text)],
        &LoadOptions::default(),
    ) {
        Ok(config) => {
            // Every compiled limit must be reachable through the public dump without panicking.
            for limit in config.limits() {
                let _ = limit.origin.as_ref().map(ToString::to_string);
            }
            for name in config.domain_names() {
                let domain = config.domain(name).expect("listed domain exists");
                let _ = domain.find(&[entry("key", "value")]);
            }
        }
        Err(errors) => {
            // docs/operators.md promises `file:line: reason` for every error: a failed load must say
            // why, and a line must point into the file. yaml-rust2 reports an error found at
            // the end of the stream on the line after the last one (where a final newline
            // would start a line), so one past the end is allowed: an early version of this
            // harness flagged `a: b\nc` (error on line 3 of 2) as a bug; it is a quirk.
            assert!(!errors.0.is_empty(), "a failed load reported no error");
            for error in &errors.0 {
                if let Some(line) = error.line {
                    assert!(
                        (1..=line_count + 1).contains(&line),
                        "error line {line} outside a {line_count}-line file: {error}"
                    );
                }
            }
            let _ = errors.to_string();
        }
    }
}

/// Lines as YAML counts them: CR LF, a lone CR and LF each end one. (`str::lines` ignores a lone
/// CR, which made an early version of this harness blame the loader for a correct line number.)
fn yaml_lines(text: &str) -> usize {
    let crlf = text.matches("\r\n").count();
    text.matches(['\r', '\n']).count() - crlf + 1
}

// ---------------------------------------------------------------------------------------------
// request

/// 10 s after a day boundary in November 2023: far from 0, as a real clock is.
const FIXED_MICROS: u64 = 1_700_006_410_000_000;

fn config() -> Arc<RateLimitConfig> {
    static CONFIG: OnceLock<Arc<RateLimitConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let sources = vec![
                (PathBuf::from("example.yaml"), EXAMPLE_CONFIG.to_string()),
                (PathBuf::from("small.yaml"), SMALL_LIMITS_CONFIG.to_string()),
            ];
            Arc::new(load_sources(sources, &LoadOptions::default()).expect("fuzz config loads"))
        })
        .clone()
}

/// A fresh limiter per input: counters from earlier inputs must not make a crash depend on the
/// order inputs were run in, or it could not be reproduced from the saved input alone.
fn limiter(options: RlsOptions) -> RateLimiter {
    let clock = Arc::new(ManualClock::new(FIXED_MICROS));
    let store = Arc::new(MemoryStore::new(
        MemoryStoreOptions {
            // Small, so that eviction runs too.
            max_counters: 64,
            ..Default::default()
        },
        clock.clone(),
    ));
    let limiter = RateLimiter::new(
        store,
        KeyBuilder::new("fuzz:").expect("prefix without braces"),
        clock,
        options,
    );
    limiter.set_config(config());
    limiter
}

/// First byte: bit 0 chooses protobuf decoding (0) or field-by-field building (1) of the rest;
/// bits 1-4 switch the service-wide options, so every combination is reachable.
pub fn request(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let request = if selector & 1 == 0 {
        match RateLimitRequest::decode(rest) {
            Ok(request) => request,
            Err(_) => return,
        }
    } else {
        match structured_request(&mut Unstructured::new(rest)) {
            Ok(request) => request,
            Err(_) => return,
        }
    };
    let options = RlsOptions {
        shadow_mode: selector & 2 != 0,
        quota_mode: selector & 4 != 0,
        response_headers: (selector & 8 != 0).then(HeaderNames::default),
        dynamic_metadata: selector & 16 != 0,
        draft_headers: selector & 32 != 0,
        // The over-limit cache answers refusals without the store: the same checks must hold.
        local_cache_bytes: if selector & 64 != 0 { 1 << 16 } else { 0 },
        input_limits: InputLimits::default(),
        ..RlsOptions::default()
    };
    let global_shadow = options.shadow_mode;
    let limiter = limiter(options);
    // Twice: the second round sees the counters of the first, which reaches OVER_LIMIT paths.
    for _ in 0..2 {
        match futures_executor::block_on(limiter.should_rate_limit(&request, None)) {
            Ok(response) => check_response(&request, &response, global_shadow),
            // Only a request that names no domain or no descriptor gets no decision: no other
            // input may turn into an error, on which Envoy would fail open.
            Err(RlsError::InvalidRequest(_))
                if request.domain.is_empty() || request.descriptors.is_empty() => {}
            // The memory store cannot fail and a config is loaded: any other error is a bug.
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
}

fn check_response(request: &RateLimitRequest, response: &RateLimitResponse, global_shadow: bool) {
    let known = |code: i32| code == Code::Ok as i32 || code == Code::OverLimit as i32;
    assert_eq!(
        response.statuses.len(),
        request.descriptors.len(),
        "Envoy pairs statuses with descriptors by position"
    );
    assert!(known(response.overall_code), "{response:?}");
    assert!(
        response.statuses.iter().all(|s| known(s.code)),
        "{response:?}"
    );
    if global_shadow {
        assert_eq!(
            response.overall_code,
            Code::Ok as i32,
            "SHADOW_MODE answers OK"
        );
    }
}

/// Keys and values that reach the interesting parts of the fuzz config: a mutation-only fuzzer
/// would take very long to spell `remote_address` by chance.
const KEYS: &[&str] = &[
    "remote_address",
    "generic_key",
    "user",
    "path",
    "plan",
    "experiment",
    "backend",
    "quota",
    "shadow",
    "algo",
    "tenant",
];
const VALUES: &[&str] = &[
    "10.0.0.1",
    "login",
    "internal",
    "premium",
    "/api/x",
    "/static/a",
    "/v1/reports",
    "primary",
    "overflow",
    "x",
    "y",
    "log",
    "counter",
    "token",
    "gcra",
    "leaky",
    "warm-1",
    "a_b",
    "abc",
    "*",
    "%5F",
    "{tag}",
    "",
];

/// A known name, one around the input limits, or arbitrary text; sometimes bytes that are not
/// UTF-8, which Envoy copies from obs-text header bytes and which must be judged like any other.
fn pick<'a>(u: &mut Unstructured<'a>, known: &[&'static str]) -> arbitrary::Result<Vec<u8>> {
    Ok(if u.ratio(3, 4)? {
        (*u.choose(known)?).as_bytes().to_vec()
    } else if u.ratio(1, 8)? {
        // Around the input limits (256-byte keys, 4096-byte values).
        let piece: &str = u.arbitrary()?;
        let times = u.int_in_range(0..=5000usize)?;
        piece
            .repeat(times.min(5000 / piece.len().max(1)))
            .into_bytes()
    } else if u.ratio(1, 3)? {
        u.arbitrary::<&[u8]>()?.to_vec()
    } else {
        u.arbitrary::<&str>()?.as_bytes().to_vec()
    })
}

fn structured_request(u: &mut Unstructured) -> arbitrary::Result<RateLimitRequest> {
    let domain = pick(u, &["example", "small", "tenants"])?;
    // Mostly small; sometimes past MAX_DESCRIPTORS_PER_REQUEST (64).
    let count = if u.ratio(1, 16)? {
        u.int_in_range(0..=70)?
    } else {
        u.int_in_range(0..=6)?
    };
    let mut descriptors = Vec::with_capacity(count);
    for _ in 0..count {
        let entries = if u.ratio(1, 16)? {
            u.int_in_range(0..=18)?
        } else {
            u.int_in_range(1..=3)?
        };
        let entries = (0..entries)
            .map(|_| {
                Ok(DescriptorEntry {
                    key: pick(u, KEYS)?,
                    value: pick(u, VALUES)?,
                })
            })
            .collect::<arbitrary::Result<_>>()?;
        let limit = if u.ratio(1, 6)? {
            Some(RateLimitOverride {
                requests_per_unit: u.arbitrary()?,
                // -1..=8 covers every defined unit, UNKNOWN and values outside the enum.
                unit: u.int_in_range(-1..=8)?,
            })
        } else {
            None
        };
        descriptors.push(RateLimitDescriptor {
            entries,
            limit,
            hits_addend: u.arbitrary()?,
        });
    }
    Ok(RateLimitRequest {
        domain,
        descriptors,
        hits_addend: u.arbitrary()?,
    })
}

fn entry(key: &str, value: &str) -> DescriptorEntry {
    DescriptorEntry {
        key: key.into(),
        value: value.into(),
    }
}

/// Starting inputs for a target: the shipped configs, and requests that reach each feature.
/// `fuzz/seeds/` holds these as files (`plain --write-seeds`).
pub fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    /// One seed descriptor's entries, as (key, value) pairs.
    type Entries<'a> = &'a [(&'a str, &'a str)];
    match target {
        "config_loader" => vec![
            ("example.yaml".into(), EXAMPLE_CONFIG.as_bytes().to_vec()),
            ("small.yaml".into(), SMALL_LIMITS_CONFIG.as_bytes().to_vec()),
            (
                "anchors.yaml".into(),
                b"domain: d\ndescriptors:\n  - &e {key: k, value: v, rate_limit: {unit: minute, requests_per_unit: 1}}\n  - key: j\n    descriptors: [*e]\n"
                    .to_vec(),
            ),
        ],
        "request" => {
            let requests: &[(&str, &[Entries])] = &[
                ("example", &[&[("remote_address", "10.0.0.1")]]),
                ("example", &[&[("generic_key", "login"), ("remote_address", "10.0.0.1")]]),
                ("example", &[&[("user", "alice"), ("path", "/api/x")], &[("user", "alice")]]),
                ("example", &[&[("plan", "premium")], &[("user", "bob")]]),
                ("example", &[&[("path", "/static/a")], &[("path", "/v1/reports")]]),
                ("example", &[&[("backend", "primary")], &[("backend", "overflow")]]),
                ("example", &[&[("experiment", "e")], &[("generic_key", "internal")]]),
                ("small", &[&[("quota", "x")], &[("quota", "y")], &[("user", "u")]]),
                ("small", &[&[("user", "u"), ("path", "a_b")], &[("shadow", "s")]]),
                ("small", &[&[("algo", "log")], &[("algo", "counter")], &[("algo", "token")]]),
                ("small", &[&[("algo", "gcra")], &[("algo", "leaky")], &[("algo", "warm-1")]]),
            ];
            let mut seeds = Vec::new();
            for (i, (domain, descriptors)) in requests.iter().enumerate() {
                let request = RateLimitRequest {
                    domain: domain.as_bytes().to_vec(),
                    descriptors: descriptors
                        .iter()
                        .map(|entries| RateLimitDescriptor {
                            entries: entries.iter().map(|(k, v)| entry(k, v)).collect(),
                            ..Default::default()
                        })
                        .collect(),
                    hits_addend: 0,
                };
                // Selector 0b11110: protobuf, with every option on; 0: protobuf, options off.
                for selector in [0u8, 0b11110] {
                    let mut bytes = vec![selector];
                    request.encode(&mut bytes).expect("Vec grows");
                    seeds.push((format!("proto-{i}-{selector}"), bytes));
                }
            }
            seeds
        }
        other => panic!("unknown fuzz target {other:?}"),
    }
}
