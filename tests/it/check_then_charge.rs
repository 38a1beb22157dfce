//! Upstream's check-then-charge pattern over the real RLS API, on both stores: a zero-cost check
//! (`hits_addend: 0`) on the request, and a charge of one on stream done (Envoy Gateway's
//! response cost). A zero-cost check is refused once no permit is left, so the pattern admits at
//! most the limit; the fixed window keeps upstream's rule (refused only once the count is above
//! the limit), so it admits at most the limit plus one per window.

use sluice_test_kit as kit;

use kit::*;
use sluice::proto::{Code, RateLimitDescriptor};

const LIMIT: usize = 5;

/// (descriptor value, rate_limit body, most admissions the pattern may give)
const CASES: &[(&str, &str, usize)] = &[
    ("fixed", "{unit: hour, requests_per_unit: 5}", LIMIT + 1),
    (
        "log",
        "{unit: hour, requests_per_unit: 5, algorithm: sliding_window_log}",
        LIMIT,
    ),
    (
        "counter",
        "{unit: hour, requests_per_unit: 5, algorithm: sliding_window_counter}",
        LIMIT,
    ),
    (
        "bucket",
        "{unit: hour, requests_per_unit: 5, algorithm: token_bucket}",
        LIMIT,
    ),
    (
        "gcra",
        "{unit: hour, requests_per_unit: 5, algorithm: gcra}",
        LIMIT,
    ),
    (
        "leaky",
        "{unit: hour, requests_per_unit: 5, algorithm: leaky_bucket}",
        LIMIT,
    ),
    (
        "warm",
        "{unit: hour, requests_per_unit: 5, algorithm: warm_up, warmup_period: 1s}",
        LIMIT,
    ),
];

fn with_hits(value: &str, hits: u64) -> RateLimitDescriptor {
    let mut d = descriptor(&[("algo", value)]);
    d.hits_addend = Some(hits);
    d
}

#[tokio::test(flavor = "multi_thread")]
async fn zero_cost_checks_then_charges_admit_at_most_the_limit() {
    for_each_store(|kind, redis| async move {
        avoid_window_edge(3600, 60).await;
        let mut yaml = String::from("domain: cost\ndescriptors:\n");
        for (value, rate_limit, _) in CASES {
            yaml.push_str(&format!(
                "  - key: algo\n    value: {value}\n    rate_limit: {rate_limit}\n"
            ));
        }
        let dir = config_dir(&yaml);
        let sluice = Sluice::start(dir.path(), redis.as_ref(), &[]);
        let mut client = sluice.client().await;
        for (value, _, most) in CASES {
            let mut admitted = 0;
            for _ in 0..4 * LIMIT {
                let check = ask(&mut client, request("cost", vec![with_hits(value, 0)])).await;
                if check.overall_code == Code::Ok as i32 {
                    admitted += 1;
                    // The charge, whatever it answers (the response was already sent).
                    ask(&mut client, request("cost", vec![with_hits(value, 1)])).await;
                }
            }
            assert!(
                (1..=*most).contains(&admitted),
                "{kind:?} {value}: {admitted} admitted, at most {most}"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn recorded_refusals_keep_larger_charges_within_the_limit() {
    // Charges of 2 against 5 per hour: without `record_refused_hits` a charge that does not fit
    // is refused and forgotten, so the checks go on admitting; with it, the refused charge spends
    // what was left and at most ceil(5 / 2) = 3 requests pass.
    for_each_store(|kind, redis| async move {
        avoid_window_edge(3600, 60).await;
        let mut yaml = String::from("domain: cost\ndescriptors:\n");
        for algorithm in ["sliding_window_log", "sliding_window_counter", "token_bucket"] {
            for record in [false, true] {
                yaml.push_str(&format!(
                    "  - key: algo\n    value: {algorithm}-{record}\n    rate_limit: {{unit: hour, \
                     requests_per_unit: 5, algorithm: {algorithm}, record_refused_hits: {record}}}\n"
                ));
            }
        }
        let dir = config_dir(&yaml);
        let sluice = Sluice::start(dir.path(), redis.as_ref(), &[]);
        let mut client = sluice.client().await;
        for algorithm in ["sliding_window_log", "sliding_window_counter", "token_bucket"] {
            for record in [false, true] {
                let value = format!("{algorithm}-{record}");
                let mut admitted = 0;
                for _ in 0..20 {
                    let check =
                        ask(&mut client, request("cost", vec![with_hits(&value, 0)])).await;
                    if check.overall_code == Code::Ok as i32 {
                        admitted += 1;
                        ask(&mut client, request("cost", vec![with_hits(&value, 2)])).await;
                    }
                }
                if record {
                    assert_eq!(admitted, 3, "{kind:?} {value}");
                } else {
                    assert_eq!(admitted, 20, "{kind:?} {value}");
                }
            }
        }
    })
    .await;
}
