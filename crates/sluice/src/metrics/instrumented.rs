//! Per-operation latency and error metrics around any store (`sluice_store_call_seconds`,
//! `sluice_store_errors_total`), so the request path and the native API are measured in the
//! same place and the stores themselves stay free of metrics.

use std::future::Future;
use std::sync::Arc;

use prometheus::Histogram;

use super::Metrics;
use crate::store::{
    Acquisition, Charging, Check, CounterStore, LimiterKeys, LimiterRecord, LimiterSet,
    LimiterStore, RegistryOp, RegistryReply, SetMode, Store, StoreError, StoreFuture,
};

/// `S` is the store's trait object (`dyn CounterStore` or `dyn LimiterStore`): the wrapper is
/// whichever of the two it wraps.
#[derive(Debug)]
pub struct Instrumented<S: ?Sized> {
    store: Arc<S>,
    /// The `store` label: which store this is (`memory`, `redis`, `redis_per_second`).
    name: &'static str,
    metrics: Arc<Metrics>,
    /// The latency histogram of `check`, which every rate limit request calls: resolved once
    /// rather than looked up by its labels per call.
    check_time: Histogram,
}

impl<S: Store + ?Sized> Instrumented<S> {
    pub fn new(store: Arc<S>, name: &'static str, metrics: Arc<Metrics>) -> Self {
        Self {
            check_time: metrics.store_call.with_label_values(&[name, "check"]),
            store,
            name,
            metrics,
        }
    }

    fn measured<'a, T: Send + 'a>(
        &'a self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>> + Send + 'a,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let timer = match operation {
                "check" => self.check_time.start_timer(),
                _ => self
                    .metrics
                    .store_call
                    .with_label_values(&[self.name, operation])
                    .start_timer(),
            };
            let result = call.await;
            drop(timer);
            if let Err(e) = &result {
                self.metrics
                    .store_errors
                    .with_label_values(&[self.name, operation, e.kind()])
                    .inc();
                if matches!(e, StoreError::Script(_)) {
                    self.metrics
                        .script_errors
                        .with_label_values(&[self.name, operation])
                        .inc();
                }
            }
            result
        })
    }
}

impl<S: Store + ?Sized> Store for Instrumented<S> {
    fn kind(&self) -> &'static str {
        self.store.kind()
    }
}

impl<S: CounterStore + ?Sized> CounterStore for Instrumented<S> {
    fn check_with<'a>(&'a self, checks: &'a [&'a Check], charging: Charging) -> StoreFuture<'a> {
        self.measured("check", self.store.check_with(checks, charging))
    }
}

impl<S: LimiterStore + ?Sized> LimiterStore for Instrumented<S> {
    fn set_limiter<'a>(
        &'a self,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, LimiterSet> {
        self.measured("set_limiter", self.store.set_limiter(keys, record, mode))
    }

    fn get_limiter<'a>(&'a self, keys: &'a LimiterKeys) -> StoreFuture<'a, Option<LimiterRecord>> {
        self.measured("get_limiter", self.store.get_limiter(keys))
    }

    fn delete_limiter<'a>(&'a self, keys: &'a LimiterKeys) -> StoreFuture<'a, bool> {
        self.measured("delete_limiter", self.store.delete_limiter(keys))
    }

    fn acquire<'a>(
        &'a self,
        keys: &'a LimiterKeys,
        permits: u64,
        max_clients: u64,
    ) -> StoreFuture<'a, Acquisition> {
        self.measured("acquire", self.store.acquire(keys, permits, max_clients))
    }

    fn registry<'a>(&'a self, key: &'a str, op: RegistryOp<'a>) -> StoreFuture<'a, RegistryReply> {
        self.measured("registry", self.store.registry(key, op))
    }
}
