//! Building the limiters on the opened stores: the RLS [`RateLimiter`] (with the per-second
//! store, when there is one) and, when `LIMITER_API_ENABLED`, the native API's named limiters
//! with the task that sweeps idle ones; the admin API on the RLS limiter, when
//! `ADMIN_API_TOKEN` is set.

use std::sync::Arc;
use std::time::Duration;

use crate::server::admin::Admin;
use crate::server::named::{self, NamedApiService};
use crate::settings::Settings;
use sluice::clock::SystemClock;
use sluice::metrics::Metrics;
use sluice::named::NamedLimiters;
use sluice::rls::{KeyBuilder, RateLimiter};
use sluice::store::{CounterStore, LimiterStore};

/// The native API's service on the named limiters, when it is enabled and has a store.
pub(super) fn named_api(
    settings: &Settings,
    named_store: Option<Arc<dyn LimiterStore>>,
    keys: &KeyBuilder,
    metrics: &Metrics,
) -> Option<NamedApiService> {
    let api_and_store = settings.limiter_api.as_ref().zip(named_store);
    api_and_store.map(|(api, store)| {
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
        named::service(limiters, api.token.as_deref(), metrics)
    })
}

/// The RLS limiter on `store`, sending per-second limits to `per_second_store` when set.
pub(super) fn rls_limiter(
    settings: &Settings,
    store: Arc<dyn CounterStore>,
    per_second_store: Option<Arc<dyn CounterStore>>,
    keys: KeyBuilder,
    clock: Arc<SystemClock>,
    metrics: &Arc<Metrics>,
) -> Arc<RateLimiter> {
    let mut limiter =
        RateLimiter::new(store, keys, clock, settings.rls.clone()).with_metrics(metrics.clone());
    if let Some(store) = per_second_store {
        limiter = limiter.with_per_second_store(store);
    }
    if let Some(log) = settings.operators.decision_log {
        limiter = limiter.with_decision_log(log);
    }
    Arc::new(limiter)
}

/// The admin API on `limiter`, when `ADMIN_API_TOKEN` is set.
pub(super) fn admin(
    settings: &Settings,
    limiter: &Arc<RateLimiter>,
    metrics: &Metrics,
) -> Option<Admin> {
    let token = settings.operators.admin_token.as_deref()?;
    Some(Admin::new(limiter.clone(), token, metrics))
}
