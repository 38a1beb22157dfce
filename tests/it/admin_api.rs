//! The admin API (issue #42) through the real binary: the issue's done-when (a used-up limit of
//! 3 an hour read with `"remaining": 0`, 401 without the token, admitted again after `DELETE`)
//! on the memory store and on Redis, every algorithm read and reset on both, escaped values,
//! `sluice.v1.Admin` over gRPC, `sluice counters get|reset`, the reset's log line and metrics,
//! and the over-limit decision log (hashed values, a bounded rate). The cluster is in
//! `tests/it/admin_api_cluster.rs`.

use sluice_test_kit as kit;

use std::process::Command;
use std::time::{Duration, Instant};

use kit::admin::{CONFIG, TOKEN, admitted, call, counters};
use kit::*;
use serde_json::Value;
use sluice::proto::sluice::v1::admin_client::AdminClient;
use sluice::proto::sluice::v1::{CountersRequest, DescriptorEntry as AdminEntry};

fn start(
    store: StoreKind,
    redis: Option<&RedisServer>,
    dir: &tempfile::TempDir,
    env: &[(&str, &str)],
) -> Sluice {
    let mut vars = vec![("ADMIN_API_TOKEN", TOKEN)];
    vars.extend_from_slice(env);
    assert_eq!(store == StoreKind::Redis, redis.is_some());
    Sluice::start(dir.path(), redis, &vars)
}

#[tokio::test]
async fn a_used_up_limit_is_read_and_reset_on_both_stores() {
    let dir = config_dir(CONFIG);
    for_each_store(|store, redis| {
        let dir = &dir;
        async move {
            let sluice = start(store, redis.as_ref(), dir, &[]);
            let mut client = sluice.client().await;
            kit::admin::done_when(&mut client, sluice.debug, "u1").await;
            // Another user's counter was never touched by any of it.
            let other = counters(sluice.debug, "GET", "user", "u2");
            assert_eq!(other[0]["remaining"], 3, "{store:?}");
            assert_eq!(other[0]["used"], 0, "{store:?}");
            kit::admin::every_algorithm_reads_and_resets(&mut client, sluice.debug, "a1").await;
            kit::admin::refunds_give_hits_back(&mut client, sluice.debug, "r1").await;
            assert_eq!(sluice.metric("sluice_admin_counters_reset_total"), 8.0, "{store:?}");
            assert_eq!(
                sluice.metric("sluice_admin_calls_total{api=\"http\",operation=\"get\",outcome=\"unauthenticated\"}"),
                2.0
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_reset_is_logged_with_who_asked_and_never_the_token() {
    let dir = config_dir(CONFIG);
    let sluice = start(StoreKind::Memory, None, &dir, &[]);
    let mut client = sluice.client().await;
    assert!(admitted(&mut client, "user", "u9").await);
    counters(sluice.debug, "DELETE", "user", "u9");
    let line = wait_for_line(&sluice, |l| l["@message"] == "admin API changed counters");
    assert_eq!(line["peer"], "127.0.0.1", "{line}");
    // printf %s admin-token-0123456789 | sha256sum | cut -c1-8
    assert_eq!(line["token"], fingerprint(TOKEN), "{line}");
    assert_eq!(line["domain"], "ops");
    assert_eq!(line["counters"], 1);
    let text = line.to_string();
    assert!(!text.contains(TOKEN) && !text.contains("u9"), "{text}");
}

#[tokio::test]
async fn refusals_say_why() {
    let dir = config_dir(CONFIG);
    let sluice = start(StoreKind::Memory, None, &dir, &[]);
    let cases = [
        ("/counters/ops", 400, "missing the descriptor"),
        ("/counters/ops?descriptor=user", 400, "no '='"),
        (
            "/counters/ops?descriptor=user%3Da%5Cqb",
            400,
            "only \\\\, \\\\= and \\\\\\\\ are escapes",
        ),
        ("/counters/nowhere?descriptor=user=u1", 404, "no domain"),
    ];
    for (path, status, reason) in cases {
        let (got, body) = call(sluice.debug, "GET", path, Some(TOKEN));
        assert_eq!(got, status, "{path}: {body}");
        let json: Value = serde_json::from_str(&body).unwrap();
        assert!(
            json["error"]
                .as_str()
                .unwrap()
                .contains(reason.replace("\\\\", "\\").as_str()),
            "{path}: {body}"
        );
    }
    // An unmatched descriptor is counted under nothing.
    assert!(counters(sluice.debug, "GET", "nobody", "x").is_empty());
    // The shadow-mode limit says so.
    let shadowed = counters(sluice.debug, "GET", "shadowed", "x");
    assert_eq!(shadowed[0]["shadow_mode"], true);
}

#[tokio::test]
async fn values_with_commas_and_equals_signs_are_escaped() {
    let dir = config_dir(CONFIG);
    let sluice = start(StoreKind::Memory, None, &dir, &[]);
    let mut client = sluice.client().await;
    let value = r"a,b=c\d";
    assert_eq!(kit::admin::use_up(&mut client, "user", value).await, 3);
    // user=a\,b\=c\\d, percent-encoded as a query value is.
    let escaped = "user%3Da%5C%2Cb%5C%3Dc%5C%5Cd";
    let (status, body) = call(
        sluice.debug,
        "GET",
        &format!("/counters/ops?descriptor={escaped}"),
        Some(TOKEN),
    );
    assert_eq!(status, 200, "{body}");
    let json: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["counters"][0]["remaining"], 0, "{body}");
    // Unescaped, the ',' splits the value: `user=a` and `b=c\d`, another descriptor, which no
    // limit matches (`user` has no nested `b`).
    let unescaped = "user%3Da%2Cb%3Dc%5C%5Cd";
    let (status, body) = call(
        sluice.debug,
        "GET",
        &format!("/counters/ops?descriptor={unescaped}"),
        Some(TOKEN),
    );
    assert_eq!(status, 200, "{body}");
    let json: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["counters"], serde_json::json!([]), "{body}");
    // And `user=a` alone is a fresh counter, not the used-up one.
    assert_eq!(
        counters(sluice.debug, "GET", "user", "a")[0]["remaining"],
        3
    );
    // The command line takes the escaped text as typed.
    let out = cli(
        &sluice,
        &["get", "--domain", "ops", "--descriptor", r"user=a\,b\=c\\d"],
        TOKEN,
    );
    assert!(out.status.success(), "{out:?}");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["counters"][0]["remaining"], 0);
}

#[tokio::test]
async fn the_grpc_admin_service_reads_and_resets_with_the_token_in_metadata() {
    let dir = config_dir(CONFIG);
    let sluice = start(StoreKind::Memory, None, &dir, &[]);
    let mut client = sluice.client().await;
    assert_eq!(kit::admin::use_up(&mut client, "user", "g1").await, 3);
    let mut admin_client = AdminClient::connect(format!("http://{}", sluice.grpc))
        .await
        .unwrap();
    let request = |token: Option<&str>| {
        let mut request = tonic::Request::new(CountersRequest {
            domain: "ops".into(),
            entries: vec![AdminEntry {
                key: "user".into(),
                value: "g1".into(),
            }],
            hits: 0,
        });
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
    };
    for token in [None, Some("admin-token-wrong-12345")] {
        let refused = admin_client.get_counters(request(token)).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        let refused = admin_client
            .reset_counters(request(token))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    }
    let read = admin_client
        .get_counters(request(Some(TOKEN)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.counters.len(), 1);
    assert_eq!(read.counters[0].remaining, 0);
    assert_eq!(read.counters[0].name, "per_user");
    assert_eq!(read.counters[0].algorithm, "fixed_window");
    assert!(!admitted(&mut client, "user", "g1").await);
    let reset = admin_client
        .reset_counters(request(Some(TOKEN)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reset.counters[0].remaining, 0);
    assert!(admitted(&mut client, "user", "g1").await);
    // A refund of 1 after the call above: the counter is back to 0 used.
    let mut refund = request(Some(TOKEN));
    refund.get_mut().hits = 1;
    let refunded = admin_client
        .refund_counters(refund)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refunded.counters[0].used, 0);
    assert_eq!(refunded.counters[0].remaining, 3);
    let no_hits = admin_client.refund_counters(request(Some(TOKEN))).await;
    assert_eq!(no_hits.unwrap_err().code(), tonic::Code::InvalidArgument);
    let mut unknown = request(Some(TOKEN));
    unknown.get_mut().domain = "nowhere".into();
    assert_eq!(
        admin_client.get_counters(unknown).await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    let line = wait_for_line(&sluice, |l| l["@message"] == "admin API changed counters");
    assert_eq!(line["peer"], "127.0.0.1", "{line}");
}

#[tokio::test]
async fn the_admin_api_is_off_without_a_token() {
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), None, &[]);
    let (status, _) = call(
        sluice.debug,
        "GET",
        "/counters/ops?descriptor=user=u1",
        Some(TOKEN),
    );
    assert_eq!(status, 404);
    let mut admin_client = AdminClient::connect(format!("http://{}", sluice.grpc))
        .await
        .unwrap();
    let mut request = tonic::Request::new(CountersRequest {
        domain: "ops".into(),
        entries: vec![],
        hits: 0,
    });
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let refused = admin_client.get_counters(request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented);
}

#[tokio::test]
async fn the_command_line_reads_and_resets() {
    let dir = config_dir(CONFIG);
    let sluice = start(StoreKind::Memory, None, &dir, &[]);
    let mut client = sluice.client().await;
    assert_eq!(kit::admin::use_up(&mut client, "user", "c1").await, 3);
    let args = ["--domain", "ops", "--descriptor", "user=c1"];
    let get = cli(&sluice, &[&["get"][..], &args].concat(), TOKEN);
    assert!(get.status.success(), "{get:?}");
    let json: Value = serde_json::from_slice(&get.stdout).unwrap();
    assert_eq!(json["counters"][0]["remaining"], 0, "{json}");
    let refused = cli(
        &sluice,
        &[&["reset"][..], &args].concat(),
        "admin-token-wrong-12345",
    );
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("401"),
        "{refused:?}"
    );
    assert!(!admitted(&mut client, "user", "c1").await);
    let refund = cli(
        &sluice,
        &[&["refund", "--hits", "3"][..], &args].concat(),
        TOKEN,
    );
    assert!(refund.status.success(), "{refund:?}");
    let json: Value = serde_json::from_slice(&refund.stdout).unwrap();
    // 3 admitted and 2 refused were counted (a fixed window counts refused hits); 3 given back.
    assert_eq!(json["counters"][0]["used"], 2, "{json}");
    assert!(admitted(&mut client, "user", "c1").await);
    assert!(!admitted(&mut client, "user", "c1").await);
    let reset = cli(&sluice, &[&["reset"][..], &args].concat(), TOKEN);
    assert!(reset.status.success(), "{reset:?}");
    assert!(admitted(&mut client, "user", "c1").await);
}

#[tokio::test]
async fn the_decision_log_writes_hashed_values_at_a_bounded_rate() {
    let dir = config_dir(CONFIG);
    let sluice = start(
        StoreKind::Memory,
        None,
        &dir,
        &[
            ("DECISION_LOG", "over_limit"),
            ("DECISION_LOG_MAX_PER_SECOND", "3"),
        ],
    );
    let mut client = sluice.client().await;
    assert_eq!(kit::admin::use_up(&mut client, "user", "u1").await, 3);
    let started = Instant::now();
    for _ in 0..39 {
        assert!(!admitted(&mut client, "user", "u1").await);
    }
    let seconds = started.elapsed().as_secs() + 1;
    // use_up's refused call and these 39: 40 over-limit decisions.
    let written = "sluice_decision_log_lines_total{outcome=\"written\"}";
    let dropped = "sluice_decision_log_lines_total{outcome=\"dropped\"}";
    assert_eq!(sluice.metric(written) + sluice.metric(dropped), 40.0);
    // At most 3 in each second the calls spanned (a second boundary may fall inside).
    assert!(
        sluice.metric(written) <= (3 * (seconds + 1)) as f64,
        "{}",
        sluice.metric(written)
    );
    assert!(sluice.metric(dropped) > 0.0);
    let line = wait_for_line(&sluice, |l| l["@message"] == "over limit");
    assert_eq!(line["target"], "sluice::decision_log", "{line}");
    assert_eq!(line["domain"], "ops");
    // printf %s u1 | sha256sum | cut -c1-16
    assert_eq!(line["descriptor"], "user=sha256:bb82030dbc2bcaba", "{line}");
    assert_eq!(line["limit"], "per_user");
    assert_eq!(line["algorithm"], "fixed_window");
    assert_eq!(line["remaining"], 0);
    assert_eq!(line["shadow_mode"], false);
    // Every line written reaches the log (the rest were dropped): the first, read above, and
    // the others, read as they arrive, each with the value hashed.
    let expected = sluice.metric(written) as usize;
    let mut lines = vec![line];
    while lines.len() < expected {
        lines.push(wait_for_line(&sluice, |l| l["@message"] == "over limit"));
    }
    assert!(
        lines
            .iter()
            .all(|l| l["descriptor"] == "user=sha256:bb82030dbc2bcaba")
    );
    std::thread::sleep(Duration::from_millis(100));
    let more = sluice
        .stdout_rest
        .try_iter()
        .filter(|l| l.contains("\"over limit\""))
        .count();
    assert_eq!(
        more, 0,
        "more lines than sluice_decision_log_lines_total says"
    );
}

/// The first log line (JSON) `matches` accepts, waiting up to 30 s.
fn wait_for_line(sluice: &Sluice, matches: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = sluice
            .stdout_rest
            .recv_timeout(left)
            .expect("the log line never came");
        if let Ok(json) = serde_json::from_str::<Value>(&line)
            && matches(&json)
        {
            return json;
        }
    }
}

/// `sluice counters <args> --addr <debug>` with `ADMIN_API_TOKEN=token`.
fn cli(sluice: &Sluice, args: &[&str], token: &str) -> std::process::Output {
    Command::new(kit::sluice_binary())
        .arg("counters")
        .args(args)
        .arg("--addr")
        .arg(format!("http://{}", sluice.debug))
        .env_clear()
        .env("ADMIN_API_TOKEN", token)
        .output()
        .unwrap()
}

/// The first 8 hex digits of the token's SHA-256, as the reset log shows it.
fn fingerprint(token: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("printf %s '{token}' | sha256sum | cut -c1-8"))
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test]
async fn per_second_limits_are_read_and_reset_in_their_own_redis() {
    // A second-unit limit goes to the per-second Redis (REDIS_PERSECOND); its window is an
    // hour long (unit_multiplier), so the test never races a window's end.
    let dir = config_dir(
        "domain: ops\ndescriptors:\n  - key: fast\n    rate_limit: {name: fast, unit: second, unit_multiplier: 3600, requests_per_unit: 3}\n",
    );
    let (main, second) = (RedisServer::start(), RedisServer::start());
    let second_url = format!("127.0.0.1:{}", second.port);
    let sluice = start(
        StoreKind::Redis,
        Some(&main),
        &dir,
        &[
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", &second_url),
        ],
    );
    let mut client = sluice.client().await;
    // Reading writes nothing, not even an empty counter.
    assert_eq!(
        counters(sluice.debug, "GET", "fast", "f1")[0]["remaining"],
        3
    );
    assert_eq!((main.dbsize(), second.dbsize()), (0, 0));
    assert_eq!(kit::admin::use_up(&mut client, "fast", "f1").await, 3);
    assert_eq!((main.dbsize(), second.dbsize()), (0, 1));
    let read = counters(sluice.debug, "GET", "fast", "f1");
    assert_eq!(read[0]["remaining"], 0, "{read:?}");
    counters(sluice.debug, "DELETE", "fast", "f1");
    assert_eq!(second.dbsize(), 0, "the reset went to the per-second Redis");
    assert!(admitted(&mut client, "fast", "f1").await);
}
