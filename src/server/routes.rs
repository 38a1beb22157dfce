//! The gRPC services of one listener, and which of them a call goes to.
//!
//! tonic's `Routes` is an axum router: for every call it looks the path up, clones the matched
//! service out of a box, records the match in the request's extensions and wraps the response
//! twice. That is about ten allocations per call, a cost every `ShouldRateLimit` paid for
//! routing between it and the health and reflection services. A listener here has one hot
//! service, called directly when the path names it (`/<package>.<Service>/…`, what tonic's
//! generated server dispatches on); every other path goes through the routes as before, so
//! health, reflection and unknown paths answer as tonic's router does.
//!
//! A call to a service that asks a store whose deadline is too short for it is answered here,
//! before the service runs (`deadline_floor.rs` says why here).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::body::Body;
use tonic::server::NamedService;
use tower_service::Service;

use super::deadline_floor::DeadlineFloor;
use sluice::metrics::Metrics;

/// What a gRPC call answers with: the boxed future tonic's generated servers return.
pub(crate) type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

/// The hot service, cloned for each call as tonic's router clones its services.
type Hot = Arc<dyn Fn(http::Request<Body>) -> ResponseFuture + Send + Sync>;

/// A listener's services: one hot, called directly, and tonic's routes for the rest.
#[derive(Clone)]
pub(crate) struct GrpcRoutes {
    /// The path prefix of every method of the hot service (`/<NAME>/`), and the service.
    hot: Option<(Arc<str>, Hot)>,
    routes: tonic::service::Routes,
    /// The services that ask a store, by path prefix (`/<NAME>/`), with their deadline floor.
    floors: Vec<(Arc<str>, DeadlineFloor)>,
}

impl GrpcRoutes {
    /// `hot` called directly for its paths, `routes` for every other path (reflection lists
    /// services from the descriptor sets it was given, not from the routes).
    pub(crate) fn new<H>(hot: H, routes: tonic::service::Routes) -> Self
    where
        H: Service<
                http::Request<Body>,
                Response = http::Response<Body>,
                Error = Infallible,
                Future = ResponseFuture,
            > + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
    {
        let hot_prefix: Arc<str> = format!("/{}/", H::NAME).into();
        // tonic's generated servers are always ready (`poll_ready` answers Ready), so they are
        // called without it, as tonic's router calls them.
        let hot: Hot = Arc::new(move |request| hot.clone().call(request));
        Self {
            hot: Some((hot_prefix, hot)),
            routes: routes.prepare(),
            floors: Vec::new(),
        }
    }

    /// Every call through `routes` (a listener whose calls are not hot enough to matter).
    pub(crate) fn routed(routes: tonic::service::Routes) -> Self {
        Self {
            hot: None,
            routes: routes.prepare(),
            floors: Vec::new(),
        }
    }

    /// Calls to `S`, a service that asks a store, are answered `DEADLINE_EXCEEDED` before it
    /// runs when their deadline leaves less than `floor` (`GRPC_MIN_TIMEOUT`).
    pub(crate) fn with_floor<S: NamedService>(
        mut self,
        floor: Duration,
        metrics: &Metrics,
    ) -> Self {
        let prefix: Arc<str> = format!("/{}/", S::NAME).into();
        self.floors
            .push((prefix, DeadlineFloor::new(floor, S::NAME, metrics)));
        self
    }

    /// The answer to one call, which arrived at `arrived` with the deadline `timeout` (its
    /// `grpc-timeout`, read by `serving.rs`).
    pub(crate) fn call(
        &self,
        request: http::Request<Body>,
        arrived: Instant,
        timeout: Option<Duration>,
    ) -> ResponseFuture {
        if let Some(timeout) = timeout {
            let path = request.uri().path();
            let floor = self.floors.iter().find(|(p, _)| path.starts_with(&**p));
            if let Some(refusal) = floor.and_then(|(_, f)| f.refuse(arrived, timeout)) {
                return Box::pin(std::future::ready(Ok(refusal.into_http())));
            }
        }
        match &self.hot {
            Some((prefix, hot)) if request.uri().path().starts_with(&**prefix) => hot(request),
            _ => Box::pin(self.routes.clone().call(request)),
        }
    }
}

/// The methods served here whose request is a stream of messages rather than one: each message
/// then gets its own deadline (`budget.rs`), and a stream may wait between them. Every other
/// method's request is one message, whole within the deadline.
const STREAMING_REQUESTS: [&str; 2] = [
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas",
];

/// Whether the method at `path` takes a stream of request messages.
pub(crate) fn streams_requests(path: &str) -> bool {
    // `ShouldRateLimit` fails on the first byte.
    !path.starts_with("/envoy.service.ratelimit.") && STREAMING_REQUESTS.contains(&path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A service that answers every call with its name in a header.
    #[derive(Clone)]
    struct Named;

    impl NamedService for Named {
        const NAME: &'static str = "test.v1.Hot";
    }

    impl Service<http::Request<Body>> for Named {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = ResponseFuture;

        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Infallible>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<Body>) -> ResponseFuture {
            let path = request.uri().path().to_string();
            Box::pin(async move {
                Ok(http::Response::builder()
                    .header("served-by", "hot")
                    .header("path", path)
                    .body(Body::empty())
                    .expect("a valid response"))
            })
        }
    }

    fn call(routes: &GrpcRoutes, path: &str) -> http::Response<Body> {
        call_within(routes, path, None)
    }

    fn call_within(
        routes: &GrpcRoutes,
        path: &str,
        timeout: Option<Duration>,
    ) -> http::Response<Body> {
        let request = http::Request::builder()
            .uri(path)
            .header("content-type", "application/grpc")
            .body(Body::empty())
            .expect("a valid request");
        let answer = routes.call(request, Instant::now(), timeout);
        futures::executor::block_on(answer).expect("infallible")
    }

    #[tokio::test]
    async fn a_deadline_too_short_for_a_floored_service_is_answered_before_it_runs() {
        let metrics = Metrics::new(0.8);
        let floor = Duration::from_millis(1);
        let routes = GrpcRoutes::new(Named, tonic::service::Routes::default())
            .with_floor::<Named>(floor, &metrics);
        for short in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(500),
        ] {
            let answer = call_within(&routes, "/test.v1.Hot/Decide", Some(short));
            assert!(!answer.headers().contains_key("served-by"), "{short:?}");
            assert_eq!(
                answer.headers()["grpc-status"],
                "4",
                "{short:?}: DEADLINE_EXCEEDED"
            );
        }
        let waits = call_within(&routes, "/test.v1.Hot/Decide", Some(Duration::from_secs(1)));
        assert_eq!(waits.headers()["served-by"], "hot");
        let none = call_within(&routes, "/test.v1.Hot/Decide", None);
        assert_eq!(none.headers()["served-by"], "hot", "no deadline, no floor");
        // A service without a floor (health, reflection) is left to answer.
        let other = call_within(&routes, "/test.v1.Other/Decide", Some(Duration::ZERO));
        assert_eq!(
            other.headers()["grpc-status"],
            "12",
            "UNIMPLEMENTED, from the routes"
        );
        let counted = metrics
            .calls_deadline_too_short
            .with_label_values(&["test.v1.Hot", "before_store"])
            .get();
        assert_eq!(counted, 3);
    }

    #[test]
    fn the_hot_service_answers_its_paths_and_the_routes_the_rest() {
        let routes = GrpcRoutes::new(Named, tonic::service::Routes::default());
        let hot = call(&routes, "/test.v1.Hot/Decide");
        assert_eq!(hot.headers()["served-by"], "hot");
        assert_eq!(hot.headers()["path"], "/test.v1.Hot/Decide");
        // Another service's path, and one that only starts like the hot one's name, go to the
        // routes, which know neither: tonic's answer for an unknown method.
        for other in ["/test.v1.Other/Decide", "/test.v1.HotSpare/Decide"] {
            let answer = call(&routes, other);
            assert!(!answer.headers().contains_key("served-by"), "{other}");
            assert_eq!(
                answer.headers()["grpc-status"],
                "12",
                "{other}: UNIMPLEMENTED"
            );
        }
    }
}
