//! The xDS config source (`CONFIG_TYPE=GRPC_XDS_SOTW`): rate limit configuration pushed by a
//! control plane such as Envoy Gateway, instead of read from files.
//!
//! One ADS stream (`StreamAggregatedResources`, state of the world) asks for every
//! `ratelimit.config.ratelimit.v3.RateLimitConfig`. Each response is the whole configuration:
//! its resources are validated together by the file loader's rules (`config::load_resources`)
//! and, when they load, replace the configuration in force at once and are ACKed (version and
//! nonce); otherwise the old configuration stays and the response is NACKed with the errors in
//! `error_detail`. Accepted configurations go out on a `watch` channel, the same way the file
//! watcher hands them on, so whoever applies them (`app`) treats both sources alike.
//!
//! Any stream error closes the stream; the client waits for the backoff and reconnects, asking
//! for the last version it accepted, while the last good configuration keeps serving. A server
//! that answers a NACK by pushing the same snapshot again (go-control-plane does, and Envoy
//! Gateway uses it) is answered again only after a short wait (the backoff, capped at
//! [`REPEAT_PACE_MAX`], 1 s), so a bad snapshot costs one exchange per wait, never a hot loop,
//! and is validated once. The wait is short because such a server sends nothing new until it
//! has the answer: a corrected snapshot is applied at most that long after it was pushed (with
//! the reconnect backoff's pace it waited 10 to 90 s, issue #27). A server that pushes something
//! new during the wait is answered at once.
//!
//! Every NACK of a config that did not load counts in `config_load_error`, repeats included, as
//! upstream counts every refused response (its provider loads each response and reports each
//! failure); a resource that does not even decode is NACKed uncounted, as upstream's is. Every
//! response that loads counts in `config_load_success`, a re-sent version included, as upstream.

mod options;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use options::Backoff;
pub use options::{BackoffOptions, REPEAT_PACE_MAX, XdsOptions, XdsTls};

use sluice::config::{self, RateLimitConfig};
use sluice::metrics::Metrics;
use sluice::proto::envoy::config::core::v3::Node;
use sluice::proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use sluice::proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use sluice::proto::google::rpc::Status as RpcStatus;
use sluice::proto::ratelimit::config::ratelimit::v3::RateLimitConfig as ConfigResource;

/// The type URL of the resources asked for.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Where accepted configurations go: the latest one, replacing any before it.
pub type ConfigSender = watch::Sender<Option<Arc<RateLimitConfig>>>;

/// Why the xDS client cannot start, or why one stream ended.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error("cannot read {what} {path}: {source}")]
    File {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("CONFIG_GRPC_XDS_SERVER_URL={url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("invalid header {name:?} in CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")]
    Header { name: String },
    #[error("cannot connect to the xDS server: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("xDS stream failed: {0}")]
    Stream(#[from] tonic::Status),
    #[error("the xDS server closed the stream")]
    Closed,
}

/// A connected-on-demand ADS client, built once from [`XdsOptions`] (so bad files or a bad URL
/// stop the service at start, as upstream's do).
#[derive(Debug)]
pub struct XdsClient {
    options: XdsOptions,
    endpoint: Endpoint,
    headers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
    node: Node,
}

/// What the client remembers across streams.
#[derive(Debug, Default)]
struct StreamState {
    /// The version of the configuration in force ("" before the first).
    accepted_version: String,
    /// The last refused snapshot (version and resources) and why, so a repeat is recognised.
    refused: Option<Refusal>,
}

#[derive(Debug)]
struct Refusal {
    version: String,
    resources: Vec<prost_types::Any>,
    message: String,
    /// The resources decoded but did not load: each NACK of them counts as a load error.
    load_error: bool,
}

/// How to answer one response.
#[derive(Debug)]
struct Reply {
    request: DiscoveryRequest,
    /// How long to wait before sending it: a repeat of a refused snapshot is paced.
    wait: Option<Duration>,
    /// A NACK of a config that did not load, counted in `config_load_error` when it is sent
    /// (so the count is the NACKs the server saw, never one superseded before it went out).
    load_error: bool,
}

impl XdsClient {
    pub fn new(options: XdsOptions) -> Result<Self, XdsError> {
        let authority = options
            .server_url
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .trim_start_matches("dns:///")
            .to_string();
        let url_error = |reason: &str| XdsError::Url {
            url: options.server_url.clone(),
            reason: reason.to_string(),
        };
        let scheme = if options.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{authority}"))
            .map_err(|_| url_error("expected host:port"))?
            .connect_timeout(Duration::from_secs(10))
            // A server that vanished without closing the connection is noticed within ~40 s.
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        if let Some(tls) = &options.tls {
            endpoint = endpoint.tls_config(client_tls(tls, &authority)?)?;
        }
        let headers = options
            .headers
            .iter()
            .map(|(name, value)| {
                let bad = || XdsError::Header { name: name.clone() };
                let key = AsciiMetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes())
                    .map_err(|_| bad())?;
                let value = AsciiMetadataValue::try_from(value.as_str()).map_err(|_| bad())?;
                Ok((key, value))
            })
            .collect::<Result<_, XdsError>>()?;
        let metadata = options
            .node_metadata
            .iter()
            .map(|(k, v)| {
                let value = prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(v.clone())),
                };
                (k.clone(), value)
            })
            .collect();
        let node = Node {
            id: options.node_id.clone(),
            metadata: (!options.node_metadata.is_empty())
                .then_some(prost_types::Struct { fields: metadata }),
            user_agent_name: "sluice".into(),
            user_agent_version_type: Some(
                sluice::proto::envoy::config::core::v3::node::UserAgentVersionType::UserAgentVersion(
                    env!("CARGO_PKG_VERSION").into(),
                ),
            ),
            ..Node::default()
        };
        Ok(Self {
            options,
            endpoint,
            headers,
            node,
        })
    }

    /// Follows the server until the task is dropped, publishing every configuration it accepts.
    pub async fn run(self, metrics: Arc<Metrics>, publish: ConfigSender) {
        let mut state = StreamState::default();
        let mut backoff = Backoff::new(self.options.backoff);
        tracing::info!(server = %self.options.server_url, node = %self.options.node_id,
            "starting the xDS client for rate limit configuration");
        loop {
            let error = self
                .stream(&mut state, &mut backoff, &metrics, &publish)
                .await;
            let wait = backoff.next_wait();
            tracing::warn!(%error, retry_in = ?wait,
                "xDS stream ended; the current configuration stays in force");
            tokio::time::sleep(wait).await;
        }
    }

    /// One stream, from connecting to its end; returns why it ended.
    async fn stream(
        &self,
        state: &mut StreamState,
        backoff: &mut Backoff,
        metrics: &Metrics,
        publish: &ConfigSender,
    ) -> XdsError {
        let channel = match self.endpoint.connect().await {
            Ok(channel) => channel,
            Err(e) => return e.into(),
        };
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        if let Some(max) = self.options.max_message_bytes {
            client = client.max_decoding_message_size(max);
        }
        let (requests, outgoing) = mpsc::channel(4);
        // The first request names the version in force (empty at first) and no nonce.
        let first = self.request(&state.accepted_version, "", None);
        if requests.send(first).await.is_err() {
            return XdsError::Closed;
        }
        let mut request = tonic::Request::new(ReceiverStream::new(outgoing));
        for (key, value) in &self.headers {
            request.metadata_mut().insert(key.clone(), value.clone());
        }
        let mut responses = match client.stream_aggregated_resources(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return status.into(),
        };
        tracing::info!(server = %self.options.server_url, "xDS stream open");
        // Repeats of a refused snapshot are answered at this pace.
        let mut repeat_pace = Backoff::new(self.options.backoff.for_repeats());
        let mut pushed = None;
        loop {
            let response = match pushed.take() {
                Some(response) => response,
                None => match responses.message().await {
                    Ok(Some(response)) => response,
                    Ok(None) => return XdsError::Closed,
                    Err(status) => return status.into(),
                },
            };
            backoff.reset();
            let reply = self.answer(response, state, &mut repeat_pace, metrics, publish);
            if let Some(wait) = reply.wait {
                // A response that arrives meanwhile supersedes the repeat, whose answer is then
                // never sent: the server wants an answer to its latest nonce only.
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    message = responses.message() => match message {
                        Ok(Some(response)) => {
                            pushed = Some(response);
                            continue;
                        }
                        Ok(None) => return XdsError::Closed,
                        Err(status) => return status.into(),
                    },
                }
            }
            if reply.load_error {
                metrics.config_load_error.inc();
            }
            if requests.send(reply.request).await.is_err() {
                return XdsError::Closed;
            }
        }
    }

    /// Loads one response and says how to answer it (and how long to wait before answering).
    fn answer(
        &self,
        response: DiscoveryResponse,
        state: &mut StreamState,
        repeat_pace: &mut Backoff,
        metrics: &Metrics,
        publish: &ConfigSender,
    ) -> Reply {
        let DiscoveryResponse {
            version_info: version,
            resources,
            nonce,
            type_url,
            ..
        } = response;
        if let Some(refused) = &state.refused
            && refused.version == version
            && refused.resources == resources
        {
            // Already refused: say so again, but not at once (see the module comment).
            let wait = repeat_pace.next_wait();
            tracing::debug!(%version, ?wait, "the xDS server sent a refused snapshot again");
            return Reply {
                request: self.request(&state.accepted_version, &nonce, Some(&refused.message)),
                wait: Some(wait),
                load_error: refused.load_error,
            };
        }
        let loaded = decode(&type_url, &resources)
            .map_err(|e| (e, false))
            .and_then(|configs| {
                config::load_resources(&configs, &self.options.load)
                    .map_err(|errors| (errors.to_string(), true))
            });
        match loaded {
            Ok(config) => {
                let (domains, limits) = (config.domain_names().count(), config.limits().len());
                for warning in &config.warnings {
                    tracing::warn!(%warning, "config");
                }
                publish.send_replace(Some(Arc::new(config)));
                metrics.config_load_success.inc();
                tracing::info!(%version, domains, limits, "xDS configuration loaded");
                state.accepted_version = version.clone();
                state.refused = None;
                repeat_pace.reset();
                Reply {
                    request: self.request(&version, &nonce, None),
                    wait: None,
                    load_error: false,
                }
            }
            Err((message, load_error)) => {
                tracing::error!(%version, errors = %message,
                    "xDS configuration refused (NACK); the previous one stays in force");
                let request = self.request(&state.accepted_version, &nonce, Some(&message));
                state.refused = Some(Refusal {
                    version,
                    resources,
                    message,
                    load_error,
                });
                Reply {
                    request,
                    wait: None,
                    load_error,
                }
            }
        }
    }

    /// A request as every one is sent: node, type, the version in force, the nonce answered,
    /// and for a NACK the reason.
    fn request(&self, version: &str, nonce: &str, error: Option<&str>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.to_string(),
            node: Some(self.node.clone()),
            resource_names: Vec::new(),
            type_url: TYPE_URL.to_string(),
            response_nonce: nonce.to_string(),
            error_detail: error.map(|message| RpcStatus {
                // INVALID_ARGUMENT, as Envoy's own NACKs carry.
                code: 3,
                message: message.to_string(),
                details: Vec::new(),
            }),
        }
    }
}

/// Decodes the resources of a response; the error is the NACK's message.
fn decode(type_url: &str, resources: &[prost_types::Any]) -> Result<Vec<ConfigResource>, String> {
    use prost::Message;
    if !type_url.is_empty() && type_url != TYPE_URL {
        return Err(format!(
            "unexpected type {type_url:?}, asked for {TYPE_URL}"
        ));
    }
    resources
        .iter()
        .enumerate()
        .map(|(i, any)| {
            if any.type_url != TYPE_URL {
                return Err(format!(
                    "resource #{i}: unexpected type {:?}, expected {TYPE_URL}",
                    any.type_url
                ));
            }
            ConfigResource::decode(any.value.as_slice())
                .map_err(|e| format!("resource #{i}: cannot decode: {e}"))
        })
        .collect()
}

/// The client side of TLS to the xDS server: system roots plus the configured CA (as upstream),
/// the client certificate when given, and the name to verify.
fn client_tls(tls: &XdsTls, authority: &str) -> Result<ClientTlsConfig, XdsError> {
    let read = |what: &'static str, path: &std::path::Path| {
        std::fs::read(path).map_err(|source| XdsError::File {
            what,
            path: path.to_path_buf(),
            source,
        })
    };
    let host = match authority.rsplit_once(':') {
        Some((host, _)) => host.trim_matches(['[', ']']),
        None => authority,
    };
    let config = ClientTlsConfig::new()
        .domain_name(tls.server_name.clone().unwrap_or_else(|| host.to_string()));
    let mut config = match &tls.ca {
        // The system's roots only where there are some: a container base without a CA bundle
        // (debian:bookworm-slim, distroless/static) still trusts the CA it was given, as
        // upstream does. tonic's own `with_native_roots` refuses to connect without any.
        Some(ca) => config
            .trust_anchors(system_roots())
            .ca_certificate(Certificate::from_pem(read("CA certificate", ca)?)),
        // No CA given: the system's roots are all there is to trust (none: tonic says so).
        None => config.with_native_roots(),
    };
    if let Some((cert, key)) = &tls.cert_and_key {
        config = config.identity(Identity::from_pem(
            read("client certificate", cert)?,
            read("client key", key)?,
        ));
    }
    Ok(config)
}

/// The system's CA roots, none when the system has no bundle (or none readable).
fn system_roots() -> Vec<rustls_pki_types::TrustAnchor<'static>> {
    rustls_native_certs::load_native_certs()
        .certs
        .iter()
        .filter_map(|der| webpki::anchor_from_trusted_cert(der).ok())
        .map(|anchor| anchor.to_owned())
        .collect()
}
