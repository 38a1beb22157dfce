//! Sluice's own Redis connection (`src/store/redis/wire.rs`) against a real `redis-server`:
//! calls on a connection that dies are failed, never sent again; a caller abandoned at its
//! deadline leaves later replies with their own callers; the database in the URL is selected;
//! an ACL user and a unix socket work; a connection that stops answering is replaced.
//! TLS with an ACL user, `REDIS_AUTH_FILE` and `NOSCRIPT` recovery are covered in
//! `tests/it/redis_store.rs`, redirects in `tests/it/redis_cluster.rs`.

use sluice_test_kit as kit;

use std::time::Duration;

use kit::*;
use sluice::proto::Code;

const CONFIG: &str = "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// The one counter key of `user`'s minute window, if it exists.
fn counter(redis: &RedisServer, db: u32, user: &str) -> Option<String> {
    let db = db.to_string();
    let keys = redis.cli(&["-n", &db, "KEYS", &format!("*user_{user}*")])?;
    let key = keys.lines().next().filter(|k| !k.is_empty())?.to_string();
    Some(redis.cli(&["-n", &db, "GET", &key])?.trim().to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_on_a_killed_connection_fail_and_are_not_sent_again() {
    let redis = RedisServer::start();
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), Some(&redis), &[("REDIS_TIMEOUT", "5s")]);
    let mut c = sluice.client().await;
    avoid_window_edge(60, 10).await;
    let bob = || request("app", vec![descriptor(&[("user", "bob")])]);
    // A connection exists and the script is loaded.
    assert_eq!(ask(&mut c, bob()).await.statuses[0].limit_remaining, 4);

    // Redis holds the script calls unanswered (they write), so they are on the wire when the
    // connection is killed; Redis drops them without running them.
    assert_eq!(
        redis
            .cli(&["CLIENT", "PAUSE", "10000", "WRITE"])
            .unwrap()
            .trim(),
        "OK"
    );
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let mut c = c.clone();
            tokio::spawn(async move { c.should_rate_limit(alice()).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = redis
        .cli(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
        .unwrap();
    assert!(killed.trim().parse::<u32>().unwrap() >= 1, "{killed}");
    // Anything sent again from here would run once Redis resumes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(redis.cli(&["CLIENT", "UNPAUSE"]).unwrap().trim(), "OK");
    for call in calls {
        let status = call.await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        counter(&redis, 0, "alice"),
        None,
        "a lost call was sent again"
    );

    // Later calls go out on a new connection, each counted once.
    let r = ask(&mut c, alice()).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 4);
    assert_eq!(counter(&redis, 0, "alice").as_deref(), Some("1"));
    assert_eq!(ask(&mut c, bob()).await.statuses[0].limit_remaining, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_caller_abandoned_at_its_deadline_leaves_later_replies_in_step() {
    let redis = RedisServer::start();
    let dir = config_dir(CONFIG);
    // One connection, so the abandoned call and the next share it.
    let sluice = Sluice::start(
        dir.path(),
        Some(&redis),
        &[("REDIS_TIMEOUT", "500ms"), ("REDIS_POOL_SIZE", "1")],
    );
    let mut c = sluice.client().await;
    avoid_window_edge(60, 10).await;
    let bob = || request("app", vec![descriptor(&[("user", "bob")])]);
    // Distinct counts, so a reply handed to the wrong caller shows.
    for left in [4, 3, 2] {
        assert_eq!(ask(&mut c, bob()).await.statuses[0].limit_remaining, left);
    }

    assert_eq!(
        redis
            .cli(&["CLIENT", "PAUSE", "700", "WRITE"])
            .unwrap()
            .trim(),
        "OK"
    );
    // Alice's call is written, then abandoned at 500 ms with its reply still owed.
    let status = c.should_rate_limit(alice()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    // Bob's call follows on the same connection; Redis resumes at 700 ms and answers Alice's
    // call first, then Bob's.
    let r = ask(&mut c, bob()).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "bob got someone else's reply"
    );
    // Alice's abandoned call did run (it was counted); her next reply is her own.
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 3);
    assert_eq!(ask(&mut c, bob()).await.statuses[0].limit_remaining, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_database_in_the_url_is_selected() {
    let redis = RedisServer::start();
    let dir = config_dir(CONFIG);
    let url = format!("redis://127.0.0.1:{}/3", redis.port);
    let sluice = Sluice::start(dir.path(), Some(&redis), &[("REDIS_URL", &url)]);
    let mut c = sluice.client().await;
    avoid_window_edge(60, 5).await;
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 4);
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 3);
    assert_eq!(counter(&redis, 3, "alice").as_deref(), Some("2"));
    assert_eq!(redis.cli(&["-n", "0", "DBSIZE"]).unwrap().trim(), "0");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acl_user_authenticates_on_plain_tcp() {
    let args: Vec<String> = [
        "--user", "default", "off", "--user", "limiter", "on", ">pw-9", "~*", "&*", "+@all",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let cli: Vec<String> = ["--user", "limiter", "--pass", "pw-9", "--no-auth-warning"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let redis = RedisServer::start_with(&args, &cli);
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), Some(&redis), &[("REDIS_AUTH", "limiter:pw-9")]);
    let mut c = sluice.client().await;
    avoid_window_edge(60, 5).await;
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 4);
    let clients = redis.cli(&["CLIENT", "LIST"]).unwrap();
    assert!(
        clients
            .lines()
            .any(|l| l.contains("user=limiter") && decided_last(l)),
        "{clients}"
    );
}

/// A user that may not run `INFO` (ACL's `@dangerous`, which managed Redis services often deny)
/// still gets decisions: Sluice cannot learn the server's version, so it decides with the lean
/// script, which works on every version, instead of plain commands.
#[tokio::test(flavor = "multi_thread")]
async fn a_user_denied_info_is_decided_by_the_lean_script() {
    let args: Vec<String> = [
        "--user",
        "default",
        "off",
        "--user",
        "limiter",
        "on",
        ">pw-9",
        "~*",
        "&*",
        "+@all",
        "-@dangerous",
        "--user",
        "admin",
        "on",
        ">pw-a",
        "~*",
        "&*",
        "+@all",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let cli: Vec<String> = ["--user", "admin", "--pass", "pw-a", "--no-auth-warning"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let redis = RedisServer::start_with(&args, &cli);
    let dry_run = redis
        .cli(&["ACL", "DRYRUN", "limiter", "INFO", "server"])
        .unwrap();
    assert!(dry_run.contains("no permissions"), "{dry_run}");
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(dir.path(), Some(&redis), &[("REDIS_AUTH", "limiter:pw-9")]);
    let mut c = sluice.client().await;
    avoid_window_edge(60, 5).await;
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 4);
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 3);
    // The lean script expires the new counter once (Redis counts a script's commands too);
    // plain commands would have sent a `PEXPIRE .. NX` with each decision.
    let stats = redis.cli(&["INFO", "commandstats"]).unwrap();
    assert!(
        stats.contains("cmdstat_incrby:calls=2,") && stats.contains("cmdstat_pexpire:calls=1,"),
        "{stats}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_stops_answering_is_replaced() {
    let redis = RedisServer::start();
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(
        dir.path(),
        Some(&redis),
        &[("REDIS_TIMEOUT", "300ms"), ("REDIS_POOL_SIZE", "1")],
    );
    let mut c = sluice.client().await;
    avoid_window_edge(60, 10).await;
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 4);
    // The decisions' connection, and the named limiters' store's own.
    let before = redis.client_ids();

    // Redis stops answering (as a lost peer would) with a reply owed on the connection.
    assert_eq!(
        redis
            .cli(&["CLIENT", "PAUSE", "3000", "WRITE"])
            .unwrap()
            .trim(),
        "OK"
    );
    assert!(c.should_rate_limit(alice()).await.is_err());
    // Past the stall limit, the next call does not queue behind it: a new connection is opened.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(c.should_rate_limit(alice()).await.is_err());
    let after = redis.client_ids();
    assert!(
        after.iter().any(|id| !before.contains(id)),
        "no new connection: {before:?} -> {after:?}"
    );
    assert_eq!(redis.cli(&["CLIENT", "UNPAUSE"]).unwrap().trim(), "OK");
    let r = ask(&mut c, alice()).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_unix_socket_is_used_as_upstream_names_it() {
    let sockets = tempfile::tempdir().unwrap();
    let socket = sockets.path().join("redis.sock");
    let socket = socket.to_str().unwrap();
    let args = ["--unixsocket", socket, "--unixsocketperm", "700"].map(String::from);
    let redis = RedisServer::start_with(&args, &[]);
    let dir = config_dir(CONFIG);
    let sluice = Sluice::start(
        dir.path(),
        Some(&redis),
        &[("REDIS_SOCKET_TYPE", "unix"), ("REDIS_URL", socket)],
    );
    let mut c = sluice.client().await;
    avoid_window_edge(60, 5).await;
    assert_eq!(ask(&mut c, alice()).await.statuses[0].limit_remaining, 4);
    assert_eq!(counter(&redis, 0, "alice").as_deref(), Some("1"));
    let clients = redis.cli(&["CLIENT", "LIST"]).unwrap();
    assert!(
        clients
            .lines()
            .any(|l| l.contains("flags=U") && decided_last(l)),
        "{clients}"
    );
}

/// Whether a `CLIENT LIST` line's last command was a decision's: `PEXPIRE` (the plain path's last
/// command on Redis 7) or `EVALSHA` (the scripts).
fn decided_last(client: &str) -> bool {
    client.contains("cmd=pexpire") || client.contains("cmd=evalsha")
}
