//! What the xDS config source needs to know, as `settings` fills it in from upstream's
//! `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` variables; and the reconnect backoff built from them.

use std::path::PathBuf;
use std::time::Duration;

use sluice::config::LoadOptions;

/// The xDS client's options.
#[derive(Clone)]
pub struct XdsOptions {
    /// `CONFIG_GRPC_XDS_SERVER_URL`: `host:port` (a scheme, if given, is dropped; TLS follows
    /// `tls`).
    pub server_url: String,
    /// `CONFIG_GRPC_XDS_NODE_ID`.
    pub node_id: String,
    /// `CONFIG_GRPC_XDS_NODE_METADATA`, as string values of the node's metadata.
    pub node_metadata: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`, sent as gRPC metadata on the stream. The
    /// values may be credentials, so they are never shown.
    pub headers: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_SERVER_USE_TLS` and its files; `None`: plaintext.
    pub tls: Option<XdsTls>,
    pub backoff: BackoffOptions,
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`; `None`: gRPC's 4 MiB.
    pub max_message_bytes: Option<usize>,
    /// `MERGE_DOMAIN_CONFIG` applies within one response.
    pub load: LoadOptions,
}

impl std::fmt::Debug for XdsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("XdsOptions")
            .field("server_url", &self.server_url)
            .field("node_id", &self.node_id)
            .field("node_metadata", &self.node_metadata)
            .field("headers", &header_names)
            .field("tls", &self.tls)
            .field("backoff", &self.backoff)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("load", &self.load)
            .finish()
    }
}

/// TLS to the xDS server.
#[derive(Debug, Clone, Default)]
pub struct XdsTls {
    /// `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`: trusted beside the system roots.
    pub ca: Option<PathBuf>,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_CERT` and `_KEY`: the client certificate, when both are set.
    pub cert_and_key: Option<(PathBuf, PathBuf)>,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_SAN`: the name the server's certificate must carry (default:
    /// the URL's host).
    pub server_name: Option<String>,
}

/// `XDS_CLIENT_BACKOFF_*`: the wait before reconnecting, and before answering a snapshot that
/// was already refused.
#[derive(Debug, Clone, Copy)]
pub struct BackoffOptions {
    pub initial: Duration,
    pub max: Duration,
    /// Each wait is drawn from `wait × (1 ± random_factor)` when `jitter` is on.
    pub random_factor: f64,
    pub jitter: bool,
}

impl Default for BackoffOptions {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            random_factor: 0.5,
            jitter: true,
        }
    }
}

/// The longest wait before answering a repeat of a refused snapshot. A server such as
/// go-control-plane sends nothing new until it has that answer, so this is also how long a
/// corrected snapshot can wait before it is applied; one exchange a second (a comparison, no
/// validation) is what a bad snapshot costs meanwhile.
pub const REPEAT_PACE_MAX: Duration = Duration::from_secs(1);

impl BackoffOptions {
    /// The pace at which repeats of a refused snapshot are answered: this backoff, capped at
    /// [`REPEAT_PACE_MAX`] and without jitter (the bound is exact).
    pub(super) fn for_repeats(self) -> Self {
        Self {
            initial: self.initial.min(REPEAT_PACE_MAX),
            max: self.max.min(REPEAT_PACE_MAX),
            jitter: false,
            ..self
        }
    }
}

/// Exponential backoff: `initial`, doubling up to `max`, randomised when asked.
#[derive(Debug)]
pub(super) struct Backoff {
    options: BackoffOptions,
    next: Duration,
}

impl Backoff {
    pub(super) fn new(options: BackoffOptions) -> Self {
        Self {
            options,
            next: options.initial,
        }
    }

    /// The wait to use now; the one after it is twice as long, up to the maximum.
    pub(super) fn next_wait(&mut self) -> Duration {
        let base = self.next.min(self.options.max);
        self.next = (base * 2).min(self.options.max);
        if !self.options.jitter || self.options.random_factor <= 0.0 {
            return base;
        }
        let factor = self.options.random_factor.min(1.0);
        let scale = 1.0 + factor * (rand::random::<f64>() * 2.0 - 1.0);
        base.mul_f64(scale)
    }

    /// Back to the initial wait, after the server answered.
    pub(super) fn reset(&mut self) {
        self.next = self.options.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_maximum_and_resets() {
        let mut backoff = Backoff::new(BackoffOptions {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(350),
            random_factor: 0.5,
            jitter: false,
        });
        let waits: Vec<_> = (0..4).map(|_| backoff.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 350, 350]);
        backoff.reset();
        assert_eq!(backoff.next_wait().as_millis(), 100);
    }

    #[test]
    fn jitter_stays_within_the_random_factor() {
        let mut backoff = Backoff::new(BackoffOptions {
            initial: Duration::from_millis(1000),
            max: Duration::from_millis(1000),
            random_factor: 0.5,
            jitter: true,
        });
        for _ in 0..100 {
            let wait = backoff.next_wait().as_millis();
            assert!((500..=1500).contains(&wait), "{wait}");
        }
    }
}
