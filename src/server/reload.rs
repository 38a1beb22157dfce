//! Live configuration: the config directory is checked every `interval` and a changed config is
//! loaded, validated and swapped in whole.
//!
//! Polling a fingerprint (each file's path, size and modification time, and where the directory
//! really points) sees both plain file writes and Kubernetes' ConfigMap updates, which swap a
//! symlink (`..data`) without touching the files' own paths. A config that fails to load keeps
//! the old one in force; the errors are logged with file and line and counted. Counters survive a
//! reload: their keys depend on the descriptor and the limit's unit, not on the config object.
//! A loaded config is published on a `watch` channel, as the xDS source (`crate::xds`) publishes
//! its own; `app` applies whatever arrives there.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::config::{self, LoadOptions, RateLimitConfig};
use crate::metrics::Metrics;

/// What the directory looks like now; any difference means "load again".
#[derive(Debug, PartialEq, Eq)]
struct Fingerprint {
    real_dir: Option<PathBuf>,
    files: Vec<(PathBuf, u64, Option<SystemTime>)>,
}

fn fingerprint(dir: &Path) -> Fingerprint {
    let mut files = Vec::new();
    walk(dir, &mut files);
    files.sort();
    Fingerprint {
        real_dir: std::fs::canonicalize(dir).ok(),
        files,
    }
}

fn walk(dir: &Path, files: &mut Vec<(PathBuf, u64, Option<SystemTime>)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        // Follows symlinks, so a swapped `..data` target changes what is seen here.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            walk(&path, files);
        } else {
            let real = std::fs::canonicalize(&path).unwrap_or(path);
            files.push((real, meta.len(), meta.modified().ok()));
        }
    }
}

/// Watches `dir` until the task is dropped, publishing every config that loads.
pub async fn watch(
    dir: PathBuf,
    options: LoadOptions,
    publish: watch::Sender<Option<Arc<RateLimitConfig>>>,
    metrics: Arc<Metrics>,
    interval: Duration,
) {
    let mut seen = fingerprint(&dir);
    let mut ticker = tokio::time::interval(interval);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let now = fingerprint(&dir);
        if now == seen {
            continue;
        }
        seen = now;
        let (dir, options) = (dir.clone(), options.clone());
        // File reads and parsing stay off the request-serving threads.
        let loaded = tokio::task::spawn_blocking(move || config::load_dir(&dir, &options)).await;
        match loaded {
            Ok(Ok(config)) => {
                for warning in &config.warnings {
                    tracing::warn!(%warning, "config");
                }
                let (domains, limits) = (config.domain_names().count(), config.limits().len());
                publish.send_replace(Some(Arc::new(config)));
                metrics.config_load_success.inc();
                tracing::info!(domains, limits, "configuration reloaded");
            }
            Ok(Err(errors)) => {
                metrics.config_load_error.inc();
                tracing::error!(%errors, "new configuration refused; the previous one stays in force");
            }
            Err(e) => {
                metrics.config_load_error.inc();
                tracing::error!(error = %e, "configuration reload failed");
            }
        }
    }
}
