//! Issue #27 item 1, "one non-UTF-8 byte turns a decision into an error, so Envoy fails open",
//! and the two answers of item 9 that also let a request through or mislead a caller: a request
//! over the gRPC size limit, and `/json` before any configuration has loaded.
//!
//! Envoy 1.40 accepts obs-text bytes (0x80–0xFF) in HTTP/1 header values and copies them
//! unchanged into a `request_headers` descriptor. The RLS fields are proto3 `string`s, so a
//! `String`-typed decoder refuses the whole message, tonic answers `INTERNAL`, and Envoy, failing
//! open as shipped, lets the request through. Sluice decodes those fields as bytes (`build.rs`)
//! and judges them like any other value. These tests send the byte through a real Envoy (raw
//! TCP: HTTP client libraries refuse such a header) and straight over gRPC, on both stores.
//!
//! Issue #40: what does not decode at all (bytes that are not protobuf, or a native-API `name` or
//! `client_id` that is not UTF-8) is the caller's error, `INVALID_ARGUMENT`, on both APIs; it was
//! `INTERNAL`, which says "server bug, retry".

use sluice_test_kit as kit;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kit::envoy::{Envoy, RatelimitStats, StatusCounts, Upstream};
use kit::{Sluice, avoid_window_edge, config_dir, for_each_store};
use prost::Message;
use sluice::proto::{Code, DescriptorEntry, RateLimitDescriptor, RateLimitRequest};

/// The shipped Envoy sends `[remote_address=<peer>]` and, with an `x-user-id` header,
/// `[user=<x-user-id>]` on `/`. Only the user is limited here: 5 an hour, for any value.
const USER_LIMITS: &str = "\
domain: example
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 5 }
";

/// One GET through Envoy with `x-user-id` set to `user` as raw bytes; returns the status (0 when
/// Envoy closed without an answer).
fn get_as_user(envoy: SocketAddr, user: &[u8]) -> u16 {
    let mut stream = TcpStream::connect(envoy).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut head = b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\nx-user-id: ".to_vec();
    head.extend_from_slice(user);
    head.extend_from_slice(b"\r\n\r\n");
    stream.write_all(&head).unwrap();
    kit::envoy::reply_status(&mut stream)
}

fn statuses(envoy: &Envoy, user: &[u8], n: usize) -> StatusCounts {
    let mut counts = StatusCounts::default();
    for _ in 0..n {
        *counts
            .0
            .entry(get_as_user(envoy.listener, user))
            .or_default() += 1;
    }
    counts
}

/// `x-user-id: userC\xff` on a 5-an-hour limit: exactly 5 admitted, then 429, and Envoy saw no
/// error. Before bytes: 7 of 7 admitted, `ratelimit.error` 7. The same user without the byte
/// has a counter of its own (the byte is part of the value, not dropped).
#[tokio::test]
async fn obs_text_byte_in_a_header_is_limited_through_envoy() {
    for_each_store(|store, redis| async move {
        let config = config_dir(USER_LIMITS);
        let sluice = Sluice::start(config.path(), redis.as_ref(), &[]);
        let app = Upstream::start();
        let envoy = Envoy::start(sluice.grpc, app.addr, &[]);
        // The 8 requests take well under a second; 30 s of margin keeps them in one hour.
        avoid_window_edge(3600, 30).await;

        let counts = statuses(&envoy, b"userC\xff", 7);
        assert_eq!(
            counts,
            StatusCounts([(200, 5), (429, 2)].into()),
            "{store:?}: x-user-id: userC\\xff on 5/hour; Envoy's log:\n{}",
            envoy.log()
        );
        assert_eq!(
            envoy.ratelimit_stats(),
            RatelimitStats {
                ok: 5,
                over_limit: 2,
                error: 0,
                failure_mode_allowed: 0,
            },
            "{store:?}: Envoy's ratelimit stats"
        );
        assert_eq!(
            get_as_user(envoy.listener, b"userC"),
            200,
            "{store:?}: userC without the byte counts on its own"
        );
        if let Some(redis) = &redis {
            let keys = redis.cli(&["--raw", "KEYS", "*"]).unwrap_or_default();
            assert!(
                keys.lines()
                    .any(|k| k.starts_with("example_user_userC%FF_")),
                "{store:?}: the byte is %FF in the counter key: {keys}"
            );
        }
    })
    .await;
}

/// What a request with raw bytes gets over gRPC, limits of 2 an hour.
const BYTE_LIMITS: &str = "\
domain: d
descriptors:
  - key: k
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: w
    value: \"user*\"
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: e
    value: \"caf\u{e9}\"
    rate_limit: { unit: hour, requests_per_unit: 2 }
";

fn raw_request(domain: &[u8], key: &[u8], value: &[u8]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_vec(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![DescriptorEntry {
                key: key.to_vec(),
                value: value.to_vec(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// Raw bytes over gRPC, on both stores: never an error. A value that is not UTF-8 is counted
/// under the key-only default and a wildcard (by bytes) with a counter of its own; it cannot
/// equal a config value (`caf\xe9`, Latin-1, is not the configured `café`); a domain that is not
/// UTF-8 is an unknown domain (OK, no limit); a key that is not UTF-8 matches nothing.
#[tokio::test]
async fn raw_bytes_over_grpc_are_judged_never_refused() {
    for_each_store(|store, redis| async move {
        let config = config_dir(BYTE_LIMITS);
        let sluice = Sluice::start(config.path(), redis.as_ref(), &[]);
        let client = sluice.client().await;
        avoid_window_edge(3600, 30).await;
        let codes = |request: RateLimitRequest, n: usize| {
            let mut client = client.clone();
            async move {
                let mut codes = Vec::new();
                for _ in 0..n {
                    let reply = client.should_rate_limit(request.clone()).await;
                    let reply = reply.unwrap_or_else(|status| {
                        panic!("{store:?}: {request:?} got an error: {status:?}")
                    });
                    codes.push(Code::try_from(reply.into_inner().overall_code).unwrap());
                }
                codes
            }
        };
        use Code::{Ok as O, OverLimit as X};
        // The key-only default, per value: `v\xff`, `v\xfe` and the text `v%FF` apart.
        assert_eq!(codes(raw_request(b"d", b"k", b"v\xff"), 3).await, [O, O, X]);
        assert_eq!(codes(raw_request(b"d", b"k", b"v\xfe"), 1).await, [O]);
        assert_eq!(codes(raw_request(b"d", b"k", b"v%FF"), 1).await, [O]);
        // A lone continuation byte, a truncated sequence, a surrogate's encoding.
        for value in [&b"\x80"[..], b"\xe2\x82", b"\xed\xa0\x80"] {
            assert_eq!(codes(raw_request(b"d", b"k", value), 3).await, [O, O, X]);
        }
        // A wildcard matches by bytes.
        assert_eq!(
            codes(raw_request(b"d", b"w", b"user\xff"), 3).await,
            [O, O, X]
        );
        // Not the configured `café`: no limit at all (no default under `e`).
        assert_eq!(
            codes(raw_request(b"d", b"e", b"caf\xe9"), 3).await,
            [O, O, O]
        );
        assert_eq!(
            codes(raw_request(b"d", b"e", "caf\u{e9}".as_bytes()), 3).await,
            [O, O, X]
        );
        // A domain or key that is not UTF-8 names nothing in the config.
        assert_eq!(codes(raw_request(b"d\xff", b"k", b"v"), 3).await, [O, O, O]);
        assert_eq!(codes(raw_request(b"d", b"k\xff", b"v"), 3).await, [O, O, O]);
        if let Some(redis) = &redis {
            let keys = redis.cli(&["--raw", "KEYS", "*"]).unwrap_or_default();
            for prefix in ["d_k_v%FF_", "d_k_v%FE_", "d_k_v%25FF_", "d_w_user%FF_"] {
                assert!(
                    keys.lines().any(|k| k.starts_with(prefix)),
                    "{store:?}: no key {prefix}…: {keys}"
                );
            }
        }
        drop(client);
    })
    .await;
}

/// `/json` before any configuration has loaded answers 400 with the reason, as upstream answers
/// every error of the service (it was 500, which the README keeps for a store that could not
/// decide).
#[test]
fn json_answers_400_before_any_configuration() {
    let config = config_dir("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: weird}\n");
    let sluice = Sluice::start(
        config.path(),
        None,
        &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")],
    );
    let (status, body) = sluice.http(
        "POST",
        "/json",
        r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#,
    );
    assert_eq!(
        (status, body.as_str()),
        (400, "no rate limit configuration loaded")
    );
}

/// `/json` takes JSON strings for the fields that are bytes inside (transcoded through the wire
/// format): the answer is the same as over gRPC.
#[test]
fn json_takes_strings_for_byte_fields() {
    let config = config_dir(BYTE_LIMITS);
    let sluice = Sluice::start(config.path(), None, &[]);
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"e","value":"caf\u00e9"}]}]}"#;
    let statuses: Vec<u16> = (0..3)
        .map(|_| sluice.http("POST", "/json", body).0)
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
}

/// A route that copies `x-big` into 20 descriptors (`big0` … `big19`): a 55 KB header, within
/// Envoy's 60 KiB default, makes a call of about 1.1 MB, over Sluice's 1 MiB.
fn envoy_with_twenty_copies(sluice: SocketAddr, app: SocketAddr) -> Envoy {
    let user_action = concat!(
        "                              - actions:\n",
        "                                  - request_headers:\n",
        "                                      header_name: x-user-id\n",
        "                                      descriptor_key: user\n",
    );
    let make = move |listener, admin| {
        let yaml = kit::envoy::shipped_config(listener, admin, sluice, app);
        // The last occurrence is the `/` route's.
        let at = yaml
            .rfind(user_action)
            .expect("the shipped `/` route has a user action");
        let copies: String = (0..20)
            .map(|i| {
                user_action
                    .replace("x-user-id", "x-big")
                    .replace("user\n", &format!("big{i}\n"))
            })
            .collect();
        format!("{}{copies}{}", &yaml[..at], &yaml[at + user_action.len()..])
    };
    Envoy::start_bootstrap(make, "sluice", sluice, app)
}

/// Issue #27 item 9: a call over the 1 MiB message limit was refused (`OUT_OF_RANGE`) and
/// Envoy failed open. It is answered `OVER_LIMIT` (429 through Envoy, no error), uncounted;
/// a large call within the limit is decoded and judged as before.
#[tokio::test]
async fn request_over_the_size_limit_is_refused_not_an_error() {
    let config = config_dir(
        "domain: example\ndescriptors:\n  - key: big0\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n",
    );
    let sluice = Sluice::start(config.path(), None, &[]);
    let app = Upstream::start();
    let envoy = envoy_with_twenty_copies(sluice.grpc, app.addr);
    avoid_window_edge(3600, 30).await;
    let get = |size: usize| {
        let value = "a".repeat(size);
        kit::envoy::http_status(envoy.listener, "/", &[("x-big", value.as_str())])
    };
    // 20 × 20 KB: 400 KB, decoded and judged (big0: 1 an hour).
    assert_eq!(
        (get(20_000), get(20_000)),
        (200, 429),
        "within the size limit"
    );
    // 20 × 55 KB: 1.1 MB. A new value, so it would be admitted if it were judged or failed.
    assert_eq!(
        get(55_000),
        429,
        "over the size limit; Envoy's log:\n{}",
        envoy.log()
    );
    assert_eq!(
        envoy.ratelimit_stats(),
        RatelimitStats {
            ok: 1,
            over_limit: 2,
            error: 0,
            failure_mode_allowed: 0,
        }
    );
    assert_eq!(
        sluice.metric("sluice_descriptors_refused_total{reason=\"request_too_large\"}"),
        1.0
    );

    // Straight over gRPC: OVER_LIMIT with no statuses, never an error.
    let mut client = sluice
        .client()
        .await
        .max_encoding_message_size(4 << 20)
        .max_decoding_message_size(4 << 20);
    let huge = raw_request(b"example", b"big1", &vec![b'x'; 2 << 20]);
    let reply = client.should_rate_limit(huge).await.unwrap().into_inner();
    assert_eq!(
        (
            Code::try_from(reply.overall_code).unwrap(),
            reply.statuses.len()
        ),
        (Code::OverLimit, 0)
    );
    // The connection still serves ordinary calls.
    let reply = client
        .should_rate_limit(raw_request(b"example", b"big1", b"v"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(Code::try_from(reply.overall_code).unwrap(), Code::Ok);
}

/// A codec that sends and receives bytes as they are, so a test can send what no generated client
/// would.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(buf);
        Ok(Some(bytes::Buf::copy_to_bytes(buf, n).to_vec()))
    }
}

/// Calls `method` with `message` as the request's bytes; the status of the answer (OK when
/// there is a message).
async fn raw_call(addr: SocketAddr, method: &str, message: &[u8]) -> tonic::Status {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path: http::uri::PathAndQuery = method.parse().unwrap();
    match grpc
        .unary(tonic::Request::new(message.to_vec()), path, RawCodec)
        .await
    {
        Ok(_) => tonic::Status::ok(""),
        Err(status) => status,
    }
}

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// One field of a message on the wire: `field` (length-delimited) holding `bytes`.
fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![number << 3 | 2, u8::try_from(bytes.len()).unwrap()];
    out.extend(bytes);
    out
}

/// Issue #40: a request that does not decode is `INVALID_ARGUMENT` naming the message, field and
/// reason, on both APIs (it was `INTERNAL`); RLS still judges bytes that are not UTF-8, and
/// `/json` still answers 400 for a body that does not parse.
#[tokio::test]
async fn undecodable_requests_are_invalid_argument_on_both_apis() {
    let config = config_dir(BYTE_LIMITS);
    let sluice = Sluice::start(config.path(), None, &[]);
    let addr = sluice.grpc;
    let invalid = |status: tonic::Status, says: &[&str]| {
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        for part in says {
            assert!(status.message().contains(part), "{part}: {status:?}");
        }
    };

    // RLS: bytes that are not protobuf (a field 15 of wire type 7, which does not exist), and a
    // length past the end of the message.
    for garbage in [&[0xff, 0xff, 0xff][..], &[0x0a, 0x7f, b'd']] {
        let status = raw_call(addr, SHOULD_RATE_LIMIT, garbage).await;
        invalid(status, &["failed to decode Protobuf message"]);
    }
    // A domain, key or value that is not UTF-8 still decodes and is judged (OK).
    let judged = raw_request(b"d", b"k", b"v\xff").encode_to_vec();
    let status = raw_call(addr, SHOULD_RATE_LIMIT, &judged).await;
    assert_eq!(status.code(), tonic::Code::Ok, "{status:?}");

    // The native API: `name` (and `client_id`) not UTF-8 in each request that has them.
    let not_utf8 = b"api\xff";
    let limiter = |method: &str| format!("/sluice.v1.Limiter/{method}");
    let cases: [(&str, Vec<u8>, &str); 8] = [
        ("TryAcquire", field(1, not_utf8), "TryAcquireRequest.name"),
        (
            "TryAcquire",
            [field(1, b"api"), field(4, not_utf8)].concat(),
            "TryAcquireRequest.client_id",
        ),
        ("Acquire", field(1, not_utf8), "AcquireRequest.name"),
        (
            "Acquire",
            [field(1, b"api"), field(3, not_utf8)].concat(),
            "AcquireRequest.client_id",
        ),
        (
            "AvailablePermits",
            [field(1, b"api"), field(2, not_utf8)].concat(),
            "AvailablePermitsRequest.client_id",
        ),
        ("GetConfig", field(1, not_utf8), "GetConfigRequest.name"),
        ("Delete", field(1, not_utf8), "DeleteRequest.name"),
        (
            "SetRate",
            field(1, &field(1, not_utf8)),
            "LimiterConfig.name",
        ),
    ];
    for (method, message, names) in cases {
        let status = raw_call(addr, &limiter(method), &message).await;
        invalid(status, &[names, "not UTF-8"]);
    }
    // Bytes that are not protobuf.
    let status = raw_call(addr, &limiter("TryAcquire"), &[0xff, 0xff, 0xff]).await;
    invalid(status, &["failed to decode Protobuf message"]);
    // The same call well formed reaches the limiters: no such limiter.
    let status = raw_call(addr, &limiter("TryAcquire"), &field(1, b"api")).await;
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");

    // `/json` answers 400 for a body that does not parse, or a field of the wrong type.
    assert_eq!(sluice.http("POST", "/json", "\u{1}not json").0, 400);
    assert_eq!(sluice.http("POST", "/json", r#"{"domain":7}"#).0, 400);
}
