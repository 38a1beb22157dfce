//! The native limiter API (`sluice.v1.Limiter`) from the tests' side: a Sluice serving it, a
//! client, a limiter's config, setting it and taking permits, in the few shapes every test of
//! that API builds its calls from.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice::proto::sluice::v1::limiter_client::LimiterClient;
use sluice::proto::sluice::v1::{
    Algorithm, AvailablePermitsRequest, LimiterConfig, Mode, SetMode, SetRateRequest,
    SetRateResponse, TryAcquireRequest,
};
use tonic::transport::Channel;

use crate::{RedisServer, Sluice, config_dir};

/// A client of the native API served at `addr` (Sluice's gRPC address, or the API's own port).
pub async fn limiter_client(addr: SocketAddr) -> LimiterClient<Channel> {
    LimiterClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// A Sluice for the native API alone: its RLS config a domain without limits, the store of
/// `redis` (None: memory), `env` added. The config's folder lives as long as the process.
pub struct LimiterSluice {
    pub sluice: Sluice,
    _config: tempfile::TempDir,
}

impl LimiterSluice {
    pub fn start(redis: Option<&RedisServer>, env: &[(&str, &str)]) -> LimiterSluice {
        let config = config_dir("domain: unused\n");
        LimiterSluice {
            sluice: Sluice::start(config.path(), redis, env),
            _config: config,
        }
    }

    /// A client of its native API.
    pub async fn client(&self) -> LimiterClient<Channel> {
        limiter_client(self.sluice.grpc).await
    }
}

/// A limiter `name` granting `rate` permits per `interval` with `algorithm`, every other field
/// at its default (one budget for all clients).
pub fn config(name: &str, algorithm: Algorithm, rate: u64, interval: Duration) -> LimiterConfig {
    LimiterConfig {
        name: name.into(),
        algorithm: algorithm as i32,
        rate,
        interval: Some(interval.try_into().unwrap()),
        ..Default::default()
    }
}

/// `config` with a budget per client id.
pub fn per_client(mut config: LimiterConfig) -> LimiterConfig {
    config.mode = Mode::PerClient as i32;
    config
}

/// The request that sets `config` with `mode`.
pub fn set_request(config: LimiterConfig, mode: SetMode) -> SetRateRequest {
    SetRateRequest {
        config: Some(config),
        set_mode: mode as i32,
    }
}

/// Sets `config` with `mode`; the answer, or the call's error status.
pub async fn set(
    c: &mut LimiterClient<Channel>,
    config: LimiterConfig,
    mode: SetMode,
) -> Result<SetRateResponse, tonic::Status> {
    Ok(c.set_rate(set_request(config, mode)).await?.into_inner())
}

/// A `try_acquire` of `permits` from limiter `name` for `client` (empty: the shared budget),
/// waiting at most `timeout` (`None`: the server's default).
pub fn take(
    name: &str,
    client: &str,
    permits: u64,
    timeout: impl Into<Option<Duration>>,
) -> TryAcquireRequest {
    TryAcquireRequest {
        name: name.into(),
        permits,
        timeout: timeout.into().map(|t| t.try_into().unwrap()),
        client_id: client.into(),
    }
}

/// Whether `permits` from `name` for `client` are granted at once (no waiting).
pub async fn acquired(
    c: &mut LimiterClient<Channel>,
    name: &str,
    client: &str,
    permits: u64,
) -> bool {
    c.try_acquire(take(name, client, permits, Duration::ZERO))
        .await
        .unwrap()
        .into_inner()
        .acquired
}

/// The permits `name` has left for `client`.
pub async fn available(c: &mut LimiterClient<Channel>, name: &str, client: &str) -> u64 {
    c.available_permits(AvailablePermitsRequest {
        name: name.into(),
        client_id: client.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .permits
}

/// Sends `requests` in order, each on `c`'s channel (behind the earlier ones) before the next
/// is made, `gap` apart, and waits for every answer: per request its index, whether it was
/// granted, and when the answer came. For the tests of the waiting line, whose order must be
/// the arrival order: a task scheduled late must not overtake another on the client side.
pub async fn acquire_in_order(
    c: &LimiterClient<Channel>,
    requests: Vec<TryAcquireRequest>,
    gap: Duration,
) -> Vec<(usize, bool, Instant)> {
    let mut waiters = Vec::new();
    for (i, request) in requests.into_iter().enumerate() {
        let mut c = c.clone();
        let (queued, on_the_way) = tokio::sync::oneshot::channel();
        waiters.push(tokio::spawn(async move {
            let mut call = std::pin::pin!(c.try_acquire(request));
            // The first poll puts the request on the channel's queue, behind the earlier ones.
            if let std::task::Poll::Ready(r) = futures::poll!(call.as_mut()) {
                panic!("answered before waiting: {r:?}");
            }
            queued.send(()).unwrap();
            let r = call.await.unwrap().into_inner();
            (i, r.acquired, Instant::now())
        }));
        on_the_way.await.unwrap();
        tokio::time::sleep(gap).await;
    }
    let mut done = Vec::new();
    for w in waiters {
        done.push(w.await.unwrap());
    }
    done
}
