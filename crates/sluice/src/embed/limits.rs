//! [`Limits`]: a loaded configuration, as a service embedding Sluice holds it. Loading goes
//! through the server's own loader (`config::load_sources`, `config::load_dir`), so a file
//! the server accepts is accepted here, and refused with the same file, line and reason.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{
    ConfigError, ConfigErrors, LoadOptions, RateLimitConfig, load_dir, load_sources,
};

/// The name a configuration given as text carries in its errors, where a file's path would be.
const YAML_SOURCE: &str = "<yaml>";

/// A validated limit configuration: every domain with its descriptors, in upstream's YAML
/// format with Sluice's extensions (`algorithm`, `rate_limits`, …, docs/algorithms.md).
///
/// Cheap to clone (the compiled configuration is shared), and immutable: to change limits at
/// run time, load new ones and hand them to [`Limiter::set_limits`](crate::Limiter::set_limits).
#[derive(Clone)]
pub struct Limits {
    config: Arc<RateLimitConfig>,
}

impl Limits {
    /// Loads one configuration document from text. Every problem is reported at once, each
    /// with its line (the file is named `<yaml>`).
    ///
    /// ```
    /// let limits = sluice::Limits::from_yaml(
    ///     "
    /// domain: api
    /// descriptors:
    ///   - key: api_key
    ///     rate_limit: {unit: minute, requests_per_unit: 3}
    /// ",
    /// )?;
    /// assert_eq!(limits.domains().collect::<Vec<_>>(), ["api"]);
    /// assert!(limits.warnings().is_empty());
    ///
    /// let wrong = sluice::Limits::from_yaml("domain: api\ndescriptors:\n  - rate_limit: 3\n");
    /// let errors = wrong.err().expect("a descriptor needs a key");
    /// assert!(errors.0.iter().all(|e| e.line.is_some()), "{errors}");
    /// # Ok::<(), sluice::config::ConfigErrors>(())
    /// ```
    pub fn from_yaml(text: &str) -> Result<Limits, ConfigErrors> {
        let source = (PathBuf::from(YAML_SOURCE), text.to_string());
        load_sources(vec![source], &LoadOptions::default()).map(Limits::from)
    }

    /// Loads every regular file under `dir`, recursively, as the server's `--config-dir` does
    /// (Kubernetes' `..data` links skipped); several files may not define the same domain.
    /// For the loader's switches (merged domains, skipped dot-files), load with
    /// [`config::load_dir`](crate::config::load_dir) and convert with `Limits::from`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Limits, ConfigErrors> {
        load_dir(dir.as_ref(), &LoadOptions::default()).map(Limits::from)
    }

    /// The names of the domains the limits define, in no particular order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.config.domain_names()
    }

    /// What loaded but deserves a look (a key upstream ignores where it stands, a directory
    /// with no domain), each with its file and line.
    pub fn warnings(&self) -> &[ConfigError] {
        &self.config.warnings
    }

    /// The compiled configuration, for the lower layers ([`rls::RateLimiter`](crate::rls::RateLimiter)).
    pub fn config(&self) -> &Arc<RateLimitConfig> {
        &self.config
    }
}

impl From<RateLimitConfig> for Limits {
    fn from(config: RateLimitConfig) -> Limits {
        Limits::from(Arc::new(config))
    }
}

impl From<Arc<RateLimitConfig>> for Limits {
    fn from(config: Arc<RateLimitConfig>) -> Limits {
        Limits { config }
    }
}

impl fmt::Debug for Limits {
    /// The domains and how many limits they hold; the whole tree is rarely what a log wants.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut domains: Vec<&str> = self.domains().collect();
        domains.sort_unstable();
        f.debug_struct("Limits")
            .field("domains", &domains)
            .field("limits", &self.config.limit_count())
            .finish()
    }
}
