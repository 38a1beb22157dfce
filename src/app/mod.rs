//! Wiring, in one place: builds the stores, the limiters and the listeners from [`Settings`],
//! runs them, and shuts them down. Only this module and `cli` read the settings; everything
//! below takes option structs of its own.
//!
//! [`serve`] reads as the list of start-up steps, each a function of its own: the metrics, what
//! callers may make the process hold (the request budgets and the overload manager), the
//! config source (`config_source.rs`), the stores with their layers (`stores.rs`, where the
//! layers are stacked: measured → circuit breaker → Redis), the limiters (`limiters.rs`), the
//! first configuration, health, then the listeners (`listeners.rs`).
//!
//! Shutdown is handled here and only here ([`run_until_shutdown`]): when the `shutdown` future
//! given to [`serve`] completes (SIGTERM/SIGINT in the binary), health turns NOT_SERVING, every
//! listener stops accepting, in-flight requests get `shutdown_grace` to finish, and `serve`
//! returns. Background tasks end when their guards ([`AbortOnDrop`]) drop, as `serve` returns.
//!
//! The configuration comes from one source (`CONFIG_TYPE`): the file watcher
//! (`server::reload`) or the xDS client (`xds`). Both publish each configuration that loads on
//! a `watch` channel; `config_source.rs` installs it in the limiter and keeps health in step.
//! Under `FORCE_START_WITHOUT_INITIAL_CONFIG=false` nothing is served until the first one arrives.

mod config_source;
mod limiters;
mod listeners;
mod stores;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use self::config_source::{first_config, follow_configs, start_config_source};
use self::limiters::{named_api, rls_limiter};
use self::listeners::{
    ListenerOptions, MainListeners, Pressure, Served, StopSignal, start_serving,
};
use self::stores::{Stores, open_stores};
use crate::server::{Health, ServeError};
use crate::settings::Settings;
use sluice::clock::SystemClock;
use sluice::metrics::{Mapper, Metrics, StatStore};
use sluice::rls::KeyBuilder;

/// Starts the service and runs it until `shutdown` completes.
pub async fn serve(
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    announce_choices(&settings);
    let mut shutdown = std::pin::pin!(shutdown);
    // Start-up, in order.
    let metrics = Arc::new(metrics(&settings)?);
    let pressure = Pressure::start(&settings, &metrics);
    let (mut configs, _stop_config_source) = start_config_source(&settings, &metrics)?;
    let keys = KeyBuilder::new(&settings.cache_key_prefix)?;
    let clock = Arc::new(SystemClock);
    let Stores {
        counters,
        per_second,
        memory,
        named: named_store,
        health: store_health,
    } = open_stores(&settings, &metrics, &clock).await?;
    let named = named_api(&settings, named_store, &keys, &metrics);
    let limiter = rls_limiter(&settings, counters, per_second, keys, clock, &metrics);
    if !first_config(&settings, &mut configs, &limiter, shutdown.as_mut()).await {
        return Ok(());
    }
    let main_listeners = MainListeners::bind(&settings)?;
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let (health, _stop_applying) = follow_configs(&settings, configs, &limiter, reporter).await;
    store_health.follow(&health, &metrics);
    let stop = StopSignal::new();
    let served = Served {
        admin: limiters::admin(&settings, &limiter, &metrics),
        limiter,
        named,
        health: health.clone(),
        health_service,
        memory_store: memory,
    };
    let options = ListenerOptions::new(&settings, &pressure);
    let serving = start_serving(&settings, &options, main_listeners, served, &metrics, &stop)?;

    // Poll `shutdown` once before telling anyone we listen: the SIGTERM handler is installed on
    // its first poll, and a SIGTERM that came before it would kill the process outright.
    tokio::select! {
        biased;
        () = &mut shutdown => return Ok(()),
        () = std::future::ready(()) => {}
    }
    serving.announce();
    run_until_shutdown(
        serving.servers,
        shutdown,
        &health,
        &stop,
        settings.shutdown_grace,
    )
    .await
}

/// Logs what the settings chose that an operator should know: notices about variables, and
/// the store.
fn announce_choices(settings: &Settings) {
    for notice in &settings.notices {
        tracing::warn!("{notice}");
    }
    tracing::info!(store = settings.backend.name(), why = %settings.backend_reason, "store chosen");
}

/// Serves until `shutdown` completes (or a listener ends), then shuts down, the one place
/// that does: health NOT_SERVING, every listener told to stop, and in-flight requests given
/// `grace` to finish.
async fn run_until_shutdown<S: Future<Output = ()>>(
    servers: impl Future<Output = Result<(), ServeError>>,
    mut shutdown: Pin<&mut S>,
    health: &Health,
    stop: &StopSignal,
    grace: Duration,
) -> Result<(), ServeError> {
    tokio::pin!(servers);
    tokio::select! {
        result = &mut servers => {
            result?;
            return Ok(());
        }
        () = &mut shutdown => {}
    }

    tracing::info!(grace = ?grace, "shutting down");
    health.set_not_serving().await;
    stop.stop();
    match tokio::time::timeout(grace, servers).await {
        Ok(result) => result.map(|_| ()),
        Err(_) => {
            tracing::warn!("in-flight requests did not finish within the grace period");
            Ok(())
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
