//! The gRPC services of one listener, and which of them a call goes to.
//!
//! tonic's `Routes` is an axum router: for every call it looks the path up, clones the matched
//! service out of a box, records the match in the request's extensions and wraps the response
//! twice. That is about ten allocations per call, a cost every `ShouldRateLimit` paid for
//! routing between it and the health and reflection services. A listener here has one hot
//! service, called directly when the path names it (`/<package>.<Service>/…`, what tonic's
//! generated server dispatches on); every other path goes through the routes as before, so
//! health, reflection and unknown paths answer as tonic's router does.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tonic::body::Body;
use tonic::server::NamedService;
use tower_service::Service;

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
        }
    }

    /// Every call through `routes` (a listener whose calls are not hot enough to matter).
    pub(crate) fn routed(routes: tonic::service::Routes) -> Self {
        Self {
            hot: None,
            routes: routes.prepare(),
        }
    }

    /// The answer to one call.
    pub(crate) fn call(&self, request: http::Request<Body>) -> ResponseFuture {
        match &self.hot {
            Some((prefix, hot)) if request.uri().path().starts_with(&**prefix) => hot(request),
            _ => Box::pin(self.routes.clone().call(request)),
        }
    }
}

/// The methods served here whose request is a stream of messages rather than one: each message
/// then gets its own deadline (`budget.rs`), and a stream may wait between them. Every other
/// method's request is one message, whole within the deadline.
const STREAMING_REQUESTS: [&str; 1] = ["/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"];

/// Whether the method at `path` takes a stream of request messages.
pub(crate) fn streams_requests(path: &str) -> bool {
    // Envoy's calls fail on the first byte.
    path.starts_with("/grpc.") && STREAMING_REQUESTS.contains(&path)
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
        let request = http::Request::builder()
            .uri(path)
            .header("content-type", "application/grpc")
            .body(Body::empty())
            .expect("a valid request");
        futures::executor::block_on(routes.call(request)).expect("infallible")
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
