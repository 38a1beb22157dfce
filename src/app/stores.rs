//! Opening the stores: the one the RLS path counts in, the per-second one (`REDIS_PERSECOND`),
//! the native API's, and the breakers health follows. Every store gets its layers in one place
//! ([`Layers::stack`]): with `FAILURE_POLICY=local_share` (Redis) decided locally while the
//! store fails, measured, then (Redis) behind a circuit breaker. The native API gets a Redis
//! store (pool, batcher and breaker) of its own, so nothing it does can change an RLS answer,
//! RLS health or RLS latency.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

use crate::server::{Health, ServeError};
use crate::settings::{Backend, DegradedOptions, Settings};
use sluice::clock::SystemClock;
use sluice::metrics::Metrics;
use sluice::rls::FailurePolicy;
use sluice::store::layers::Layered;
use sluice::store::layers::breaker::Breaker;
use sluice::store::layers::local_share::{LocalShare, OnDegraded, Replicas};
use sluice::store::layers::measured::Measured;
use sluice::store::redis::StartupRetry;
use sluice::store::{CounterStore, FullStore, LimiterStore, MemoryStore, RedisOptions, RedisStore};

/// The stores [`open_stores`] opened, each already with its layers ([`Layers::stack`]).
pub(super) struct Stores {
    /// Where the RLS path counts.
    pub(super) counters: Arc<dyn CounterStore>,
    /// Where limits whose unit is the second go (`REDIS_PERSECOND`).
    pub(super) per_second: Option<Arc<dyn CounterStore>>,
    /// The memory store, whose figures `/metrics` shows.
    pub(super) memory: Option<Arc<MemoryStore>>,
    /// The named limiters' store, when the native API can have one.
    pub(super) named: Option<Arc<dyn LimiterStore>>,
    /// The breakers health follows.
    pub(super) health: StoreHealth,
}

/// A Redis store behind its circuit breaker, shared: health follows the breaker, its probe and
/// the replica count reach the store through it.
type GuardedRedis = Arc<Layered<Breaker, RedisStore>>;

/// What every store's layers are made of.
struct Layers<'a> {
    metrics: &'a Arc<Metrics>,
    settings: &'a Settings,
    /// With `FAILURE_POLICY=local_share`: what its layers share.
    local_share: Option<LocalShareParts>,
}

/// What every `local_share` layer of one process shares: the in-process store the decisions
/// run on (one bound for all) and the replica count.
struct LocalShareParts {
    local: Arc<MemoryStore>,
    replicas: Arc<Replicas>,
    /// The key replicas count themselves under (`prefix{sluice_replicas}`).
    replicas_key: String,
    /// Whether a Redis store already learns the replica count (one is enough: same Redis).
    learning: AtomicBool,
}

impl LocalShareParts {
    fn new(options: &DegradedOptions, prefix: &str, clock: &Arc<SystemClock>) -> Self {
        let replicas = Replicas::new(options.replicas);
        Self {
            local: Arc::new(MemoryStore::new(options.memory.clone(), clock.clone())),
            replicas_key: format!("{prefix}{{sluice_replicas}}"),
            learning: (replicas.is_configured()).into(),
            replicas,
        }
    }

    /// Starts learning the replica count from `store`'s Redis, unless configured or learning;
    /// `sluice_degraded_replicas` shows the count in use.
    fn learn_from(&self, store: &GuardedRedis, metrics: &Arc<Metrics>) {
        let gauge = metrics.degraded_replicas.clone();
        gauge.set(self.replicas.count() as i64);
        if !self.learning.swap(true, Ordering::Relaxed) {
            let learn = self.replicas.clone().learn_forever(
                Arc::downgrade(store),
                Layered::store,
                self.replicas_key.clone(),
                move |count| gauge.set(count as i64),
            );
            tokio::spawn(learn);
        }
    }

    /// The layer that decides locally, its decisions counted under `name`.
    fn layer(&self, name: &'static str, metrics: &Arc<Metrics>) -> LocalShare {
        let counter = metrics.degraded_decisions.with_label_values(&[name]);
        let on_degraded: OnDegraded = Arc::new(move || counter.inc());
        LocalShare::new(self.local.clone(), self.replicas.clone(), on_degraded)
    }
}

impl Layers<'_> {
    /// `store` with every layer it gets, outermost first: decided locally while it fails
    /// (`local`: the name its local decisions are counted under, for a Redis store with
    /// `FAILURE_POLICY=local_share`) → measured under `name` → the store. The one place where
    /// store layers are stacked: a new layer is a line here.
    fn stack<S: FullStore + 'static>(
        &self,
        store: S,
        name: &'static str,
        local: Option<&'static str>,
    ) -> Arc<dyn FullStore> {
        let measured = Layered::new(Measured::new(name, self.metrics.store_measures()), store);
        match (&self.local_share, local) {
            (Some(parts), Some(local)) => {
                Arc::new(Layered::new(parts.layer(local, self.metrics), measured))
            }
            _ => Arc::new(measured),
        }
    }

    /// The part the RLS path's Redis stores play in health: under `local_share` a replica whose
    /// Redis is down still decides every call, so it stays ready, degraded.
    fn health_role(&self) -> HealthRole {
        match self.local_share {
            Some(_) => HealthRole::Degrades,
            None => HealthRole::Counts,
        }
    }

    /// A Redis store behind its breaker, with its layers; `local` as for [`Self::stack`].
    fn on_redis(
        &self,
        store: GuardedRedis,
        name: &'static str,
        local: &'static str,
    ) -> Arc<dyn FullStore> {
        if let Some(parts) = &self.local_share {
            parts.learn_from(&store, self.metrics);
        }
        self.stack(store, name, Some(local))
    }

    /// Connects a Redis store behind its circuit breaker, waiting for Redis as configured; its
    /// own probe runs while the breaker is open ([`probed`]).
    async fn redis(
        &self,
        options: &RedisOptions,
        retry: &StartupRetry,
        start_degraded: bool,
    ) -> Result<GuardedRedis, ServeError> {
        let store_error = |source| ServeError::Store {
            backend: "redis",
            source,
        };
        let store = RedisStore::new(options.clone()).map_err(store_error)?;
        tracing::info!(target = ?options.target, "waiting for redis");
        let ready = store.wait_until_ready(retry).await;
        let breaker = Breaker::new(self.settings.breaker.clone());
        match ready {
            Ok(()) => {}
            Err(e) if start_degraded => {
                tracing::warn!(error = %e, "redis is not ready; starting degraded");
                breaker.force_open();
            }
            Err(e) => return Err(store_error(e)),
        }
        Ok(probed(Layered::new(breaker, store)))
    }
}

/// A Redis store's breaker, shared, with its own probe running while it is open: a replica
/// taken out of service by its health (which follows the breaker) gets no calls to probe with.
fn probed(guarded: Layered<Breaker, RedisStore>) -> GuardedRedis {
    let guarded = Arc::new(guarded);
    tokio::spawn(Layered::probe_while_open(
        Arc::downgrade(&guarded),
        RedisStore::probe,
    ));
    guarded
}

/// Opens the store `BACKEND_TYPE` names, waiting for Redis as configured.
pub(super) async fn open_stores(
    settings: &Settings,
    metrics: &Arc<Metrics>,
    clock: &Arc<SystemClock>,
) -> Result<Stores, ServeError> {
    let layers = Layers {
        metrics,
        settings,
        local_share: local_share_parts(settings, clock),
    };
    let mut store_usable = Vec::new();
    let mut per_second_store = None;
    let mut memory_store = None;
    let mut named_store = None;
    let mut health_follows_store = false;
    let rls_role = layers.health_role();
    let store: Arc<dyn CounterStore> = match &settings.backend {
        Backend::Memory(options) => {
            let store = Arc::new(MemoryStore::new(options.clone(), clock.clone()));
            memory_store = Some(store.clone());
            let store = layers.stack(store, "memory", None);
            named_store = Some(store.clone() as _);
            store
        }
        Backend::Redis {
            options,
            per_second,
            startup,
            start_degraded,
            health_follows_redis,
            ..
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
            let main = layers.redis(options, &wait, degraded).await?;
            metrics.observe_redis_pool("redis_pool", main.store().connections());
            if settings.rls.stop_increment_when_over {
                warn_partial_stop(options, per_second.is_some());
            }
            store_usable.push(("redis", main.layer().usable(), rls_role));
            if let Some(options) = per_second {
                let store = layers.redis(options, &wait, degraded).await?;
                metrics.observe_redis_pool("redis_per_second_pool", store.store().connections());
                let usable = store.layer().usable();
                store_usable.push(("redis_per_second", usable, rls_role));
                per_second_store =
                    Some(layers.on_redis(store, "redis_per_second", "redis_per_second") as _);
            }
            if settings.limiter_api.is_some() {
                let store = layers.redis(options, &wait, true).await?;
                let usable = store.layer().usable();
                store_usable.push(("redis_limiter_api", usable, HealthRole::Ignored));
                // Its local decisions are counted apart from the RLS path's.
                named_store = Some(layers.on_redis(store, "redis", "redis_limiter_api") as _);
            }
            layers.on_redis(main, "redis", "redis")
        }
    };
    Ok(Stores {
        counters: store,
        per_second: per_second_store,
        memory: memory_store,
        named: named_store,
        health: StoreHealth {
            usable: store_usable,
            follows: health_follows_store,
        },
    })
}

/// The parts of `FAILURE_POLICY=local_share`'s layers, when it is on and the store is Redis
/// (the memory store cannot fail).
fn local_share_parts(settings: &Settings, clock: &Arc<SystemClock>) -> Option<LocalShareParts> {
    let Backend::Redis { degraded, .. } = &settings.backend else {
        if settings.rls.failure_policy == FailurePolicy::LocalShare {
            tracing::info!(
                "FAILURE_POLICY=local_share has nothing to do: the memory store does not fail"
            );
        }
        return None;
    };
    (settings.rls.failure_policy == FailurePolicy::LocalShare)
        .then(|| LocalShareParts::new(degraded, &settings.cache_key_prefix, clock))
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` is decided per store call: says so when a
/// request's descriptors can go to several calls (docs/upstream-differences.md).
fn warn_partial_stop(options: &RedisOptions, per_second: bool) {
    if matches!(options.target, sluice::store::redis::Target::Cluster(_)) {
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

/// Whether a store's breaker takes part in the health status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HealthRole {
    /// The RLS path's stores: Envoy's answers depend on them.
    Counts,
    /// The RLS path's stores under `FAILURE_POLICY=local_share`: while one is open the replica
    /// still decides every call, with its share, so it stays ready and is marked degraded.
    Degrades,
    /// The native API's store: only its own gauge follows it.
    Ignored,
}

/// Keeps the breaker gauges current, and health SERVING only while every RLS store's breaker is
/// closed: until they have all been closed once (a start degraded waits for Redis), and after
/// that only when `keep_following` (`REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`). Upstream's health
/// likewise waits for Redis's first answer and, without that variable, ignores Redis after it.
/// Under `local_share` (`HealthRole::Degrades`) an open breaker after that first answer leaves
/// health SERVING and marks it degraded (`sluice_serving_degraded`, `/healthcheck`'s body).
async fn follow_stores(
    health: Health,
    metrics: Arc<Metrics>,
    mut stores: Vec<(&'static str, watch::Receiver<bool>, HealthRole)>,
    keep_following: bool,
) {
    let mut started = false;
    loop {
        let (mut closed, mut degraded) = (true, false);
        for (name, usable, role) in &mut stores {
            let usable = *usable.borrow_and_update();
            metrics
                .breaker_open
                .with_label_values(&[*name])
                .set(i64::from(!usable));
            match role {
                HealthRole::Degrades if started => degraded |= !usable,
                HealthRole::Counts | HealthRole::Degrades => closed &= usable,
                HealthRole::Ignored => {}
            }
        }
        if !started || keep_following {
            health.set_store_usable(closed).await;
        }
        started |= closed;
        health.set_degraded(degraded);
        metrics.serving_degraded.set(i64::from(degraded));
        let changes = stores.iter_mut().map(|(_, s, _)| Box::pin(s.changed()));
        if futures::future::select_all(changes).await.0.is_err() {
            return;
        }
    }
}

/// The breakers of the stores [`open_stores`] opened, with their role in health.
pub(super) struct StoreHealth {
    usable: Vec<(&'static str, watch::Receiver<bool>, HealthRole)>,
    /// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`.
    follows: bool,
}

impl StoreHealth {
    /// Starts [`follow_stores`] when there are breakers to follow (Redis).
    pub(super) fn follow(self, health: &Health, metrics: &Arc<Metrics>) {
        let (store_usable, health_follows_store) = (self.usable, self.follows);
        if !store_usable.is_empty() {
            let degrades = store_usable
                .iter()
                .any(|(_, _, role)| *role == HealthRole::Degrades);
            if degrades {
                tracing::info!(
                    "FAILURE_POLICY=local_share: health stays SERVING while Redis is down, since \
                     every call is still decided with this replica's share; \
                     sluice_serving_degraded and /healthcheck's body say so"
                );
            } else if !health_follows_store {
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
    }
}
