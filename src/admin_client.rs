//! `sluice counters get|reset`: the admin API's HTTP client on the command line. It sends the
//! descriptor text as the operator typed it (escapes and all, `server::admin::descriptor`),
//! percent-encoded into the URL, with `ADMIN_API_TOKEN` as the bearer token, and hands back
//! the server's JSON as it came. Plain HTTP/1.1 only: the debug listener it talks to serves
//! nothing else.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::server::admin::descriptor::percent_encode;

/// What to ask the admin API.
#[derive(Debug, Clone)]
pub(crate) struct CountersCall {
    /// Read, reset, or give back hits.
    pub(crate) action: Action,
    /// The debug listener's URL, `http://host:port`.
    pub(crate) addr: String,
    pub(crate) domain: String,
    /// The descriptor in the admin API's text form (`k=v,k2=v2`, `\,` `\=` `\\` escapes).
    pub(crate) descriptor: String,
    pub(crate) token: String,
    /// How long the whole exchange may take.
    pub(crate) timeout: Duration,
}

/// What `sluice counters` asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Action {
    /// `GET /counters/{domain}`.
    Get,
    /// `DELETE /counters/{domain}`.
    Reset,
    /// `POST /counters/{domain}/refund` with this many hits.
    Refund(u64),
}

/// Why the call got no answer, or what the server refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CountersError {
    #[error("--addr {0:?} is not an http://host:port URL")]
    BadAddr(String),
    #[error("cannot reach {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("HTTP exchange with {addr} failed: {source}")]
    Http { addr: String, source: hyper::Error },
    #[error("no answer from {0} within the timeout")]
    Timeout(String),
    #[error("the server answered {status}: {body}")]
    Refused { status: u16, body: String },
}

/// Sends `call` and returns the JSON body of a 200.
pub(crate) async fn run(call: &CountersCall) -> Result<String, CountersError> {
    tokio::time::timeout(call.timeout, exchange(call))
        .await
        .map_err(|_| CountersError::Timeout(call.addr.clone()))?
}

async fn exchange(call: &CountersCall) -> Result<String, CountersError> {
    let base: http::Uri = call
        .addr
        .parse()
        .map_err(|_| CountersError::BadAddr(call.addr.clone()))?;
    let authority = match (base.scheme_str(), base.authority()) {
        (Some("http"), Some(authority)) => authority.clone(),
        _ => return Err(CountersError::BadAddr(call.addr.clone())),
    };
    let target = format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(80)
    );
    let stream = tokio::net::TcpStream::connect(&target)
        .await
        .map_err(|source| CountersError::Connect {
            addr: call.addr.clone(),
            source,
        })?;
    let http_error = |source| CountersError::Http {
        addr: call.addr.clone(),
        source,
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http_error)?;
    tokio::spawn(connection);
    let (method, suffix, hits) = match call.action {
        Action::Get => ("GET", "", String::new()),
        Action::Reset => ("DELETE", "", String::new()),
        Action::Refund(hits) => ("POST", "/refund", format!("&hits={hits}")),
    };
    let path = format!(
        "/counters/{}{suffix}?descriptor={}{hits}",
        percent_encode(&call.domain),
        percent_encode(&call.descriptor)
    );
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, authority.as_str())
        .header(
            http::header::AUTHORIZATION,
            format!("Bearer {}", call.token),
        )
        .body(Empty::<Bytes>::new())
        .expect("a request of valid parts");
    let response = sender.send_request(request).await.map_err(http_error)?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.map_err(http_error)?;
    let body = String::from_utf8_lossy(&body.to_bytes()).into_owned();
    if status == 200 {
        Ok(body)
    } else {
        Err(CountersError::Refused { status, body })
    }
}
