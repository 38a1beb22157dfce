//! [`SluiceLayerBuilder`]: what a [`SluiceLayer`] asks Sluice, set step by step.
//!
//! The client and the domain are the builder's arguments; the descriptor's entries are added
//! one by one, and the builder's type says whether there is one yet ([`NoEntry`],
//! [`HasEntry`]): `build` exists only once there is, since a descriptor without entries is a
//! request Sluice refuses. So a layer that could never ask anything does not compile, rather
//! than answering `503` to every request.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use http::request::Parts;

use super::key::KeyExtractor;
use super::{Entry, Hits, Settings, SluiceLayer};
use crate::client::{Client, FailurePolicy};

/// The state of a [`SluiceLayerBuilder`] without a descriptor entry yet: it has no `build`.
#[derive(Debug, Clone, Copy)]
pub struct NoEntry;

/// The state of a [`SluiceLayerBuilder`] with at least one descriptor entry: it can
/// [`build`](SluiceLayerBuilder::build).
#[derive(Debug, Clone, Copy)]
pub struct HasEntry;

/// Sets up a [`SluiceLayer`]; made by [`SluiceLayer::builder`].
///
/// - [`key`](Self::key) adds an entry read from each request by an extractor (the caller's
///   user, address, route; see [`crate::key`]), [`entry`](Self::entry) one that is the same on
///   every request (to reach a nested rule: `service=orders`, then `user=<key>`). Entries go
///   into the one descriptor in the order they are added. At least one is required.
/// - [`hits`](Self::hits) or [`hits_from`](Self::hits_from): what a request costs (1 unless
///   set).
/// - [`failure_policy`](Self::failure_policy): what the layer does when Sluice cannot answer,
///   if not the client's.
///
/// ```
/// # async fn run() -> Result<(), sluice_client::Error> {
/// use sluice_client::{Client, FailurePolicy, SluiceLayer, key};
///
/// let client = Client::builder().connect_lazy("http://127.0.0.1:8081")?;
/// // `service=orders`, then `remote_address=<the caller's address>`: a nested rule of the
/// // domain `api`, each export costing 10.
/// let layer = SluiceLayer::builder(client, "api")
///     .entry("service", "orders")
///     .key("remote_address", key::peer_ip())
///     .hits_from(|head| if head.uri.path() == "/export" { 10 } else { 1 })
///     .failure_policy(FailurePolicy::Closed)
///     .build();
/// # Ok(())
/// # }
/// ```
///
/// Without an entry there is no `build`:
///
/// ```compile_fail,E0599
/// # fn run() -> Result<(), sluice_client::Error> {
/// use sluice_client::{Client, SluiceLayer};
///
/// let client = Client::builder().connect_lazy("http://127.0.0.1:8081")?;
/// let layer = SluiceLayer::builder(client, "api").hits(2).build();
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `build` makes the layer"]
pub struct SluiceLayerBuilder<State = NoEntry> {
    settings: Settings,
    policy: Option<FailurePolicy>,
    state: PhantomData<State>,
}

impl SluiceLayerBuilder<NoEntry> {
    pub(super) fn new(client: Client, domain: String) -> Self {
        SluiceLayerBuilder {
            settings: Settings {
                client,
                domain,
                entries: Vec::new(),
                hits: Hits::Each(1),
            },
            policy: None,
            state: PhantomData,
        }
    }
}

impl<State> SluiceLayerBuilder<State> {
    /// Adds the entry `key=<value>`, the value read from each request's head by `extractor`:
    /// a [`crate::key`] extractor, or any closure over [`Parts`] returning a [`Key`],
    /// `String` or `Option<String>`. A request whose value cannot be found is refused, never
    /// passed unlimited ([`SluiceLayer`] says how).
    ///
    /// [`Key`]: crate::key::Key
    pub fn key(
        self,
        key: impl Into<String>,
        extractor: impl KeyExtractor,
    ) -> SluiceLayerBuilder<HasEntry> {
        self.with_entry(Entry::Read(key.into(), Arc::new(extractor)))
    }

    /// Adds the entry `key=value`, the same on every request (an empty value matches a
    /// key-only rule). A layer whose entries are all fixed gives every request one budget.
    pub fn entry(
        self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> SluiceLayerBuilder<HasEntry> {
        self.with_entry(Entry::Fixed(key.into(), value.into()))
    }

    /// What each request costs (1 unless set; 0 counts as 1, as in Envoy).
    pub fn hits(mut self, hits: u64) -> Self {
        self.settings.hits = Hits::Each(hits);
        self
    }

    /// What a request costs, read from its head (a batch size in a header, a price per route);
    /// 0 counts as 1, as in Envoy.
    pub fn hits_from(mut self, hits: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.settings.hits = Hits::Read(Arc::new(hits));
        self
    }

    /// What the layer does when Sluice cannot answer, instead of the client's policy: one
    /// client can serve a fail-open layer and a fail-closed one.
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    fn with_entry(mut self, entry: Entry) -> SluiceLayerBuilder<HasEntry> {
        self.settings.entries.push(entry);
        SluiceLayerBuilder {
            settings: self.settings,
            policy: self.policy,
            state: PhantomData,
        }
    }
}

impl SluiceLayerBuilder<HasEntry> {
    /// The layer.
    pub fn build(self) -> SluiceLayer {
        let mut settings = self.settings;
        if let Some(policy) = self.policy {
            settings.client.policy = policy;
        }
        SluiceLayer {
            settings: Arc::new(settings),
        }
    }
}

impl<State> fmt::Debug for SluiceLayerBuilder<State> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SluiceLayerBuilder")
            .field("layer", &self.settings)
            .field("failure_policy", &self.policy)
            .finish()
    }
}
