//! Store layers: what stands between a decision path and a store and sees every call go by, in
//! one shape (issue #41). Three today, each a file here: the circuit breaker (`breaker.rs`), the
//! per-operation measurements (`measured.rs`) and `FAILURE_POLICY=local_share`'s local decisions
//! (`local_share/`).
//!
//! A layer implements [`Layer`]: [`Layer::around`], which every operation goes through by
//! default, and, for a layer that answers some operations itself (the local share decides a
//! check when the store cannot), that operation's own method. [`Layered`] puts a layer in front
//! of a store, or of a store already layered, and is a store itself: the forwarding of every
//! store method is written once, here, not once per layer. The server stacks its layers in one
//! place (`app::stores`), so a new layer is a file here and a line there.
//!
//! Each operation carries its [`Call`] (the caller's deadline, the request's marks), which a
//! layer passes on as it is or changed (the local share brings the store's deadline forward to
//! keep time for its own answer).

pub mod breaker;
pub mod local_share;
pub mod measured;

use std::fmt::Debug;

use super::{
    Acquisition, Call, Charging, Check, CounterStore, Lease, LimiterKeys, LimiterRecord,
    LimiterSet, LimiterStore, RegistryOp, RegistryReply, Release, SetMode, Store, StoreFuture,
};

/// A store operation, as the layers that treat every operation alike name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// [`CounterStore::check_with`].
    Check,
    /// [`LimiterStore::set_limiter`].
    SetLimiter,
    /// [`LimiterStore::get_limiter`].
    GetLimiter,
    /// [`LimiterStore::delete_limiter`].
    DeleteLimiter,
    /// [`LimiterStore::acquire`].
    Acquire,
    /// [`LimiterStore::release`].
    Release,
    /// [`LimiterStore::registry`].
    Registry,
    /// [`CounterStore::reset`].
    Reset,
    /// [`CounterStore::refund`].
    Refund,
}

impl Op {
    /// The operation's name in metrics (`sluice_store_call_seconds{operation}`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Check => "check",
            Op::SetLimiter => "set_limiter",
            Op::GetLimiter => "get_limiter",
            Op::DeleteLimiter => "delete_limiter",
            Op::Acquire => "acquire",
            Op::Release => "release",
            Op::Registry => "registry",
            Op::Reset => "reset",
            Op::Refund => "refund",
        }
    }
}

/// What a store layer does. Every method but [`Layer::around`] has a default that runs the
/// operation on `store` (the next layer down, or the store) through `around`; a layer overrides
/// the operations it answers differently.
pub trait Layer: Send + Sync + Debug {
    /// Runs `op` through this layer: `run` makes the call below, with the call context it is
    /// given. A layer that must decide before anything is sent (the breaker) calls `run` only
    /// when it lets the call through: some stores do their work when the future is made.
    fn around<'a, T: Send + 'a>(
        &'a self,
        op: Op,
        call: Call<'a>,
        run: impl FnOnce(Call<'a>) -> StoreFuture<'a, T> + Send + 'a,
    ) -> StoreFuture<'a, T>;

    /// [`CounterStore::check_with`] through this layer.
    fn check_with<'a, S: CounterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        checks: &'a [&'a Check],
        charging: Charging,
    ) -> StoreFuture<'a> {
        self.around(Op::Check, call, move |call| {
            store.check_with(call, checks, charging)
        })
    }

    /// [`CounterStore::reset`] through this layer.
    fn reset<'a, S: CounterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        keys: &'a [&'a str],
    ) -> StoreFuture<'a, u64> {
        self.around(Op::Reset, call, move |call| store.reset(call, keys))
    }

    /// [`CounterStore::refund`] through this layer.
    fn refund<'a, S: CounterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        checks: &'a [&'a Check],
    ) -> StoreFuture<'a, Vec<u64>> {
        self.around(Op::Refund, call, move |call| store.refund(call, checks))
    }

    /// [`LimiterStore::set_limiter`] through this layer.
    fn set_limiter<'a, S: LimiterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, LimiterSet> {
        self.around(Op::SetLimiter, call, move |call| {
            store.set_limiter(call, keys, record, mode)
        })
    }

    /// [`LimiterStore::get_limiter`] through this layer.
    fn get_limiter<'a, S: LimiterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, Option<LimiterRecord>> {
        self.around(Op::GetLimiter, call, move |call| {
            store.get_limiter(call, keys)
        })
    }

    /// [`LimiterStore::delete_limiter`] through this layer.
    fn delete_limiter<'a, S: LimiterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, bool> {
        self.around(Op::DeleteLimiter, call, move |call| {
            store.delete_limiter(call, keys)
        })
    }

    /// [`LimiterStore::acquire`] through this layer.
    fn acquire<'a, S: LimiterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        permits: u64,
        max_clients: u64,
    ) -> StoreFuture<'a, Acquisition> {
        self.around(Op::Acquire, call, move |call| {
            store.acquire(call, keys, permits, max_clients)
        })
    }

    /// [`LimiterStore::release`] through this layer.
    fn release<'a, S: LimiterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        lease: Lease,
    ) -> StoreFuture<'a, Release> {
        self.around(Op::Release, call, move |call| {
            store.release(call, keys, lease)
        })
    }

    /// [`LimiterStore::registry`] through this layer.
    fn registry<'a, S: LimiterStore + ?Sized>(
        &'a self,
        store: &'a S,
        call: Call<'a>,
        key: &'a str,
        op: RegistryOp<'a>,
    ) -> StoreFuture<'a, RegistryReply> {
        self.around(Op::Registry, call, move |call| {
            store.registry(call, key, op)
        })
    }
}

/// `store` with `layer` in front: a store whose every operation goes through the layer.
#[derive(Debug)]
pub struct Layered<L, S> {
    layer: L,
    store: S,
}

impl<L: Layer, S> Layered<L, S> {
    /// `store` (a store, or one already layered) with `layer` in front.
    pub fn new(layer: L, store: S) -> Self {
        Self { layer, store }
    }

    /// The layer (the breaker's state, to watch or force open).
    pub fn layer(&self) -> &L {
        &self.layer
    }

    /// What the layer stands in front of.
    pub fn store(&self) -> &S {
        &self.store
    }
}

impl<L: Layer, S: Store> Store for Layered<L, S> {
    fn kind(&self) -> &'static str {
        self.store.kind()
    }
}

impl<L: Layer, S: CounterStore> CounterStore for Layered<L, S> {
    fn check_with<'a>(
        &'a self,
        call: Call<'a>,
        checks: &'a [&'a Check],
        charging: Charging,
    ) -> StoreFuture<'a> {
        self.layer.check_with(&self.store, call, checks, charging)
    }

    fn reset<'a>(&'a self, call: Call<'a>, keys: &'a [&'a str]) -> StoreFuture<'a, u64> {
        self.layer.reset(&self.store, call, keys)
    }

    fn refund<'a>(&'a self, call: Call<'a>, checks: &'a [&'a Check]) -> StoreFuture<'a, Vec<u64>> {
        self.layer.refund(&self.store, call, checks)
    }
}

impl<L: Layer, S: LimiterStore> LimiterStore for Layered<L, S> {
    fn set_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, LimiterSet> {
        self.layer
            .set_limiter(&self.store, call, keys, record, mode)
    }

    fn get_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, Option<LimiterRecord>> {
        self.layer.get_limiter(&self.store, call, keys)
    }

    fn delete_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, bool> {
        self.layer.delete_limiter(&self.store, call, keys)
    }

    fn acquire<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        permits: u64,
        max_clients: u64,
    ) -> StoreFuture<'a, Acquisition> {
        self.layer
            .acquire(&self.store, call, keys, permits, max_clients)
    }

    fn release<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        lease: Lease,
    ) -> StoreFuture<'a, Release> {
        self.layer.release(&self.store, call, keys, lease)
    }

    fn registry<'a>(
        &'a self,
        call: Call<'a>,
        key: &'a str,
        op: RegistryOp<'a>,
    ) -> StoreFuture<'a, RegistryReply> {
        self.layer.registry(&self.store, call, key, op)
    }
}
