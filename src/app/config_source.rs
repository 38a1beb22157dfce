//! The configuration source (`CONFIG_TYPE`): the file watcher (`server::reload`) or the xDS
//! client (`xds`). Both publish each configuration that loads on a `watch` channel; this module
//! starts the source, holds off serving until the first configuration arrives (unless
//! `FORCE_START_WITHOUT_INITIAL_CONFIG`), and installs every later one in the limiter
//! ([`apply_configs`]), keeping health in step.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;
use tonic_health::server::HealthReporter;

use super::AbortOnDrop;
use crate::server::{Health, ServeError, reload};
use crate::settings::{ConfigSource, Settings};
use crate::xds::XdsClient;
use sluice::config::{self, RateLimitConfig};
use sluice::metrics::Metrics;
use sluice::rls::RateLimiter;

/// Configurations as the config source publishes them: the latest that loaded.
pub(super) type Configs = watch::Receiver<Option<Arc<RateLimitConfig>>>;

/// Loads the first configuration from files (xDS sends its own when it connects) and starts the
/// task that follows the source. The task stops when the returned guard is dropped.
pub(super) fn start_config_source(
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

/// The loaded config files, for the start-up log.
fn list_files(files: &[std::path::PathBuf]) -> String {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    names.join(", ")
}

/// Installs the first configuration in the limiter. Unless `FORCE_START_WITHOUT_INITIAL_CONFIG`,
/// waits for it first; returns false when `shutdown` came first (or the source ended), and
/// nothing is to be served.
pub(super) async fn first_config<S: Future<Output = ()>>(
    settings: &Settings,
    configs: &mut Configs,
    limiter: &RateLimiter,
    mut shutdown: Pin<&mut S>,
) -> bool {
    if !settings.config_source.force_start && configs.borrow().is_none() {
        tracing::info!("waiting for the first rate limit configuration before serving");
        tokio::select! {
            first = configs.wait_for(Option::is_some) => {
                // The sender lives as long as the source's task, which never ends by itself.
                if first.is_err() {
                    return false;
                }
            }
            () = &mut shutdown => return false,
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
    true
}

/// Health, SERVING as far as the configuration in force allows, and the task that installs
/// every later configuration ([`apply_configs`]); the task ends when the guard is dropped.
pub(super) async fn follow_configs(
    settings: &Settings,
    configs: Configs,
    limiter: &Arc<RateLimiter>,
    reporter: HealthReporter,
) -> (Health, AbortOnDrop) {
    let needs_a_domain = settings.config_source.healthy_needs_a_domain;
    let health = Health::new(
        reporter,
        config_ok(configs.borrow().as_deref(), needs_a_domain),
    )
    .await;
    let applying = apply_configs(configs, limiter.clone(), health.clone(), needs_a_domain);
    (health, AbortOnDrop(tokio::spawn(applying)))
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
