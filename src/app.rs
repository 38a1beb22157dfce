//! Wiring, in one place: builds the stores, the limiters and the listeners from [`Settings`],
//! runs them, and shuts them down. Only this module and `cli` read the settings; everything
//! below takes option structs of its own.
//!
//! Shutdown is handled here and only here: when the `shutdown` future given to [`serve`]
//! completes (SIGTERM/SIGINT in the binary), health turns NOT_SERVING, every listener stops
//! accepting, in-flight requests get `shutdown_grace` to finish, and `serve` returns.
//!
//! The configuration comes from one source (`CONFIG_TYPE`): the file watcher
//! (`server::reload`) or the xDS client (`xds`). Both publish each configuration that loads on
//! a `watch` channel; [`apply_configs`] installs it in the limiter and keeps health in step. Under
//! `FORCE_START_WITHOUT_INITIAL_CONFIG=false` nothing is served until the first one arrives.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::SystemClock;
use crate::config::{self, RateLimitConfig};
use crate::metrics::{Instrumented, Mapper, Metrics, StatStore, StatsdOptions};
use crate::named::NamedLimiters;
use crate::rls::{KeyBuilder, RateLimiter};
use crate::server::connections::{ConnectionLimit, LimitedListener};
use crate::server::serving::{Closed, Http1Options};
use crate::server::{
    Caps, GrpcListener, GrpcOptions, Health, ServeError, bind, bind_unix, debug, http, named,
    reload, rls,
};
use crate::settings::{Backend, ConfigSource, Settings};
use crate::store::breaker::Breaker;
use crate::store::redis::StartupRetry;
use crate::store::{CounterStore, LimiterStore, MemoryStore, RedisOptions, RedisStore};
use crate::xds::XdsClient;

/// Configurations as the config source publishes them: the latest that loaded.
type Configs = watch::Receiver<Option<Arc<RateLimitConfig>>>;

/// Starts the service and runs it until `shutdown` completes.
pub async fn serve(
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    for notice in &settings.notices {
        tracing::warn!("{notice}");
    }
    tracing::info!(store = settings.backend.name(), why = %settings.backend_reason, "store chosen");
    let shutdown = std::pin::pin!(shutdown);
    let mut shutdown = shutdown;
    let metrics = Arc::new(metrics(&settings)?);
    let (configs, _stop_config_source) = start_config_source(&settings, &metrics)?;
    let keys = KeyBuilder::new(&settings.cache_key_prefix)?;
    let clock = Arc::new(SystemClock);
    // Every store is measured; the RLS path sees it as a counter store, the named limiters as a
    // limiter store.
    let counters = |store: Arc<dyn CounterStore>, name| -> Arc<dyn CounterStore> {
        Arc::new(Instrumented::new(store, name, metrics.clone()))
    };
    let limiters = |store: Arc<dyn LimiterStore>, name| -> Arc<dyn LimiterStore> {
        Arc::new(Instrumented::new(store, name, metrics.clone()))
    };
    // Redis stores sit behind a circuit breaker; the RLS path's breakers make the health
    // status. The native API gets a store (pool, batcher and breaker) of its own, so nothing it
    // does can change an RLS answer, RLS health or RLS latency.
    let mut store_usable = Vec::new();
    let mut per_second_store = None;
    let mut memory_store = None;
    let mut named_store = None;
    let mut health_follows_store = false;
    let store: Arc<dyn CounterStore> = match &settings.backend {
        Backend::Memory(options) => {
            let store = Arc::new(MemoryStore::new(options.clone(), clock.clone()));
            memory_store = Some(store.clone());
            named_store = Some(limiters(store.clone(), "memory"));
            counters(store, "memory")
        }
        Backend::Redis {
            options,
            per_second,
            startup,
            start_degraded,
            health_follows_redis,
        } => {
            health_follows_store = *health_follows_redis;
            // Starting degraded means not blocking on Redis: without a wait limit, try once.
            let degraded = *start_degraded;
            let wait = StartupRetry {
                max_elapsed: if degraded {
                    startup.max_elapsed.or(Some(std::time::Duration::ZERO))
                } else {
                    startup.max_elapsed
                },
                ..startup.clone()
            };
            let main = open_redis(options, &wait, degraded, &settings).await?;
            metrics.observe_redis_pool("redis_pool", main.inner().connections());
            if settings.rls.stop_increment_when_over {
                warn_partial_stop(options, per_second.is_some());
            }
            store_usable.push(("redis", main.usable(), HealthRole::Counts));
            if let Some(options) = per_second {
                let store = open_redis(options, &wait, degraded, &settings).await?;
                metrics.observe_redis_pool("redis_per_second_pool", store.inner().connections());
                store_usable.push(("redis_per_second", store.usable(), HealthRole::Counts));
                per_second_store = Some(counters(Arc::new(store), "redis_per_second"));
            }
            if settings.limiter_api.is_some() {
                let store = open_redis(options, &wait, true, &settings).await?;
                store_usable.push(("redis_limiter_api", store.usable(), HealthRole::Ignored));
                named_store = Some(limiters(Arc::new(store), "redis"));
            }
            counters(Arc::new(main), "redis")
        }
    };
    let api_and_store = settings.limiter_api.as_ref().zip(named_store);
    let named = api_and_store.map(|(api, store)| {
        if api.token.is_none()
            && settings
                .grpc_tls
                .as_ref()
                .is_none_or(|t| t.client_ca.is_none())
        {
            tracing::warn!(
                "the Limiter API is enabled without LIMITER_API_TOKEN or client certificates \
                 (GRPC_CLIENT_TLS_CACERT): anyone who reaches its port can create limiters"
            );
        }
        let limiters = Arc::new(
            NamedLimiters::new(store, keys.clone(), settings.limiter_max_wait)
                .with_bounds(api.bounds),
        );
        if !api.bounds.idle.is_zero() {
            // Idle limiters are looked for a few times per idle period, at least once a minute.
            let every =
                (api.bounds.idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
            let sweeping = NamedLimiters::sweep_idle_forever(Arc::downgrade(&limiters), every);
            tokio::spawn(sweeping);
        }
        named::service(limiters, api.token.as_deref())
    });
    let mut limiter =
        RateLimiter::new(store, keys, clock, settings.rls.clone()).with_metrics(metrics.clone());
    if let Some(store) = per_second_store {
        limiter = limiter.with_per_second_store(store);
    }
    let limiter = Arc::new(limiter);
    let mut configs = configs;
    if !settings.config_source.force_start && configs.borrow().is_none() {
        tracing::info!("waiting for the first rate limit configuration before serving");
        tokio::select! {
            first = configs.wait_for(Option::is_some) => {
                // The sender lives as long as the source's task, which never ends by itself.
                if first.is_err() {
                    return Ok(());
                }
            }
            () = &mut shutdown => return Ok(()),
        }
    }
    if let Some(config) = configs.borrow().clone() {
        limiter.set_config(config);
    } else {
        tracing::warn!(
            "serving without a rate limit configuration (FORCE_START_WITHOUT_INITIAL_CONFIG): \
             requests are answered \"no rate limit configuration loaded\" until one arrives"
        );
    }
    tracing::info!(store = limiter.store_kind(), "rate limiter ready");

    let (grpc_listener, grpc_addr, _remove_socket) = bind_grpc(&settings)?;
    let http_listener = bind(settings.http_addr)?;
    let http_addr = http_listener
        .local_addr()
        .map_err(|source| ServeError::Bind {
            addr: settings.http_addr,
            source,
        })?;

    let (reporter, health_service) = tonic_health::server::health_reporter();
    let needs_a_domain = settings.config_source.healthy_needs_a_domain;
    let health = Health::new(
        reporter,
        config_ok(configs.borrow().as_deref(), needs_a_domain),
    )
    .await;
    let applying = apply_configs(configs, limiter.clone(), health.clone(), needs_a_domain);
    let _stop_applying = AbortOnDrop(tokio::spawn(applying));
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };

    if !store_usable.is_empty() {
        if !health_follows_store {
            tracing::info!(
                "health follows Redis only until it first answers, as upstream; set \
                 REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true to turn it NOT_SERVING whenever a \
                 Redis circuit breaker is open"
            );
        }
        tokio::spawn(follow_stores(
            health.clone(),
            metrics.clone(),
            store_usable,
            health_follows_store,
        ));
    }

    let caps = Caps {
        max: settings.max_connections,
        per_peer: settings.max_connections_per_peer,
    };
    let http1 = Http1Options {
        header_timeout: (!settings.http_read_header_timeout.is_zero())
            .then_some(settings.http_read_header_timeout),
    };
    let grpc_options = GrpcOptions {
        max_connection_age: settings.grpc_max_connection_age,
        max_connection_age_grace: settings.grpc_max_connection_age_grace,
        max_connection_idle: settings.grpc_max_connection_idle,
        handshake_timeout: settings.grpc_handshake_timeout,
        caps,
        tls: settings.grpc_tls.clone(),
        reload_interval: settings.reload_interval,
    };
    // The native API on its own port, or beside RLS.
    let own_port = settings.limiter_api.as_ref().and_then(|api| api.addr);
    let (shared_api, limiter_api) = match (named, own_port) {
        (Some(service), Some(addr)) => {
            let listener = bind(addr)?;
            let addr = listener
                .local_addr()
                .map_err(|source| ServeError::Bind { addr, source })?;
            let serving =
                rls::serve_named_api(listener, &grpc_options, service, &metrics, stopped())?;
            (None, Some((addr, serving)))
        }
        (named, _) => (named, None),
    };
    let limiter_api_addr = limiter_api.as_ref().map(|(addr, _)| *addr);
    let grpc = rls::serve(
        grpc_listener,
        &grpc_options,
        limiter.clone(),
        metrics.clone(),
        shared_api,
        health_service,
        stopped(),
    )?;
    let statsd = settings.stats.statsd.as_ref().map(|sink| {
        let options = StatsdOptions {
            addr: sink.addr.clone(),
            dog: sink.dog,
            flush_interval: settings.stats.flush_interval,
        };
        tokio::spawn(crate::metrics::run_statsd(
            metrics.stats.clone(),
            options,
            metrics.statsd_lines_dropped.clone(),
            stopped(),
        ))
    });
    let _stop_statsd = statsd.map(AbortOnDrop);
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
            limit: ConnectionLimit::new(caps, "debug", &metrics),
        },
        http1,
        Closed::new("debug", &metrics),
        limiter.clone(),
        metrics.clone(),
        stopped(),
    );
    let observability = http::Observability {
        metrics: metrics.clone(),
        memory_store,
    };
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
                limit: ConnectionLimit::new(caps, "metrics", &metrics),
            };
            let serving = http::serve_metrics(
                listener,
                http1,
                Closed::new("metrics", &metrics),
                &listen.path,
                observability.clone(),
                stopped(),
            );
            Some(serving)
        }
    };
    let http_listener = LimitedListener {
        listener: http_listener,
        limit: ConnectionLimit::new(caps, "http", &metrics),
    };
    let http = http::serve(
        http_listener,
        http1,
        Closed::new("http", &metrics),
        limiter.clone(),
        health.clone(),
        observability,
        stopped(),
    );
    // Poll `shutdown` once before telling anyone we listen: the SIGTERM handler is installed on
    // its first poll, and a SIGTERM that came before it would kill the process outright.
    tokio::pin!(shutdown);
    tokio::select! {
        biased;
        () = &mut shutdown => return Ok(()),
        () = std::future::ready(()) => {}
    }
    match limiter_api_addr {
        Some(limiter) => tracing::info!(
            grpc = %grpc_addr, http = %http_addr, debug = %debug_addr, %limiter,
            "sluice is listening"
        ),
        None => tracing::info!(
            grpc = %grpc_addr, http = %http_addr, debug = %debug_addr, "sluice is listening"
        ),
    }

    let prometheus = async {
        match prometheus {
            Some(serving) => serving.await,
            None => Ok(()),
        }
    };
    let limiter_api = async {
        match limiter_api {
            Some((_, serving)) => serving.await,
            None => Ok(()),
        }
    };
    let servers = async { tokio::try_join!(grpc, http, prometheus, limiter_api, debug) };
    tokio::pin!(servers);
    tokio::select! {
        result = &mut servers => {
            result?;
            return Ok(());
        }
        () = &mut shutdown => {}
    }

    tracing::info!(grace = ?settings.shutdown_grace, "shutting down");
    health.set_not_serving().await;
    let _ = stop_tx.send(true);
    match tokio::time::timeout(settings.shutdown_grace, servers).await {
        Ok(result) => result.map(|_| ()),
        Err(_) => {
            tracing::warn!("in-flight requests did not finish within the grace period");
            Ok(())
        }
    }
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

/// The loaded config files, for the start-up log.
fn list_files(files: &[std::path::PathBuf]) -> String {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    names.join(", ")
}

/// Loads the first configuration from files (xDS sends its own when it connects) and starts the
/// task that follows the source. The task stops when the returned guard is dropped.
fn start_config_source(
    settings: &Settings,
    metrics: &Arc<Metrics>,
) -> Result<(Configs, Option<AbortOnDrop>), ServeError> {
    let (publish, configs) = watch::channel(None);
    let force_start = settings.config_source.force_start;
    let task = match &settings.config_source.source {
        ConfigSource::Files => {
            let dir = &settings.config_dir;
            match config::load_dir(dir, &settings.load) {
                Ok(config) => {
                    for warning in &config.warnings {
                        tracing::warn!(%warning, "config");
                    }
                    metrics.config_load_success.inc();
                    let (domains, limits) = (config.domain_names().count(), config.limits().len());
                    let files = list_files(&config.files);
                    tracing::info!(
                        dir = %dir.display(), %files, domains, limits, "configuration loaded"
                    );
                    publish.send_replace(Some(Arc::new(config)));
                }
                Err(errors) if force_start => {
                    metrics.config_load_error.inc();
                    tracing::error!(%errors, "configuration refused; starting without one \
                        (FORCE_START_WITHOUT_INITIAL_CONFIG) and watching for a good one");
                }
                Err(errors) => return Err(errors.into()),
            }
            (!settings.reload_interval.is_zero()).then(|| {
                tokio::spawn(reload::watch(
                    dir.clone(),
                    settings.load.clone(),
                    publish,
                    metrics.clone(),
                    settings.reload_interval,
                ))
            })
        }
        ConfigSource::Xds(options) => {
            tracing::info!(
                "CONFIG_TYPE=GRPC_XDS_SOTW: configuration files (RUNTIME_*) are not read"
            );
            let client = XdsClient::new((**options).clone())
                .map_err(|e| ServeError::ConfigSource(Box::new(e)))?;
            Some(tokio::spawn(client.run(metrics.clone(), publish)))
        }
    };
    Ok((configs, task.map(AbortOnDrop)))
}

/// Whether health may say SERVING with this configuration in force.
fn config_ok(config: Option<&RateLimitConfig>, needs_a_domain: bool) -> bool {
    !needs_a_domain || config.is_some_and(|c| c.domain_names().next().is_some())
}

/// Installs every configuration the source publishes; counters survive, as their keys do not
/// depend on the configuration object.
async fn apply_configs(
    mut configs: Configs,
    limiter: Arc<RateLimiter>,
    health: Health,
    needs_a_domain: bool,
) {
    while configs.changed().await.is_ok() {
        let Some(config) = configs.borrow_and_update().clone() else {
            continue;
        };
        limiter.set_config(config.clone());
        if needs_a_domain {
            health.set_config_ok(config_ok(Some(&config), true)).await;
        }
    }
}

/// Ends a background task when `serve` returns, however it returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Connects a Redis store behind its circuit breaker, waiting for Redis as configured.
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` is decided per store call: says so when a
/// request's descriptors can go to several calls (README, "What differs").
fn warn_partial_stop(options: &RedisOptions, per_second: bool) {
    if matches!(options.target, crate::store::redis::Target::Cluster(_)) {
        tracing::warn!(
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT on a Redis Cluster: descriptors whose keys \
             are in different slots are decided by separate script calls, so one going over \
             stops the counting only of the descriptors in its own slot"
        );
    }
    if per_second {
        tracing::warn!(
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT with REDIS_PERSECOND: per-second limits \
             and the others are decided by separate stores, so one going over stops the \
             counting only of descriptors in its own store"
        );
    }
}

async fn open_redis(
    options: &RedisOptions,
    retry: &StartupRetry,
    start_degraded: bool,
    settings: &Settings,
) -> Result<Breaker<RedisStore>, ServeError> {
    let store_error = |source| ServeError::Store {
        backend: "redis",
        source,
    };
    let store = RedisStore::new(options.clone()).map_err(store_error)?;
    tracing::info!(target = ?options.target, "waiting for redis");
    let ready = store.wait_until_ready(retry).await;
    let breaker = Breaker::new(store, settings.breaker.clone());
    match ready {
        Ok(()) => {}
        Err(e) if start_degraded => {
            tracing::warn!(error = %e, "redis is not ready; starting degraded");
            breaker.force_open();
        }
        Err(e) => return Err(store_error(e)),
    }
    Ok(breaker)
}

/// Whether a store's breaker takes part in the health status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HealthRole {
    /// The RLS path's stores: Envoy's answers depend on them.
    Counts,
    /// The native API's store: only its own gauge follows it.
    Ignored,
}

/// Keeps the breaker gauges current, and health SERVING only while every RLS store's breaker is
/// closed: until they have all been closed once (a start degraded waits for Redis), and after
/// that only when `keep_following` (`REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`). Upstream's health
/// likewise waits for Redis's first answer and, without that variable, ignores Redis after it.
async fn follow_stores(
    health: Health,
    metrics: Arc<Metrics>,
    mut stores: Vec<(&'static str, watch::Receiver<bool>, HealthRole)>,
    keep_following: bool,
) {
    let mut following = true;
    loop {
        let mut all = true;
        for (name, usable, counts) in &mut stores {
            let usable = *usable.borrow_and_update();
            metrics
                .breaker_open
                .with_label_values(&[*name])
                .set(i64::from(!usable));
            all &= usable || *counts == HealthRole::Ignored;
        }
        if following {
            health.set_store_usable(all).await;
            following = keep_following || !all;
        }
        let changes = stores.iter_mut().map(|(_, s, _)| Box::pin(s.changed()));
        if futures::future::select_all(changes).await.0.is_err() {
            return;
        }
    }
}

/// The metrics, with upstream's stats mapped and tagged as the settings say. A mapper file that
/// does not load stops the start-up (upstream would carry on with unmapped names).
fn metrics(settings: &Settings) -> Result<Metrics, ServeError> {
    let stats = &settings.stats;
    let mapper = match &stats.mapper_file {
        Some(path) => Mapper::from_file(path)?,
        None => Mapper::upstream_default(),
    };
    if !stats.enabled {
        tracing::info!("upstream's stats are off (DISABLE_STATS=true)");
    }
    if let Some(sink) = &stats.statsd {
        tracing::info!(
            addr = %sink.addr,
            protocol = if sink.dog { "DogStatsD over UDP" } else { "statsd over TCP" },
            flush_interval = ?stats.flush_interval,
            "upstream's stats go to statsd (USE_STATSD is true unless set to false, as upstream)"
        );
    }
    let store = StatStore::new(
        stats.enabled,
        mapper,
        stats.extra_tags.clone(),
        stats.statsd.is_some(),
    );
    if stats.response_time_in_ms {
        tracing::info!(
            "ratelimit_service_response_time_seconds counts milliseconds, as upstream's legacy \
             series (PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS)"
        );
    }
    Ok(Metrics::with_stats(settings.near_limit_ratio, store)
        .with_response_time_in_ms(stats.response_time_in_ms)
        .with_detailed_series_cap(stats.max_detailed_series))
}
