//! How many replicas share each limit while the store is down: configured
//! (`DEGRADED_REPLICAS`), or learnt from Redis while it answers.
//!
//! Learning: every replica refreshes its own member of one sorted set, `prefix{sluice_replicas}`
//! (one key, so one slot on a cluster), every [`BEAT`], scored with Redis's clock, and counts the
//! members seen within [`LIVE`]. The last count is kept while Redis is down, which is when it is
//! needed, and a lower count is believed only after [`LIVE`] of answered beats (a Redis back
//! from an outage may have lost the set). A replica that stopped is forgotten after [`LIVE`],
//! so for that long after a scale-down the shares are smaller than they need be (stricter,
//! never looser); after a scale-up, the new replicas are counted from their first beat.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::super::RedisStore;

/// How often a replica refreshes its member.
pub const BEAT: Duration = Duration::from_secs(2);

/// A member not refreshed for this long is no longer counted: a few beats, so one slow beat
/// does not drop a live replica.
pub const LIVE: Duration = Duration::from_secs(10);

/// The longest one beat may take; a beat that does not answer keeps the last count.
const BEAT_TIMEOUT: Duration = Duration::from_secs(1);

/// The replica count shares are computed with.
#[derive(Debug)]
pub struct Replicas {
    /// `DEGRADED_REPLICAS`: wins over anything learnt.
    configured: Option<u64>,
    /// The last count learnt from Redis; 0 until the first.
    learnt: AtomicU64,
}

impl Replicas {
    /// `configured` (`DEGRADED_REPLICAS`), or `None` to learn the count.
    pub fn new(configured: Option<u64>) -> Arc<Self> {
        Arc::new(Self {
            configured: configured.filter(|&n| n > 0),
            learnt: AtomicU64::new(0),
        })
    }

    /// The count to divide by: the configured one, else the last learnt, else 1 (nothing
    /// learnt yet: a replica that started while Redis was down; `DEGRADED_REPLICAS` covers that
    /// case).
    pub fn count(&self) -> u64 {
        self.configured
            .unwrap_or_else(|| self.learnt.load(Ordering::Relaxed).max(1))
    }

    /// Whether the count comes from `DEGRADED_REPLICAS` (then nothing needs learning).
    pub fn is_configured(&self) -> bool {
        self.configured.is_some()
    }

    /// Refreshes this replica's member every [`BEAT`] and keeps the count, until the store is
    /// dropped. `key` is `prefix{sluice_replicas}`; `redis` reaches the Redis store inside
    /// `store` (the beat bypasses the breaker: it is not a decision); `publish` is told each
    /// count learnt (the metric `sluice_degraded_replicas`).
    pub async fn learn_forever<T: Send + Sync + 'static>(
        self: Arc<Self>,
        store: std::sync::Weak<T>,
        redis: fn(&T) -> &RedisStore,
        key: String,
        publish: impl Fn(u64) + Send + 'static,
    ) {
        let member = format!("{:016x}", rand::random::<u64>());
        let live_ms = LIVE.as_millis() as u64;
        // Since when every beat has answered (None after one that did not).
        let mut answering_since: Option<Instant> = None;
        loop {
            let Some(layer) = store.upgrade() else {
                return;
            };
            let beat = redis(&layer).count_replicas(&key, &member, live_ms);
            match tokio::time::timeout(BEAT_TIMEOUT, beat).await {
                Ok(Ok(seen)) => {
                    let since = *answering_since.get_or_insert_with(Instant::now);
                    let before = self.learnt.load(Ordering::Relaxed);
                    let count = believed(before, seen, since.elapsed());
                    self.learnt.store(count, Ordering::Relaxed);
                    publish(count);
                    if before != count {
                        tracing::info!(replicas = count, "replica count learnt from redis");
                    }
                }
                Ok(Err(e)) => {
                    answering_since = None;
                    tracing::debug!(error = %e, "replica count not refreshed");
                }
                Err(_) => {
                    answering_since = None;
                    tracing::debug!("replica count not refreshed in time");
                }
            }
            drop(layer);
            tokio::time::sleep(BEAT).await;
        }
    }
}

/// The count to keep when a beat `seen` members, `before` was the count so far, and the beats
/// have answered for `answering`. A higher count is believed at once (smaller shares: stricter);
/// a lower one only after [`LIVE`] of answered beats. A Redis that restarted empty, or a failover
/// to a replica that had not seen every beat, shows fewer members until every live replica has
/// beaten again, and meanwhile the shares must not grow: they are still in use while the
/// breaker waits to close (a restart test saw 32 answers of a limit of 30 admitted this way).
fn believed(before: u64, seen: u64, answering: Duration) -> u64 {
    if seen >= before || answering >= LIVE {
        seen
    } else {
        before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_count_waits_for_a_full_live_period_of_answered_beats() {
        let short = LIVE / 2;
        assert_eq!(believed(0, 3, Duration::ZERO), 3, "first count");
        assert_eq!(believed(2, 3, Duration::ZERO), 3, "scale-up at once");
        assert_eq!(believed(3, 1, Duration::ZERO), 3, "Redis restarted empty");
        assert_eq!(believed(3, 1, short), 3);
        assert_eq!(believed(3, 2, LIVE), 2, "scale-down once LIVE has passed");
    }

    #[test]
    fn configured_wins_and_nothing_learnt_means_one() {
        let configured = Replicas::new(Some(4));
        configured.learnt.store(7, Ordering::Relaxed);
        assert_eq!(configured.count(), 4);
        assert!(configured.is_configured());
        let learning = Replicas::new(None);
        assert_eq!(learning.count(), 1, "nothing learnt yet");
        learning.learnt.store(3, Ordering::Relaxed);
        assert_eq!(learning.count(), 3);
        assert!(!Replicas::new(Some(0)).is_configured(), "0 means learn");
    }
}
