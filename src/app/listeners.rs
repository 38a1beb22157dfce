//! The listeners: binding them (gRPC, or its Unix socket, and HTTP first; then the native
//! API's own port, the debug and the Prometheus listeners, in that order) and serving on them
//! until [`StopSignal::stop`]. Each listener gets the connection caps and timeouts of
//! `MAX_CONNECTIONS`, `MAX_CONNECTIONS_PER_PEER`, `HTTP_READ_HEADER_TIMEOUT` and the gRPC
//! connection settings; the gRPC listeners also the request budgets and the overload manager
//! ([`Pressure`]); the statsd sink's flushes run beside them.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::AbortOnDrop;
use crate::server::admin::{self, Admin};
use crate::server::budget::{RequestBudget, RequestLimits};
use crate::server::connections::{ConnectionLimit, LimitedListener};
use crate::server::named::NamedApiService;
use crate::server::overload::{self, Overload};
use crate::server::serving::{Closed, Http1Options};
use crate::server::{
    Caps, GrpcListener, GrpcOptions, Health, ServeError, bind, bind_unix, debug, http, rls,
};
use crate::settings::Settings;
use sluice::metrics::{Metrics, StatsdOptions};
use sluice::rls::RateLimiter;
use sluice::store::MemoryStore;

/// Tells every listener to stop accepting; each holds a [`Self::stopped`] future.
pub(super) struct StopSignal {
    tx: watch::Sender<bool>,
    rx: watch::Receiver<bool>,
}

impl StopSignal {
    pub(super) fn new() -> Self {
        let (tx, rx) = watch::channel(false);
        Self { tx, rx }
    }

    /// Completes once [`Self::stop`] was called.
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let mut rx = self.rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }

    pub(super) fn stop(&self) {
        let _ = self.tx.send(true);
    }
}

/// The gRPC and HTTP listeners, bound before the rest of the service is started.
pub(super) struct MainListeners {
    grpc: GrpcListener,
    /// What to log as the gRPC address (a Unix socket's path, or host and port).
    grpc_addr: String,
    /// Removes the gRPC Unix socket's file when `serve` returns.
    remove_socket: Option<RemoveOnDrop>,
    http: TcpListener,
    http_addr: SocketAddr,
}

impl MainListeners {
    pub(super) fn bind(settings: &Settings) -> Result<Self, ServeError> {
        let (grpc_listener, grpc_addr, _remove_socket) = bind_grpc(settings)?;
        let http_listener = bind(settings.http_addr)?;
        let http_addr = http_listener
            .local_addr()
            .map_err(|source| ServeError::Bind {
                addr: settings.http_addr,
                source,
            })?;
        Ok(Self {
            grpc: grpc_listener,
            grpc_addr,
            remove_socket: _remove_socket,
            http: http_listener,
            http_addr,
        })
    }
}

/// What [`start_serving`] hands back: the servers to run, what to log, and what must live as
/// long as they do.
pub(super) struct Serving<F> {
    /// Every listener's serving, together; ends with the first error or when all have stopped.
    pub(super) servers: F,
    grpc_addr: String,
    http_addr: SocketAddr,
    debug_addr: SocketAddr,
    limiter_api_addr: Option<SocketAddr>,
    _remove_socket: Option<RemoveOnDrop>,
    _stop_statsd: Option<AbortOnDrop>,
}

impl<F> Serving<F> {
    /// Tells that the service is listening, and where.
    pub(super) fn announce(&self) {
        let (grpc_addr, http_addr, debug_addr) = (&self.grpc_addr, self.http_addr, self.debug_addr);
        match self.limiter_api_addr {
            Some(limiter) => tracing::info!(
                grpc = %grpc_addr, http = %http_addr, debug = %debug_addr, %limiter,
                "sluice is listening"
            ),
            None => tracing::info!(
                grpc = %grpc_addr, http = %http_addr, debug = %debug_addr, "sluice is listening"
            ),
        }
    }
}

/// What the listeners serve: the limiters, health and the figures `/metrics` shows.
pub(super) struct Served<H> {
    pub(super) limiter: Arc<RateLimiter>,
    /// The native API's service, when enabled.
    pub(super) named: Option<NamedApiService>,
    pub(super) health: Health,
    /// The gRPC health service, served beside RLS.
    pub(super) health_service: H,
    pub(super) memory_store: Option<Arc<MemoryStore>>,
    /// The admin API, when `ADMIN_API_TOKEN` is set: over gRPC beside RLS, over HTTP on the
    /// debug listener.
    pub(super) admin: Option<Admin>,
}

/// Binds the other listeners and starts serving on every one: the native API (on its own port,
/// or beside RLS), RLS, statsd, debug, Prometheus and HTTP, in that order.
pub(super) fn start_serving<'a, H>(
    settings: &'a Settings,
    options: &'a ListenerOptions,
    main: MainListeners,
    served: Served<H>,
    metrics: &'a Arc<Metrics>,
    stop: &StopSignal,
) -> Result<Serving<impl Future<Output = Result<(), ServeError>> + use<'a, H>>, ServeError>
where
    H: tower_service::Service<
            ::http::Request<tonic::body::Body>,
            Response = ::http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    H::Future: Send + 'static,
{
    let Served {
        limiter,
        named,
        health,
        health_service,
        memory_store,
        admin,
    } = served;
    let (caps, http1, grpc_options) = (options.caps, &options.http1, &options.grpc);
    let (shared_api, limiter_api) =
        serve_limiter_api(settings, named, grpc_options, metrics, stop)?;
    let limiter_api_addr = limiter_api.as_ref().map(|(addr, _)| *addr);
    let grpc = rls::serve(
        main.grpc,
        grpc_options,
        limiter.clone(),
        metrics.clone(),
        rls::Beside {
            limiter_api: shared_api,
            admin: admin.clone().map(admin::grpc_service),
        },
        health_service,
        stop.stopped(),
    )?;
    let _stop_statsd = start_statsd(settings, metrics, stop);
    let (debug_addr, debug) = serve_debug(
        settings,
        caps,
        http1.clone(),
        (&limiter, admin),
        metrics,
        stop,
    )?;
    let observability = http::Observability {
        metrics: metrics.clone(),
        memory_store,
    };
    let prometheus =
        serve_prometheus(settings, caps, http1.clone(), &observability, metrics, stop)?;
    let http = serve_http(
        main.http,
        (caps, http1.clone()),
        (limiter.clone(), health, observability),
        metrics,
        stop,
    );
    let prometheus = serve_if_any(prometheus);
    let limiter_api = serve_if_any(limiter_api.map(|(_, serving)| serving));
    let servers =
        async { tokio::try_join!(grpc, http, prometheus, limiter_api, debug).map(|_| ()) };
    Ok(Serving {
        servers,
        grpc_addr: main.grpc_addr,
        http_addr: main.http_addr,
        debug_addr,
        limiter_api_addr,
        _remove_socket: main.remove_socket,
        _stop_statsd,
    })
}

/// Serves `/healthcheck`, `/json` and `/metrics` on the HTTP listener.
fn serve_http(
    listener: TcpListener,
    (caps, http1): (Caps, Http1Options),
    (limiter, health, observability): (Arc<RateLimiter>, Health, http::Observability),
    metrics: &Arc<Metrics>,
    stop: &StopSignal,
) -> impl Future<Output = Result<(), ServeError>> + use<> {
    let http_listener = LimitedListener {
        listener,
        limit: ConnectionLimit::new(caps, "http", metrics),
    };
    http::serve(
        http_listener,
        http1,
        Closed::new("http", metrics),
        limiter,
        health,
        observability,
        stop.stopped(),
    )
}

/// A listener's serving that may be off: done at once when it is.
async fn serve_if_any(
    serving: Option<impl Future<Output = Result<(), ServeError>>>,
) -> Result<(), ServeError> {
    match serving {
        Some(serving) => serving.await,
        None => Ok(()),
    }
}

/// The connection caps, the HTTP/1 options and the gRPC options every listener is served with.
pub(super) struct ListenerOptions {
    caps: Caps,
    http1: Http1Options,
    grpc: GrpcOptions,
}

impl ListenerOptions {
    pub(super) fn new(settings: &Settings, pressure: &Pressure) -> Self {
        let (caps, http1, grpc) = listener_options(settings, pressure);
        Self { caps, http1, grpc }
    }
}

/// What callers may make the process hold: the request budgets every gRPC call is read under,
/// and the overload manager (its task runs until this is dropped).
pub(super) struct Pressure {
    budget: Arc<RequestBudget>,
    overload: Arc<Overload>,
    _manager: Option<AbortOnDrop>,
}

impl Pressure {
    pub(super) fn start(settings: &Settings, metrics: &Metrics) -> Self {
        let bytes = settings.pending_request_bytes;
        let limits = RequestLimits {
            timeout: (!settings.http_read_header_timeout.is_zero())
                .then_some(settings.http_read_header_timeout),
            per_connection: bytes.per_connection,
            per_peer: bytes.per_peer,
            total: bytes.total,
        };
        let budget = RequestBudget::new(limits, metrics.pressure.clone());
        let overload = Arc::new(Overload::default());
        let manager = match settings.overload_memory_limit.resolve() {
            Some(ceiling) => {
                tracing::info!(ceiling, "overload manager: memory ceiling");
                let shedding = budget.clone();
                Some(AbortOnDrop(tokio::spawn(overload::run(
                    ceiling,
                    overload.clone(),
                    move |on| shedding.shed(on),
                    metrics.pressure.clone(),
                ))))
            }
            None => {
                tracing::info!(
                    "overload manager off (OVERLOAD_MEMORY_LIMIT=0 or no ceiling found)"
                );
                None
            }
        };
        Self {
            budget,
            overload,
            _manager: manager,
        }
    }
}

/// The connection caps, the HTTP/1 options and the gRPC options every listener is served with.
fn listener_options(settings: &Settings, pressure: &Pressure) -> (Caps, Http1Options, GrpcOptions) {
    let caps = Caps {
        max: settings.max_connections,
        per_peer: settings.max_connections_per_peer,
    };
    let http1 = Http1Options {
        header_timeout: (!settings.http_read_header_timeout.is_zero())
            .then_some(settings.http_read_header_timeout),
        budget: pressure.budget.clone(),
        peer_extension: false,
    };
    let grpc_options = GrpcOptions {
        max_connection_age: settings.grpc_max_connection_age,
        max_connection_age_grace: settings.grpc_max_connection_age_grace,
        max_connection_idle: settings.grpc_max_connection_idle,
        handshake_timeout: settings.grpc_handshake_timeout,
        caps,
        tls: settings.grpc_tls.clone(),
        reload_interval: settings.reload_interval,
        budget: pressure.budget.clone(),
        overload: pressure.overload.clone(),
        min_timeout: settings.grpc_min_timeout,
        rlqs: settings.rlqs.clone(),
    };
    (caps, http1, grpc_options)
}

/// The native API on its own port (bound here; served with its address), or beside RLS
/// (returned to be served on the gRPC port).
#[allow(clippy::type_complexity)]
fn serve_limiter_api<'g>(
    settings: &Settings,
    named: Option<NamedApiService>,
    grpc_options: &'g GrpcOptions,
    metrics: &'g Arc<Metrics>,
    stop: &StopSignal,
) -> Result<
    (
        Option<NamedApiService>,
        Option<(
            SocketAddr,
            impl Future<Output = Result<(), ServeError>> + use<'g>,
        )>,
    ),
    ServeError,
> {
    let own_port = settings.limiter_api.as_ref().and_then(|api| api.addr);
    Ok(match (named, own_port) {
        (Some(service), Some(addr)) => {
            let listener = bind(addr)?;
            let addr = listener
                .local_addr()
                .map_err(|source| ServeError::Bind { addr, source })?;
            let serving =
                rls::serve_named_api(listener, grpc_options, service, metrics, stop.stopped())?;
            (None, Some((addr, serving)))
        }
        (named, _) => (named, None),
    })
}

/// Flushes upstream's stats to statsd, when `USE_STATSD`; the flushes stop when the guard is
/// dropped.
fn start_statsd(
    settings: &Settings,
    metrics: &Arc<Metrics>,
    stop: &StopSignal,
) -> Option<AbortOnDrop> {
    let statsd = settings.stats.statsd.as_ref().map(|sink| {
        let options = StatsdOptions {
            addr: sink.addr.clone(),
            dog: sink.dog,
            flush_interval: settings.stats.flush_interval,
        };
        tokio::spawn(sluice::metrics::run_statsd(
            metrics.stats.clone(),
            options,
            metrics.statsd_lines_dropped.clone(),
            stop.stopped(),
        ))
    });
    statsd.map(AbortOnDrop)
}

/// Binds upstream's debug listener and serves it.
fn serve_debug(
    settings: &Settings,
    caps: Caps,
    http1: Http1Options,
    (limiter, admin): (&Arc<RateLimiter>, Option<Admin>),
    metrics: &Arc<Metrics>,
    stop: &StopSignal,
) -> Result<
    (
        SocketAddr,
        impl Future<Output = Result<(), ServeError>> + use<>,
    ),
    ServeError,
> {
    // The admin API logs who reset a counter: the debug listener's requests carry the peer.
    let http1 = Http1Options {
        peer_extension: true,
        ..http1
    };
    let debug_listener = bind(settings.stats.debug_addr)?;
    let debug_addr = debug_listener
        .local_addr()
        .map_err(|source| ServeError::Bind {
            addr: settings.stats.debug_addr,
            source,
        })?;
    let debug = debug::serve(
        LimitedListener {
            listener: debug_listener,
            limit: ConnectionLimit::new(caps, "debug", metrics),
        },
        http1,
        Closed::new("debug", metrics),
        limiter.clone(),
        metrics.clone(),
        admin,
        stop.stopped(),
    );
    Ok((debug_addr, debug))
}

/// Binds the Prometheus listener and serves `/metrics` on it, when configured.
fn serve_prometheus<'s>(
    settings: &'s Settings,
    caps: Caps,
    http1: Http1Options,
    observability: &http::Observability,
    metrics: &Arc<Metrics>,
    stop: &StopSignal,
) -> Result<Option<impl Future<Output = Result<(), ServeError>> + use<'s>>, ServeError> {
    let prometheus = match &settings.prometheus {
        None => None,
        Some(listen) => {
            let listener = bind(listen.addr)?;
            let addr = listener.local_addr().map_err(|source| ServeError::Bind {
                addr: listen.addr,
                source,
            })?;
            tracing::info!(%addr, path = %listen.path, "prometheus metrics listener");
            let listener = LimitedListener {
                listener,
                limit: ConnectionLimit::new(caps, "metrics", metrics),
            };
            let serving = http::serve_metrics(
                listener,
                http1,
                Closed::new("metrics", metrics),
                &listen.path,
                observability.clone(),
                stop.stopped(),
            );
            Some(serving)
        }
    };
    Ok(prometheus)
}

/// Binds the gRPC listener: `GRPC_UDS` when set (in place of TCP, as upstream), else
/// `GRPC_HOST:GRPC_PORT`. Returns what to log as its address, and a guard that removes the
/// socket file when `serve` returns.
fn bind_grpc(
    settings: &Settings,
) -> Result<(GrpcListener, String, Option<RemoveOnDrop>), ServeError> {
    if let Some(path) = &settings.grpc_uds {
        let listener = bind_unix(path)?;
        let guard = RemoveOnDrop(path.clone());
        return Ok((
            GrpcListener::Unix(listener),
            format!("unix:{}", path.display()),
            Some(guard),
        ));
    }
    let listener = bind(settings.grpc_addr)?;
    let addr = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: settings.grpc_addr,
        source,
    })?;
    Ok((GrpcListener::Tcp(listener), addr.to_string(), None))
}

/// Removes a Unix socket file when dropped, as Go's listener does on close.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
