//! The library inside the test process, for tests of the limits below the service (the
//! service's own start a [`Sluice`](crate::Sluice)): its stores and `RateLimiter` on a pinned
//! clock, and its config loader. On the clock the memory store and the Redis scripts both read
//! (Redis's through `RedisOptions::pinned_clock`), what a test says about windows and resets
//! holds however slow the machine is.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice::clock::ManualClock;
use sluice::config::{LoadOptions, load_sources};
use sluice::rls::{KeyBuilder, RateLimiter, RlsOptions};
use sluice::store::redis::StartupRetry;
use sluice::store::{CounterStore, MemoryStore, MemoryStoreOptions, RedisOptions, RedisStore};

use crate::{RedisServer, StoreKind};

/// A store of `kind` on `clock`; for `StoreKind::Redis`, on `redis`, with a pool of 4 (tests
/// that ask from several tasks at once wait for no connection) and a 30 s timeout (a busy
/// machine is slow, never wrong), ready to answer.
pub async fn pinned_store(
    kind: StoreKind,
    redis: Option<&RedisServer>,
    clock: &Arc<ManualClock>,
) -> Arc<dyn CounterStore> {
    match kind {
        StoreKind::Memory => Arc::new(MemoryStore::new(
            MemoryStoreOptions::default(),
            clock.clone(),
        )),
        StoreKind::Redis => {
            let server = redis.expect("a Redis store has a server");
            let store = RedisStore::new(RedisOptions {
                pool_size: 4,
                timeout: Duration::from_secs(30),
                pinned_clock: Some(clock.clone()),
                ..server.store_options()
            })
            .expect("the store starts");
            // Awaited, never `futures::executor::block_on`: inside the test's runtime that spins
            // for ever once the task's cooperative budget is spent.
            store
                .wait_until_ready(&StartupRetry::within(Some(Duration::from_secs(30))))
                .await
                .expect("redis is ready");
            Arc::new(store)
        }
    }
}

/// A `RateLimiter` on `store` and `clock` with `options`, the limits of `yaml` (one config
/// file, `limits.yaml`) in force.
pub fn pinned_limiter(
    store: Arc<dyn CounterStore>,
    clock: &Arc<ManualClock>,
    yaml: &str,
    options: RlsOptions,
) -> RateLimiter {
    let limiter = RateLimiter::new(store, KeyBuilder::default(), clock.clone(), options);
    let config = load_sources(
        vec![(PathBuf::from("limits.yaml"), yaml.to_string())],
        &LoadOptions::default(),
    )
    .expect("test config loads");
    limiter.set_config(Arc::new(config));
    limiter
}

/// The loader's error for `yaml` as the file `bad.yaml`, as `check-config` prints it.
pub fn load_error(yaml: &str) -> String {
    load_sources(
        vec![(PathBuf::from("bad.yaml"), yaml.to_string())],
        &LoadOptions::default(),
    )
    .expect_err("the config is refused")
    .to_string()
}
