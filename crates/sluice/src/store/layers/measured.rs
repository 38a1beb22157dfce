//! Per-operation latency and error metrics, a store layer (`layers/`):
//! `sluice_store_call_seconds`, `sluice_store_errors_total` and `sluice_script_errors_total`,
//! under the store's name, so the request path and the native API are measured in the same
//! place and the stores themselves stay free of metrics. The metric families come from the
//! server's metrics ([`Measures`]); this layer only records into them.

use prometheus::{Histogram, HistogramVec, IntCounterVec};

use super::{Layer, Op};
use crate::store::{Call, StoreError, StoreFuture};

/// The metric families a [`Measured`] layer records into.
#[derive(Debug, Clone)]
pub struct Measures {
    /// `sluice_store_call_seconds{store, operation}`.
    pub call_seconds: HistogramVec,
    /// `sluice_store_errors_total{store, operation, error}`.
    pub errors: IntCounterVec,
    /// `sluice_script_errors_total{store, operation}`.
    pub script_errors: IntCounterVec,
}

/// The layer: every operation timed, every error counted.
#[derive(Debug)]
pub struct Measured {
    /// The `store` label: which store this is (`memory`, `redis`, `redis_per_second`).
    name: &'static str,
    measures: Measures,
    /// The latency histogram of `check`, which every rate limit request calls: resolved once
    /// rather than looked up by its labels per call.
    check_time: Histogram,
}

impl Measured {
    /// Measures the store named `name` (the metrics' `store` label) into `measures`.
    pub fn new(name: &'static str, measures: Measures) -> Self {
        Self {
            check_time: measures.call_seconds.with_label_values(&[name, "check"]),
            name,
            measures,
        }
    }
}

impl Layer for Measured {
    fn around<'a, T: Send + 'a>(
        &'a self,
        op: Op,
        call: Call<'a>,
        run: impl FnOnce(Call<'a>) -> StoreFuture<'a, T> + Send + 'a,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let timer = match op {
                Op::Check => self.check_time.start_timer(),
                _ => self
                    .measures
                    .call_seconds
                    .with_label_values(&[self.name, op.name()])
                    .start_timer(),
            };
            let result = run(call).await;
            drop(timer);
            if let Err(e) = &result {
                self.measures
                    .errors
                    .with_label_values(&[self.name, op.name(), e.kind()])
                    .inc();
                if matches!(e, StoreError::Script(_)) {
                    self.measures
                        .script_errors
                        .with_label_values(&[self.name, op.name()])
                        .inc();
                }
            }
            result
        })
    }
}
