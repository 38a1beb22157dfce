//! The connection to Sluice and what every call shares: one channel, the deadline each call
//! carries, and the failure policy (the error a call can end in is `error.rs`'s).
//!
//! A [`Client`] is a handle: cloning it clones a tonic [`Channel`], which multiplexes every call
//! of every clone over the same HTTP/2 connection. Build one per Sluice address at start-up and
//! hand out clones, rather than connecting per call.

use std::future::Future;
use std::time::{Duration, Instant};

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::error::Error;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use crate::proto::sluice::v1::limiter_client::LimiterClient;

/// The deadline a call gets when the builder sets none: long enough for a Redis round trip on a
/// busy network, short enough that a request held up by an unreachable Sluice is not held long.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(500);

/// What a decision is when Sluice cannot give one.
///
/// "Cannot give one" means the call failed for a reason that says nothing about the limit
/// ([`Error::is_unanswered`]): no connection (Sluice down, refused, reset), `UNAVAILABLE`
/// (Sluice's store is down or its circuit breaker is open), the deadline passed (on this side,
/// or Sluice's `CANCELLED` / `DEADLINE_EXCEEDED` for the call's `grpc-timeout`), `INTERNAL`,
/// `UNKNOWN` or `DATA_LOSS`. Answers that are about the request itself (`INVALID_ARGUMENT`,
/// `NOT_FOUND`, `UNAUTHENTICATED`, `RESOURCE_EXHAUSTED` from the native API, the native API's
/// "would wait too long") are never covered by the policy: they come back as errors whatever
/// it is.
///
/// The policy applies to decisions only ([`Client::should_rate_limit`],
/// [`Client::try_acquire`], [`Client::acquire`]); `set_rate`, `available_permits` and
/// `delete` have no decision to stand in for and always return the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Admit: the call returns an allowed decision (or acquired permits) marked
    /// [`AnsweredBy::FailurePolicy`]. Limits stop holding while Sluice is unreachable, and the
    /// service stays up. This is Envoy's default (`failure_mode_deny: false`) and this crate's.
    #[default]
    Open,
    /// Refuse: the call returns the error ([`Error::is_unanswered`] is true), and
    /// [`crate::SluiceLayer`] answers `503 Service Unavailable` (`UNAVAILABLE` to gRPC
    /// callers). Limits hold, and the service is down while Sluice is.
    Closed,
}

/// Who gave a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AnsweredBy {
    /// Sluice decided.
    Sluice,
    /// Sluice could not be asked; [`FailurePolicy::Open`] admitted. The message is the failure's.
    FailurePolicy(String),
}

/// Sets up a [`Client`]: deadline, failure policy, bearer token.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    deadline: Duration,
    policy: FailurePolicy,
    token: Option<AsciiMetadataValue>,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        Self {
            deadline: DEFAULT_DEADLINE,
            policy: FailurePolicy::default(),
            token: None,
        }
    }
}

impl ClientBuilder {
    /// How long each call may take, unless the call says otherwise ([`Client::acquire`],
    /// [`Client::try_acquire`]). It is sent as `grpc-timeout`, so Sluice bounds its store calls
    /// by it, and enforced here too, so a Sluice that hangs cannot hold the caller longer.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// What a decision is when Sluice cannot give one (see [`FailurePolicy`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// `authorization: Bearer <token>` on every call: the native API needs it when Sluice runs
    /// with `LIMITER_API_TOKEN`. Fails on a token that cannot be a header value.
    pub fn bearer_token(mut self, token: &str) -> Result<Self, Error> {
        let mut value: AsciiMetadataValue = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| Error::invalid_token())?;
        // Kept out of `Debug` output (the builder and the client derive it) and HPACK's table.
        value.set_sensitive(true);
        self.token = Some(value);
        Ok(self)
    }

    /// A client on an existing channel (cloned channels share one connection).
    pub fn build(self, channel: Channel) -> Client {
        Client {
            rls: RateLimitServiceClient::new(channel.clone()),
            limiter: LimiterClient::new(channel),
            deadline: self.deadline,
            policy: self.policy,
            token: self.token,
        }
    }

    /// Connects to `endpoint` (`http://host:port`) now; fails if Sluice cannot be reached.
    pub async fn connect(self, endpoint: impl Into<String>) -> Result<Client, Error> {
        let channel = endpoint_of(endpoint.into())?
            .connect()
            .await
            .map_err(Error::connect)?;
        Ok(self.build(channel))
    }

    /// A client for `endpoint` that connects on its first call (and reconnects after a failure),
    /// so a service can start while Sluice is down; its calls then go to the failure policy.
    pub fn connect_lazy(self, endpoint: impl Into<String>) -> Result<Client, Error> {
        let channel = endpoint_of(endpoint.into())?.connect_lazy();
        Ok(self.build(channel))
    }
}

fn endpoint_of(endpoint: String) -> Result<Endpoint, Error> {
    Endpoint::from_shared(endpoint.clone())
        .map_err(|source| Error::invalid_endpoint(&endpoint, source))
}

/// A Sluice client: RLS (`should_rate_limit`, in [`crate::rls`]) and the native API
/// (`try_acquire`, `acquire`, `set_rate`, `available_permits`, in [`crate::limiter`]).
/// Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) rls: RateLimitServiceClient<Channel>,
    pub(crate) limiter: LimiterClient<Channel>,
    deadline: Duration,
    pub(crate) policy: FailurePolicy,
    token: Option<AsciiMetadataValue>,
}

impl Client {
    /// A builder for the deadline, failure policy and token.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// Connects to `endpoint` (`http://host:port`) with the default deadline
    /// ([`DEFAULT_DEADLINE`]) and policy ([`FailurePolicy::Open`]).
    pub async fn connect(endpoint: impl Into<String>) -> Result<Client, Error> {
        Self::builder().connect(endpoint).await
    }

    /// A client with the defaults on an existing channel.
    pub fn new(channel: Channel) -> Client {
        Self::builder().build(channel)
    }

    /// The deadline calls get unless they name their own.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The failure policy decisions follow.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.policy
    }

    /// `message` as a request carrying `deadline` (as `grpc-timeout`) and the bearer token.
    pub(crate) fn request<T>(&self, message: T, deadline: Duration) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(deadline);
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        request
    }

    /// Runs one call, giving up at `deadline` even if Sluice never answers.
    ///
    /// Three timers race for the same deadline: this one, tonic's channel (which enforces the
    /// `grpc-timeout` it sends) and Sluice's; the last two answer `CANCELLED`. Whichever fires
    /// first, a call cancelled once its deadline has passed is a deadline
    /// ([`crate::ErrorKind::Deadline`]), not Sluice being unavailable.
    pub(crate) async fn call<T>(
        deadline: Duration,
        call: impl Future<Output = Result<tonic::Response<T>, Status>>,
    ) -> Result<T, Error> {
        let started = Instant::now();
        match tokio::time::timeout(deadline, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status))
                if status.code() == Code::Cancelled && started.elapsed() >= deadline =>
            {
                Err(Error::deadline_passed(deadline))
            }
            Ok(Err(status)) => Err(Error::status(status, deadline)),
            Err(_) => Err(Error::deadline_passed(deadline)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn the_bearer_token_stays_out_of_debug_output() {
        let builder = Client::builder()
            .bearer_token("s3cret-token-value")
            .unwrap();
        assert!(!format!("{builder:?}").contains("s3cret"));
        let refused = Client::builder().bearer_token("line\nbreak").unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::InvalidSetting);
    }
}
