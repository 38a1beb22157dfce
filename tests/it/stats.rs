//! Upstream's stats through the real binary: the default Prometheus mapping, a mapper file,
//! `EXTRA_TAGS`, the statsd and DogStatsD sinks (read by a listener in the test), the debug
//! port, sink exclusivity, `DISABLE_STATS`, and the shipped Grafana dashboard's queries.

use sluice_test_kit as kit;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, UdpSocket};
use std::time::{Duration, Instant};

use kit::*;

const HOUR: &str = "unit: hour";

/// `name{labels} value` lines of a Prometheus text exposition: (name, labels, value).
fn series(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (head, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match head.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}').unwrap()),
            None => (head, ""),
        };
        let mut map = BTreeMap::new();
        let mut rest = labels;
        while let Some((k, after)) = rest.split_once("=\"") {
            let mut value = String::new();
            let mut chars = after.char_indices();
            let mut end = after.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.push(chars.next().unwrap().1),
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            map.insert(k.trim_start_matches(',').to_string(), value);
            rest = &after[end..];
        }
        out.push((name.to_string(), map, value.parse().unwrap()));
    }
    out
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn find(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    let want = labels(want);
    series(text)
        .into_iter()
        .find(|(n, l, _)| n == name && *l == want)
        .map(|(_, _, v)| v)
}

#[tokio::test(flavor = "multi_thread")]
async fn default_mapping_and_extra_tags_on_every_series() {
    let dir = config_dir(&format!(
        "domain: app\ndescriptors:\n  - key: one\n    rate_limit: {{{HOUR}, requests_per_unit: 9}}\n  - key: host\n    value_to_metric: true\n    rate_limit: {{{HOUR}, requests_per_unit: 9}}\n  - key: a\n    value: '1'\n    descriptors:\n      - key: b\n        rate_limit: {{{HOUR}, requests_per_unit: 9}}\n        descriptors:\n          - key: c\n            rate_limit: {{{HOUR}, requests_per_unit: 9}}\n  - key: s\n    shadow_mode: true\n    rate_limit: {{{HOUR}, requests_per_unit: 1}}\n"
    ));
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[("EXTRA_TAGS", "env:test,team:rl"), ("USE_STATSD", "false")],
    );
    let mut c = sluice.client().await;
    avoid_window_edge(3600, 10).await;
    ask(&mut c, request("app", vec![descriptor(&[("one", "x")])])).await;
    ask(
        &mut c,
        request("app", vec![descriptor(&[("host", "api.example.com")])]),
    )
    .await;
    ask(
        &mut c,
        request("app", vec![descriptor(&[("a", "1"), ("b", "2")])]),
    )
    .await;
    ask(
        &mut c,
        request(
            "app",
            vec![descriptor(&[("a", "1"), ("b", "2"), ("c", "3")])],
        ),
    )
    .await;
    // Three hits in one request on a limit of one: two are over.
    let mut shadow = request("app", vec![descriptor(&[("s", "x")])]);
    shadow.hits_addend = 3;
    ask(&mut c, shadow).await;
    let tags = [("env", "test"), ("team", "rl")];
    let with = |pairs: &[(&'static str, &'static str)]| -> Vec<(&'static str, &'static str)> {
        pairs.iter().chain(&tags).copied().collect()
    };
    let (_, text) = sluice.http("GET", "/metrics", "");
    type Check<'a> = (&'a str, Vec<(&'a str, &'a str)>, f64);
    let checks: Vec<Check> = vec![
        // 1 level: domain and key1.
        (
            "ratelimit_service_rate_limit_total_hits",
            with(&[("domain", "app"), ("key1", "one")]),
            1.0,
        ),
        // A value with dots: the regex rules cut it apart, as upstream's mapping does.
        (
            "ratelimit_service_rate_limit_total_hits",
            with(&[("domain", "app"), ("key1", "host_api"), ("key2", "example")]),
            1.0,
        ),
        // 2 levels: no rule matches; the name is escaped and has no labels but the tags.
        (
            "ratelimit_service_rate_limit_app_a_1_b_total_hits",
            with(&[]),
            1.0,
        ),
        // 3 levels: the regex rules, key1 and key2.
        (
            "ratelimit_service_rate_limit_within_limit",
            with(&[("domain", "app"), ("key1", "a_1"), ("key2", "b")]),
            1.0,
        ),
        // Shadow mode counts only the hits over the limit, as upstream (not all 3).
        (
            "ratelimit_service_rate_limit_shadow_mode",
            with(&[("domain", "app"), ("key1", "s")]),
            2.0,
        ),
        (
            "ratelimit_service_total_requests",
            with(&[("grpc_method", "ShouldRateLimit")]),
            5.0,
        ),
        ("ratelimit_service_config_load_success", with(&[]), 1.0),
    ];
    for (name, want, value) in checks {
        assert_eq!(
            find(&text, name, &want),
            Some(value),
            "{name} {want:?}\n{text}"
        );
    }
    // Every series of upstream's stats carries the tags.
    for (name, l, _) in series(&text) {
        if name.starts_with("ratelimit_service_") && !name.starts_with("ratelimit_service_response")
        {
            assert_eq!(
                l.get("env").map(String::as_str),
                Some("test"),
                "{name} {l:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn mapper_file_drops_and_maps_by_regex() {
    let mapper = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        mapper.path(),
        r#"mappings:
  - match: "ratelimit.service.rate_limit.*.*.within_limit"
    name: dropped
    action: drop
  - match: 'ratelimit\.service\.rate_limit\.([^.]+)\.(.+)\.(total_hits|over_limit)$'
    match_type: regex
    name: "rl_$3"
    labels: {dom: "$1", path: "$2"}
"#,
    )
    .unwrap();
    let (sluice, dir) = one_request(&[
        ("PROMETHEUS_MAPPER_YAML", mapper.path().to_str().unwrap()),
        ("USE_STATSD", "false"),
    ])
    .await;
    let (_, text) = sluice.http("GET", "/metrics", "");
    assert_eq!(
        find(&text, "rl_total_hits", &[("dom", "app"), ("path", "k")]),
        Some(1.0),
        "{text}"
    );
    assert!(!text.contains("within_limit"), "dropped:\n{text}");
    // Unmatched stats keep their escaped names.
    assert!(
        text.contains("\nratelimit_service_config_load_success 1\n"),
        "{text}"
    );

    // A mapper file that does not load stops the start-up, naming the file and the reason.
    std::fs::write(mapper.path(), "mappings:\n  - match: aa.bb\n").unwrap();
    let (_, stderr) =
        refused_start(sluice_command(dir.path()).env("PROMETHEUS_MAPPER_YAML", mapper.path()));
    assert!(
        stderr.contains(mapper.path().to_str().unwrap())
            && stderr.contains("didn't set a metric name"),
        "{stderr}"
    );
}

/// Lines a statsd listener gets until `done` says it has seen enough (at most 20 s).
fn read_until(
    lines: impl Iterator<Item = String>,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    for line in lines {
        seen.push(line);
        if done(&seen) || Instant::now() > deadline {
            break;
        }
    }
    seen
}

/// Sluice with one rule and a statsd (or DogStatsD) sink on `port`, flushing every 100 ms,
/// after one request.
async fn start_with_statsd(port: u16, dog: bool) -> (Sluice, tempfile::TempDir) {
    let port = port.to_string();
    let sinks = if dog {
        [("USE_STATSD", "false"), ("USE_DOG_STATSD", "true")]
    } else {
        [("USE_STATSD", "true"), ("USE_DOG_STATSD", "false")]
    };
    let mut env = vec![
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", port.as_str()),
        ("STATS_FLUSH_INTERVAL", "100ms"),
        ("EXTRA_TAGS", "env:t"),
    ];
    env.extend(sinks);
    one_request(&env).await
}

/// Sluice with one rule (`app`, `k`), started with `env`, after one request on it.
async fn one_request(env: &[(&str, &str)]) -> (Sluice, tempfile::TempDir) {
    let dir = config_dir(&format!(
        "domain: app\ndescriptors:\n  - key: k\n    rate_limit: {{{HOUR}, requests_per_unit: 9}}\n"
    ));
    let sluice = Sluice::start(dir.path(), None, env);
    let mut c = sluice.client().await;
    ask(&mut c, request("app", vec![descriptor(&[("k", "x")])])).await;
    (sluice, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn statsd_sink_sends_counters_and_timers_over_tcp() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sluice, _dir) = start_with_statsd(port, false).await;
    let (stream, _) = listener.accept().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let want = [
        "ratelimit.service.rate_limit.app.k.total_hits.__env=t:1|c",
        "ratelimit.service.rate_limit.app.k.within_limit.__env=t:1|c",
        "ratelimit_server.ShouldRateLimit.total_requests.__env=t:1|c",
        "ratelimit.service.config_load_success.__env=t:1|c",
    ];
    let lines = BufReader::new(stream).lines().map_while(Result::ok);
    let seen = read_until(lines, |seen| {
        want.iter().all(|w| seen.iter().any(|l| l == w))
            && seen
                .iter()
                .any(|l| l.starts_with("ratelimit_server.ShouldRateLimit.response_time.__env=t:"))
    });
    for w in want {
        assert!(seen.iter().any(|l| l == w), "{w} not in {seen:?}");
    }
    let timer = seen
        .iter()
        .find(|l| l.starts_with("ratelimit_server.ShouldRateLimit.response_time.__env=t:"))
        .unwrap_or_else(|| panic!("no timer in {seen:?}"));
    assert!(timer.ends_with("|ms"), "{timer}");
    drop(sluice);
}

/// The sink connects before it formats a flush; while nothing listens, flushes are dropped, and
/// once a statsd server is there, counters and timers reach it.
#[tokio::test(flavor = "multi_thread")]
async fn statsd_sink_sends_once_a_server_listens() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (sluice, _dir) = start_with_statsd(port, false).await;
    // Several flushes (every 100 ms) find nobody.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let mut c = sluice.client().await;
    ask(&mut c, request("app", vec![descriptor(&[("k", "y")])])).await;
    let (stream, _) = listener.accept().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let hits = "ratelimit.service.rate_limit.app.k.total_hits.__env=t:";
    let timer = "ratelimit_server.ShouldRateLimit.response_time.__env=t:";
    let lines = BufReader::new(stream).lines().map_while(Result::ok);
    let seen = read_until(lines, |seen| {
        seen.iter().any(|l| l.starts_with(hits)) && seen.iter().any(|l| l.starts_with(timer))
    });
    assert!(
        seen.iter().any(|l| l.starts_with(hits)),
        "no hits in {seen:?}"
    );
    assert!(
        seen.iter()
            .any(|l| l.starts_with(timer) && l.ends_with("|ms")),
        "no timer in {seen:?}"
    );
    drop(sluice);
}

/// A statsd server that restarts (closes its connections, listens again on its port) loses no
/// count: the sink sees the closed connection before its next flush and connects again. Before,
/// that flush went into the closed connection (the write succeeds, the server is gone), the one
/// after failed on the reset, the hits of both were lost, and this test's listener waited in
/// vain: with no hits after those, the sink never connected again.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_statsd_server_gets_every_count() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sluice, _dir) = start_with_statsd(port, false).await;
    let hits = "ratelimit.service.rate_limit.app.k.total_hits.__env=t:";
    let count = |line: &String| -> u64 {
        line.strip_prefix(hits)
            .and_then(|rest| rest.strip_suffix("|c"))
            .map_or(0, |n| n.parse().unwrap())
    };
    let (stream, _) = listener.accept().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let lines = BufReader::new(stream).lines().map_while(Result::ok);
    let first = read_until(lines, |seen| seen.iter().map(count).sum::<u64>() >= 1);
    assert_eq!(first.iter().map(count).sum::<u64>(), 1, "{first:?}");

    // The restart: the connection and the listener closed, a new listener on the same port.
    drop(listener);
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let mut c = sluice.client().await;
    for _ in 0..3 {
        ask(&mut c, request("app", vec![descriptor(&[("k", "x")])])).await;
    }
    // One more hit, ten flushes later, so that even a sink that lost the three connects again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    ask(&mut c, request("app", vec![descriptor(&[("k", "x")])])).await;
    // Not a blocking accept: the old sink, its writes lost, never connected again.
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("the sink did not connect to the restarted server in 20 s: {e}"),
        }
    };
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let lines = BufReader::new(stream).lines().map_while(Result::ok);
    let after = read_until(lines, |seen| seen.iter().map(count).sum::<u64>() >= 4);
    assert_eq!(
        after.iter().map(count).sum::<u64>(),
        4,
        "hits after the restart: {after:?}"
    );
    drop(sluice);
}

#[tokio::test(flavor = "multi_thread")]
async fn dogstatsd_sink_sends_tags() {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let (sluice, _dir) = start_with_statsd(socket.local_addr().unwrap().port(), true).await;
    let want = "ratelimit.service.rate_limit.app.k.total_hits:1|c|#env:t";
    let datagrams = std::iter::from_fn(|| {
        let mut buf = [0u8; 2048];
        let n = socket.recv(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    });
    let seen = read_until(datagrams, |seen| seen.iter().any(|l| l == want));
    assert!(seen.iter().any(|l| l == want), "{want} not in {seen:?}");
    drop(sluice);
}

#[tokio::test(flavor = "multi_thread")]
async fn debug_port_serves_rlconfig_and_stats() {
    let dir = config_dir(&format!(
        "domain: app\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {{{HOUR}, requests_per_unit: 9}}\n  - key: s\n    shadow_mode: true\n    rate_limit: {{unit: second, requests_per_unit: 3}}\n  - key: u\n    rate_limit: {{unlimited: true}}\n"
    ));
    let sluice = Sluice::start(dir.path(), None, &[("USE_STATSD", "false")]);
    let mut c = sluice.client().await;
    ask(&mut c, request("app", vec![descriptor(&[("k", "v")])])).await;
    let (status, index) = http_request(sluice.debug, "GET", "/", "");
    assert_eq!(status, 200);
    assert_eq!(
        index,
        "/rlconfig: print out the currently loaded configuration for debugging\n/stats: print out stats\n"
    );
    let (status, dump) = http_request(sluice.debug, "GET", "/rlconfig", "");
    assert_eq!(status, 200);
    assert_eq!(
        dump,
        "app.k_v: unit=HOUR requests_per_unit=9, shadow_mode: false\n\
         app.s: unit=SECOND requests_per_unit=3, shadow_mode: true\n\
         app.u: unit=UNKNOWN requests_per_unit=0, shadow_mode: false\n"
    );
    let (status, stats) = http_request(sluice.debug, "GET", "/stats", "");
    assert_eq!(status, 200);
    for line in [
        "ratelimit.service.rate_limit.app.k_v.total_hits: 1",
        "ratelimit.service.config_load_success: 1",
        "ratelimit_server.ShouldRateLimit.total_requests: 1",
    ] {
        assert!(stats.lines().any(|l| l == line), "{line} not in\n{stats}");
    }
}

#[test]
fn two_sinks_at_once_are_refused_naming_both() {
    let dir = config_dir("domain: app\ndescriptors:\n  - key: k\n");
    let (_, stderr) = refused_start(sluice_command(dir.path()).env("USE_PROMETHEUS", "true"));
    assert!(stderr.contains("USE_STATSD and USE_PROMETHEUS"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn disable_stats_hides_upstreams_stats() {
    let (sluice, _dir) = one_request(&[("DISABLE_STATS", "true")]).await;
    let (_, text) = sluice.http("GET", "/metrics", "");
    assert!(!text.contains("ratelimit_service_rate_limit"), "{text}");
    assert!(!text.contains("ratelimit_service_total_requests"), "{text}");
    assert!(text.contains("sluice_memory_store_entries"), "{text}");
    let (_, stats) = http_request(sluice.debug, "GET", "/stats", "");
    assert_eq!(stats, "");
}

/// A PromQL selector's metric name and label matchers: (label, op, value).
type Selector = (String, Vec<(String, String, String)>);

/// The selectors of one PromQL expression (no PromQL engine: names and `{...}` matchers).
fn selectors(expr: &str) -> Vec<Selector> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("ratelimit_service_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].to_string();
        let mut matchers = Vec::new();
        let after = &tail[end..];
        let mut consumed = end;
        if let Some(body) = after.strip_prefix('{') {
            let close = body.find('}').unwrap();
            for m in body[..close].split(',').filter(|m| !m.trim().is_empty()) {
                let m = m.trim();
                let op_at = m.find(['=', '!']).unwrap();
                let label = m[..op_at].trim().to_string();
                let op_len = if m[op_at + 1..].starts_with(['=', '~']) {
                    2
                } else {
                    1
                };
                let op = m[op_at..op_at + op_len].to_string();
                let value = m[op_at + op_len..].trim().trim_matches('"').to_string();
                matchers.push((label, op, value));
            }
            consumed += close + 2;
        }
        out.push((name, matchers));
        rest = &tail[consumed..];
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn grafana_dashboard_queries_find_series() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/deploy/grafana/ratelimit-dashboard.json"))
            .unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() >= 10, "{exprs:?}");

    // Envoy Gateway's shape: a listener domain, route-rule descriptors two levels deep.
    let route = "httproute/default/backend/rule/0/match/0/example";
    let dir = config_dir(&format!(
        "domain: default/eg/http\ndescriptors:\n  - key: {route}\n    value: {route}\n    descriptors:\n      - key: rule-0-match-0\n        value: rule-0-match-0\n        rate_limit: {{{HOUR}, requests_per_unit: 5}}\n  - key: shadow\n    shadow_mode: true\n    rate_limit: {{{HOUR}, requests_per_unit: 1}}\n"
    ));
    let mapper = format!("{root}/deploy/grafana/ratelimit-mapper.yaml");
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[("PROMETHEUS_MAPPER_YAML", &mapper), ("USE_STATSD", "false")],
    );
    let mut c = sluice.client().await;
    avoid_window_edge(3600, 10).await;
    let rule = descriptor(&[(route, route), ("rule-0-match-0", "rule-0-match-0")]);
    for _ in 0..6 {
        ask(&mut c, request("default/eg/http", vec![rule.clone()])).await;
    }
    for _ in 0..2 {
        ask(
            &mut c,
            request("default/eg/http", vec![descriptor(&[("shadow", "x")])]),
        )
        .await;
    }
    let _ = c
        .should_rate_limit(request("", vec![descriptor(&[("k", "x")])]))
        .await;
    let (_, text) = sluice.http("GET", "/metrics", "");
    let all = series(&text);
    assert_eq!(
        find(
            &text,
            "ratelimit_service_rate_limit_over_limit",
            &[
                ("domain", "default/eg/http"),
                ("key1", &format!("{route}_{route}")),
                ("key2", "rule-0-match-0_rule-0-match-0"),
            ]
        ),
        Some(1.0),
        "{text}"
    );
    let variable = regex::Regex::new(r"\$\{?\w+\}?").unwrap();
    for expr in &exprs {
        for (name, matchers) in selectors(expr) {
            let found = all.iter().any(|(n, labels, _)| {
                *n == name
                    && matchers.iter().all(|(label, op, value)| {
                        // Dashboard variables stand for "All" here.
                        let value = variable.replace_all(value, ".*").into_owned();
                        let have = labels.get(label).map(String::as_str).unwrap_or("");
                        let re = regex::Regex::new(&format!("^(?:{value})$")).unwrap();
                        match op.as_str() {
                            "=" => have == value,
                            "!=" => have != value,
                            "=~" => re.is_match(have),
                            "!~" => !re.is_match(have),
                            other => panic!("operator {other}"),
                        }
                    })
            });
            assert!(
                found,
                "no series for {name} {matchers:?} (in {expr})\n{text}"
            );
        }
    }
}

/// The value of `name: value` in the debug port's `/stats`.
fn stat(sluice: &Sluice, name: &str) -> Option<u64> {
    let (_, stats) = http_request(sluice.debug, "GET", "/stats", "");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
        .map(|v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_pool_stats_follow_the_connections_as_upstreams() {
    let redis = RedisServer::start();
    let dir = config_dir(&format!(
        "domain: app\ndescriptors:\n  - key: k\n    rate_limit: {{{HOUR}, requests_per_unit: 90}}\n"
    ));
    let sluice = Sluice::start(
        dir.path(),
        Some(&redis),
        &[
            ("USE_STATSD", "false"),
            ("REDIS_POOL_SIZE", "3"),
            // Its store has a pool of its own on the same Redis.
            ("LIMITER_API_ENABLED", "false"),
        ],
    );
    let mut c = sluice.client().await;
    let req = || request("app", vec![descriptor(&[("k", "x")])]);
    assert_eq!(ask(&mut c, req()).await.overall_code, 1);
    let pool = |name: &str| stat(&sluice, &format!("ratelimit.redis_pool.{name}"));
    wait_until("cx_active to be the connections Redis sees", || {
        pool("cx_active") == Some(redis.client_ids().len() as u64)
    });
    let first = pool("cx_total").unwrap();
    assert!(first >= 1);
    assert_eq!(pool("cx_local_close"), Some(0));
    assert_eq!(pool("cx_active"), Some(first));

    // Redis drops every connection of Sluice's: each is found broken on its next use, closed,
    // and replaced.
    redis.cli(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    for _ in 0..20 {
        // Those on a killed connection fail.
        let _ = c.should_rate_limit(req()).await;
    }
    wait_until("a connection to be closed and another opened", || {
        pool("cx_local_close") >= Some(1) && pool("cx_total") > Some(first)
    });
    for _ in 0..20 {
        assert_eq!(ask(&mut c, req()).await.overall_code, 1);
    }
    let (total, closed, active) = (
        pool("cx_total").unwrap(),
        pool("cx_local_close").unwrap(),
        pool("cx_active").unwrap(),
    );
    assert_eq!(active, total - closed, "{total} opened, {closed} closed");
    assert!((1..=3).contains(&active), "{active} open, pool of 3");

    let (_, metrics) = sluice.http("GET", "/metrics", "");
    assert!(
        metrics.contains("# TYPE ratelimit_redis_pool_cx_active gauge\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("ratelimit_redis_pool_cx_total {total}\n")),
        "{metrics}"
    );
    // No per-second pool without REDIS_PERSECOND.
    assert_eq!(
        stat(&sluice, "ratelimit.redis_per_second_pool.cx_total"),
        None
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn local_cache_stats_as_upstreams() {
    let dir = config_dir(&format!(
        "domain: app\ndescriptors:\n  - key: k\n    rate_limit: {{{HOUR}, requests_per_unit: 2}}\n"
    ));
    let sluice = Sluice::start(
        dir.path(),
        None,
        &[
            ("USE_STATSD", "false"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "100000"),
        ],
    );
    let mut c = sluice.client().await;
    let codes = [1, 1, 2, 2, 2];
    for code in codes {
        let req = request("app", vec![descriptor(&[("k", "x")])]);
        assert_eq!(ask(&mut c, req).await.overall_code, code);
    }
    // The third request found the counter over its limit and remembered it; the last two were
    // answered from the cache.
    for (name, value) in [
        ("lookupCount", 5),
        ("hitCount", 2),
        ("missCount", 3),
        ("entryCount", 1),
        ("overwriteCount", 0),
        ("evacuateCount", 0),
        ("expiredCount", 0),
    ] {
        let name = format!("ratelimit.localcache.{name}");
        assert_eq!(stat(&sluice, &name), Some(value), "{name}");
    }
    let (_, metrics) = sluice.http("GET", "/metrics", "");
    assert!(
        metrics.contains(
            "# TYPE ratelimit_localcache_hitCount gauge\nratelimit_localcache_hitCount 2\n"
        ),
        "{metrics}"
    );

    // Without the cache, no such stats.
    let (plain, _dir) = one_request(&[("USE_STATSD", "false")]).await;
    assert_eq!(stat(&plain, "ratelimit.localcache.lookupCount"), None);
}

/// `detailed_metric` on `u`: every value of `u` names its own stats.
fn detailed_config() -> tempfile::TempDir {
    config_dir(&format!(
        "domain: app\ndescriptors:\n  - key: u\n    detailed_metric: true\n    rate_limit: {{{HOUR}, requests_per_unit: 100}}\n"
    ))
}

/// Issue #27 item 9: with `detailed_metric`, descriptor values are part of stat names. A
/// newline in a value started a line of the client's making in the statsd stream (metric
/// injection; only `:` and `|` were replaced), and a 70 KB value made a DogStatsD line too long
/// for one datagram, whose send error dropped the rest of that flush. Control characters are now
/// replaced and long parts digested as counter keys are, so every line of the flush arrives.
#[tokio::test(flavor = "multi_thread")]
async fn detailed_values_cannot_inject_or_break_statsd_lines() {
    for dog in [true, false] {
        detailed_values_over_statsd(dog).await;
    }
}

async fn detailed_values_over_statsd(dog: bool) {
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = if dog {
        udp.local_addr().unwrap().port()
    } else {
        tcp.local_addr().unwrap().port()
    }
    .to_string();
    let dir = detailed_config();
    let sinks = if dog {
        [("USE_STATSD", "false"), ("USE_DOG_STATSD", "true")]
    } else {
        [("USE_STATSD", "true"), ("USE_DOG_STATSD", "false")]
    };
    let mut env = vec![
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", port.as_str()),
        ("STATS_FLUSH_INTERVAL", "300ms"),
    ];
    env.extend(sinks);
    let sluice = Sluice::start(dir.path(), None, &env);
    let mut c = sluice.client().await;
    let long = "L".repeat(70_000);
    let values = [
        "a\nratelimit.injected:999|c\n".to_string(),
        "b\r\t\x00\x1b\u{7f}\u{85}c".to_string(),
        long.clone(),
        "after".to_string(),
    ];
    let request_all = request(
        "app",
        values.iter().map(|v| descriptor(&[("u", v)])).collect(),
    );
    ask(&mut c, request_all).await;
    let digest = {
        let d = ring::digest::digest(&ring::digest::SHA256, long.as_bytes());
        d.as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let want = [
        "ratelimit.service.rate_limit.app.u_a_ratelimit.injected_999_c_.total_hits:1|c".to_string(),
        "ratelimit.service.rate_limit.app.u_b______c.total_hits:1|c".to_string(),
        format!("ratelimit.service.rate_limit.app.u_%%{digest}.total_hits:1|c"),
        "ratelimit.service.rate_limit.app.u_after.total_hits:1|c".to_string(),
    ];
    // Lines as a statsd server splits them: at newlines, within datagrams too.
    let seen: Vec<String> = if dog {
        let datagrams = std::iter::from_fn(|| {
            let mut buf = vec![0u8; 65_536];
            let n = udp.recv(&mut buf).ok()?;
            Some(String::from_utf8_lossy(&buf[..n]).into_owned())
        });
        read_until(datagrams, |seen| {
            let lines: Vec<&str> = seen.iter().flat_map(|d| d.split('\n')).collect();
            want.iter().all(|w| lines.contains(&w.as_str()))
        })
        .iter()
        .flat_map(|d| d.split('\n').map(str::to_string).collect::<Vec<_>>())
        .collect()
    } else {
        let (stream, _) = tcp.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let lines = BufReader::new(stream).lines().map_while(Result::ok);
        read_until(lines, |seen| {
            want.iter().all(|w| seen.iter().any(|l| l == w))
        })
    };
    for w in &want {
        assert!(
            seen.contains(w),
            "dog {dog}: {w} not among {} lines: {:?}",
            seen.len(),
            seen.iter()
                .filter(|l| l.contains("rate_limit.app"))
                .map(|l| l.chars().take(120).collect::<String>())
                .collect::<Vec<_>>()
        );
    }
    for line in &seen {
        assert!(
            !line.starts_with("ratelimit.injected") && !line.chars().any(char::is_control),
            "dog {dog}: a line of the client's making: {line:?}"
        );
    }
    drop(sluice);
}

/// Issue #27 item 9: `detailed_metric` makes a stat series per value a client sends, so a
/// client sending fresh values grew memory and `/metrics` without bound (200 000 values: RSS
/// 32 -> 298 MiB, `/metrics` 48 MB). `MAX_DETAILED_METRIC_SERIES` caps the series named after
/// request values; beyond it no new one is made, and each refusal is counted.
#[tokio::test(flavor = "multi_thread")]
async fn detailed_metric_series_are_capped_and_refusals_counted() {
    let dir = detailed_config();
    let sluice = Sluice::start(dir.path(), None, &[("MAX_DETAILED_METRIC_SERIES", "10")]);
    let mut c = sluice.client().await;
    for i in 0..40 {
        let value = format!("v{i}");
        ask(&mut c, request("app", vec![descriptor(&[("u", &value)])])).await;
    }
    // A value makes two series (total_hits, within_limit): the first five fill the ten.
    let (_, stats) = http_request(sluice.debug, "GET", "/stats", "");
    let detailed: Vec<&str> = stats
        .lines()
        .filter(|l| l.starts_with("ratelimit.service.rate_limit.app.u_"))
        .collect();
    assert_eq!(detailed.len(), 10, "{detailed:?}");
    assert_eq!(sluice.metric("sluice_stat_series_refused_total"), 70.0);
    // A value that has its series keeps counting in them.
    ask(&mut c, request("app", vec![descriptor(&[("u", "v0")])])).await;
    assert_eq!(
        stat(&sluice, "ratelimit.service.rate_limit.app.u_v0.total_hits"),
        Some(2)
    );
    // The config's own stats are not capped.
    let (_, metrics) = sluice.http("GET", "/metrics", "");
    assert!(
        metrics.contains("ratelimit_service_config_load_success"),
        "{metrics}"
    );
}
