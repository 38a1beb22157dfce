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
//!
//! # Never a half-written file
//!
//! A file written in place (truncated, then written in several calls, as `echo > file`, a script
//! or an editor without atomic rename does) can be caught half-written, and cut at a line
//! boundary it is still valid YAML with fewer limits (issue #40). So a change is read only once
//! the directory has stayed the same for [`SETTLE`], and the fingerprint is taken again after
//! reading: when it moved, what was read may mix two versions, and it is read again once it
//! settles. A writer that pauses less than `SETTLE` is never read half-way. This adds `SETTLE`
//! (1 s) to every reload, ConfigMap swaps included: they are atomic already, but an atomic swap
//! cannot be told from a write by its fingerprint, and the kubelet takes far longer to deliver a
//! ConfigMap change. Upstream reads on every file event (with `RUNTIME_WATCH_ROOT=false`) or only
//! on a swap of the root symlink (the default), so its in-place writes are either read at once,
//! half-written or not, or not seen at all.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use sluice::config::{self, LoadOptions, RateLimitConfig};
use sluice::metrics::Metrics;

/// What the directory looks like now; any difference means "load again".
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// How long the directory must stay unchanged before a change is read.
pub const SETTLE: Duration = Duration::from_secs(1);

/// Watches `dir` until the task is dropped, publishing every config that loads.
pub async fn watch(
    dir: PathBuf,
    options: LoadOptions,
    publish: watch::Sender<Option<Arc<RateLimitConfig>>>,
    metrics: Arc<Metrics>,
    interval: Duration,
) {
    let mut loaded = fingerprint(&dir);
    let mut ticker = tokio::time::interval(interval);
    // A late poll is not made up for with a burst of them.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        if fingerprint(&dir) == loaded {
            continue;
        }
        let settled = settle(&dir).await;
        if settled == loaded {
            continue;
        }
        let (dir, options, expected) = (dir.clone(), options.clone(), settled.clone());
        // File reads and parsing stay off the request-serving threads.
        let read = tokio::task::spawn_blocking(move || {
            read_unchanged(&dir, &expected, |dir| config::load_dir(dir, &options))
        })
        .await;
        match read {
            Ok(Some(result)) => apply(result, &publish, &metrics),
            Ok(None) => {
                tracing::debug!(
                    "the config directory changed while it was read; reading it again once it settles"
                );
                continue;
            }
            Err(e) => {
                metrics.config_load_error.inc();
                tracing::error!(error = %e, "configuration reload failed");
            }
        }
        loaded = settled;
    }
}

/// Waits until `dir` has stayed the same for [`SETTLE`]; its fingerprint then.
async fn settle(dir: &Path) -> Fingerprint {
    let mut last = fingerprint(dir);
    loop {
        tokio::time::sleep(SETTLE).await;
        let now = fingerprint(dir);
        if now == last {
            return now;
        }
        tracing::debug!("the config directory is still changing; waiting for it to settle");
        last = now;
    }
}

/// `read(dir)`, when `dir` still has the fingerprint `expected` once it is read; `None` when
/// it changed, so what was read may not be what the fingerprint described.
fn read_unchanged<T>(
    dir: &Path,
    expected: &Fingerprint,
    read: impl FnOnce(&Path) -> T,
) -> Option<T> {
    let result = read(dir);
    (fingerprint(dir) == *expected).then_some(result)
}

/// Publishes a config that loaded; counts and logs one that did not.
fn apply(
    result: Result<RateLimitConfig, config::ConfigErrors>,
    publish: &watch::Sender<Option<Arc<RateLimitConfig>>>,
    metrics: &Metrics,
) {
    match result {
        Ok(config) => {
            for warning in &config.warnings {
                tracing::warn!(%warning, "config");
            }
            let (domains, limits) = (config.domain_names().count(), config.limits().len());
            publish.send_replace(Some(Arc::new(config)));
            metrics.config_load_success.inc();
            tracing::info!(domains, limits, "configuration reloaded");
        }
        Err(errors) => {
            metrics.config_load_error.inc();
            tracing::error!(%errors, "new configuration refused; the previous one stays in force");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_read_counts_only_when_the_directory_did_not_change_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("limits.yaml");
        std::fs::write(&file, "domain: a\n").unwrap();
        let before = fingerprint(dir.path());
        let read = |dir: &Path| std::fs::read_to_string(dir.join("limits.yaml")).unwrap();
        assert_eq!(
            read_unchanged(dir.path(), &before, read).as_deref(),
            Some("domain: a\n")
        );
        // The rest of the file lands while it is being read.
        let written_meanwhile = |dir: &Path| {
            let text = read(dir);
            std::fs::write(&file, "domain: a\ndescriptors: []\n").unwrap();
            text
        };
        assert_eq!(read_unchanged(dir.path(), &before, written_meanwhile), None);
    }
}
