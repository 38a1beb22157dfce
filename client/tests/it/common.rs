//! What every test of the client crate shares: the Sluice config they run ([`CONFIG`]) and a
//! Sluice process on it (the test kit's, `crates/sluice-test-kit`, which also finds the
//! workspace's `sluice` binary for a package that does not have it), with a client of it.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use sluice_client::{Client, FailurePolicy};
pub use sluice_test_kit::RedisServer as Redis;

/// The Sluice config every test of this crate uses: domain `client_test`. Daily windows, so a
/// test's few seconds almost never straddle a window's end (which would double a budget).
/// `peer=::/64` (IPv6 loopback's network, as `key::peer_ip` keys it) has a limit of its own,
/// so a test can tell which key a request from `::1` was charged to. `service=orders` then
/// `user` is a nested rule, for a descriptor of more than one entry.
pub const CONFIG: &str = "\
domain: client_test
descriptors:
  - key: service
    value: orders
    descriptors:
      - key: user
        rate_limit:
          name: orders_per_user
          unit: day
          requests_per_unit: 3
  - key: shared
    rate_limit:
      name: shared
      unit: day
      requests_per_unit: 40
  - key: user
    rate_limit:
      name: per_user
      unit: day
      requests_per_unit: 2
  - key: peer
    rate_limit:
      unit: day
      requests_per_unit: 2
  - key: peer
    value: \"::/64\"
    rate_limit:
      name: loopback_64
      unit: day
      requests_per_unit: 1
";

/// Which store a Sluice process uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Memory,
    Redis,
}

/// A running `sluice serve` on [`CONFIG`], the native API on: the kit's process with its
/// config directory.
pub struct Sluice {
    process: sluice_test_kit::Sluice,
    _config: tempfile::TempDir,
}

impl Sluice {
    /// Starts Sluice on the memory store, or on `redis`; `env` adds variables.
    pub fn start(redis: Option<&Redis>, env: &[(&str, &str)]) -> Sluice {
        let config = sluice_test_kit::config_dir(CONFIG);
        let process = sluice_test_kit::Sluice::start(config.path(), redis, env);
        Sluice {
            process,
            _config: config,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// A client of this Sluice with `policy` and a deadline far above a quiet machine's
    /// answer time.
    pub async fn client(&self, policy: FailurePolicy) -> Client {
        Client::builder()
            .failure_policy(policy)
            .deadline(Duration::from_secs(10))
            .connect(self.endpoint())
            .await
            .unwrap()
    }
}

impl Deref for Sluice {
    type Target = sluice_test_kit::Sluice;

    fn deref(&self) -> &Self::Target {
        &self.process
    }
}

impl DerefMut for Sluice {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.process
    }
}
