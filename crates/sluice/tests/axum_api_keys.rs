//! The example service (`examples/axum_api_keys.rs`) served on a real socket, on each store:
//! a key gets exactly its budget and then 429 with `Retry-After`, another key has a budget of
//! its own, and a key that fails authentication is refused 401 and never counted.

#![cfg(feature = "redis")]

mod common;

#[allow(dead_code)] // its `main` is the example's, not the test's
#[path = "../examples/axum_api_keys.rs"]
mod example;

use std::net::SocketAddr;

use sluice::{Limiter, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::STORES;

/// What the test reads of an answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<u64>,
}

/// `GET /hello` with `key` as `x-api-key` (none when `None`), over HTTP/1.1 on a connection of
/// its own.
async fn get(addr: SocketAddr, key: Option<&str>) -> Answer {
    let mut stream = TcpStream::connect(addr)
        .await
        .expect("connect to the service");
    let key_header = key.map_or(String::new(), |k| format!("x-api-key: {k}\r\n"));
    let request =
        format!("GET /hello HTTP/1.1\r\nhost: test\r\n{key_header}connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut reply = String::new();
    stream
        .read_to_string(&mut reply)
        .await
        .expect("read the answer");
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {reply:?}"));
    let retry_after = reply
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("retry-after:")
                .map(str::to_string)
        })
        .map(|v| v.trim().parse().expect("Retry-After in seconds"));
    Answer {
        status,
        retry_after,
    }
}

/// The example's router on `limiter`, served on a free port.
async fn serve(limiter: Limiter) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, example::router(limiter)).await });
    addr
}

/// The statuses of `n` requests in a row with `key`.
async fn statuses(addr: SocketAddr, key: Option<&str>, n: usize) -> Vec<u16> {
    let mut all = Vec::new();
    for _ in 0..n {
        all.push(get(addr, key).await.status);
    }
    all
}

#[tokio::test]
async fn each_key_gets_three_a_minute_and_unknown_keys_are_refused_uncounted() {
    for store in STORES {
        let limits = Limits::from_yaml(example::LIMITS).unwrap();
        let (limiter, _redis) = common::limiter(store, limits).await;
        let addr = serve(limiter.clone()).await;

        assert_eq!(
            statuses(addr, Some("key-alice"), 3).await,
            [200; 3],
            "{store:?}"
        );
        let refused = get(addr, Some("key-alice")).await;
        assert_eq!(refused.status, 429, "{store:?}");
        // A sliding log of one minute: the oldest of the three leaves it within 60 s.
        let wait = refused.retry_after.expect("Retry-After on a 429");
        assert!((1..=60).contains(&wait), "{store:?}: Retry-After {wait}");

        assert_eq!(
            statuses(addr, Some("key-bob"), 4).await,
            [200, 200, 200, 429],
            "{store:?}"
        );

        // Unknown keys and no key: refused before the limiter, however many times.
        assert_eq!(
            statuses(addr, Some("key-mallory"), 5).await,
            [401; 5],
            "{store:?}"
        );
        assert_eq!(statuses(addr, None, 2).await, [401; 2], "{store:?}");
        let untouched = limiter
            .check("api", &[("api_key", "key-mallory")], 0)
            .await
            .unwrap();
        assert_eq!(
            untouched.remaining,
            Some(3),
            "{store:?}: an unknown key was counted"
        );
        // And the refusals did not reach the known keys' budgets either.
        assert_eq!(get(addr, Some("key-alice")).await.status, 429, "{store:?}");
    }
}

#[tokio::test]
async fn the_example_counts_in_redis_given_its_url() {
    let redis = common::Redis::start();
    let limiter = example::limiter(Some(redis.url()))
        .await
        .expect("a limiter on redis");
    let addr = serve(limiter).await;
    assert_eq!(
        statuses(addr, Some("key-alice"), 4).await,
        [200, 200, 200, 429]
    );
    // Counted in Redis: a second limiter on the same server sees the key's budget spent.
    let other = Limiter::redis(Limits::from_yaml(example::LIMITS).unwrap(), redis.options())
        .await
        .unwrap();
    let seen = other
        .check("api", &[("api_key", "key-alice")], 0)
        .await
        .unwrap();
    assert_eq!((seen.allowed, seen.remaining), (false, Some(0)));
}
