//! A `ShouldRateLimit` call whose message is over the size limit is answered `OVER_LIMIT`,
//! never refused.
//!
//! tonic refuses a message over `max_decoding_message_size` with `OUT_OF_RANGE`, and Envoy
//! treats every gRPC error alike: with the shipped `failure_mode_deny: false` the request goes
//! through unchecked. Envoy caps a request's headers (60 KiB by default), but a route whose
//! actions copy one header into many descriptors can still build a call of more than 1 MiB, so
//! one big header would switch every limit of that route off (issue #27, item 9). Judging the
//! descriptors that fit would mean decoding a message we refuse to buffer; instead the call is
//! answered as a refusal, `OVER_LIMIT` with no descriptor statuses, which Envoy turns into a 429.
//! Only the client that sent the oversized request is refused: nothing is counted.
//!
//! The wrapper reads the first 5 bytes of the request body (the gRPC frame header: compression
//! flag and length) before tonic does. A length within the limit hands the bytes read back in
//! front of the rest of the body, untouched; a larger one is read and dropped (up to
//! [`DRAIN_LIMIT`], so Envoy sees an ordinary complete exchange) and answered here, without
//! ever holding the message in memory.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use prost::Message;
use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;

use sluice::metrics::Metrics;
use sluice::proto::{Code, RateLimitResponse};
use sluice::util::LogThrottle;

/// How much of an oversized request body is read and dropped before answering anyway: beyond
/// it the client is not an Envoy, and the stream is simply answered and reset.
pub(crate) const DRAIN_LIMIT: usize = 16 << 20;

/// The `reason` label of `sluice_descriptors_refused_total` for such a call.
pub(crate) const REASON: &str = "request_too_large";

/// Wraps the RLS service: see the module doc.
#[derive(Clone)]
pub(crate) struct AnswerOversized<S> {
    inner: S,
    max_bytes: usize,
    metrics: Arc<Metrics>,
    log: Arc<LogThrottle>,
}

impl<S> AnswerOversized<S> {
    pub(crate) fn new(inner: S, max_bytes: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            max_bytes,
            metrics,
            log: Arc::new(LogThrottle::new()),
        }
    }
}

impl<S: NamedService> NamedService for AnswerOversized<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower_service::Service<http::Request<Body>> for AnswerOversized<S>
where
    S: tower_service::Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The service that was polled ready serves this call; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (max_bytes, metrics, log) = (self.max_bytes, self.metrics.clone(), self.log.clone());
        Box::pin(async move {
            let (parts, mut body) = request.into_parts();
            let mut head = BytesMut::new();
            // Frames until the 5-byte header is in, the body ends, or it fails (tonic then
            // sees what is left and answers as it would have).
            while head.len() < 5 {
                match body.frame().await {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => head.put(data),
                        Err(_) => break,
                    },
                    _ => break,
                }
            }
            if let Some(length) = declared_length(&head)
                && length > max_bytes
            {
                metrics.record_refused_descriptor(REASON);
                if let Some(held_back) = log.allow(now_secs()) {
                    tracing::warn!(
                        bytes = length,
                        limit = max_bytes,
                        held_back,
                        "ShouldRateLimit request over the size limit answered OVER_LIMIT, uncounted"
                    );
                }
                drain(body, head.len()).await;
                return Ok(over_limit());
            }
            let body = Body::new(Prefixed {
                head: (!head.is_empty()).then(|| head.freeze()),
                rest: body,
            });
            inner.call(http::Request::from_parts(parts, body)).await
        })
    }
}

/// The message length a gRPC frame header declares, once its 5 bytes are in.
fn declared_length(head: &[u8]) -> Option<usize> {
    let bytes: [u8; 4] = head.get(1..5)?.try_into().ok()?;
    usize::try_from(u32::from_be_bytes(bytes)).ok()
}

/// Reads and drops the rest of an oversized body, up to [`DRAIN_LIMIT`] bytes in all.
async fn drain(mut body: Body, mut read: usize) {
    while read < DRAIN_LIMIT {
        match body.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
            _ => return,
        }
    }
}

/// A complete gRPC answer: `OVER_LIMIT`, status OK, so Envoy answers 429.
fn over_limit() -> http::Response<Body> {
    let message = RateLimitResponse {
        overall_code: Code::OverLimit as i32,
        ..Default::default()
    }
    .encode_to_vec();
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.len()).expect("a short message"));
    frame.put_slice(&message);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let frames = futures::stream::iter([
        Ok::<_, Status>(Frame::data(frame.freeze())),
        Ok(Frame::trailers(trailers)),
    ]);
    http::Response::builder()
        .status(http::StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .body(Body::new(http_body_util::StreamBody::new(frames)))
        .expect("a fixed response is valid")
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The bytes already read, then the rest of the body.
struct Prefixed {
    head: Option<Bytes>,
    rest: Body,
}

impl HttpBody for Prefixed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(head) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.rest.is_end_stream()
    }
}
