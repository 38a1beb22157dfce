//! How many replicas share each limit while the store is down: configured
//! (`DEGRADED_REPLICAS`), or learnt from Redis while it answers.
//!
//! Learning: every replica refreshes its own member of one sorted set, `prefix{sluice_replicas}`
//! (one key, so one slot on a cluster), every [`BEAT`], scored with Redis's clock, and counts the
//! members seen within [`LIVE`]. The count is kept while Redis is down, which is when it is
//! needed. A higher count is believed at once (smaller shares); a lower one only once every beat
//! for [`FEWER_FOR`] has answered and seen fewer, and then the most seen over that time.
//!
//! Why so long: a replica that lost Redis (a network partition, its own proxy down) stops
//! beating and drops out of the set after [`LIVE`] exactly as one that was scaled away, but it
//! is still serving, deciding alone with the share of the count it last learnt. Had the others
//! believed the smaller count, their shares would have grown, and a window decided only locally
//! (Redis then lost by all) could admit L + kL/n for k replicas cut off out of n (issue #40).
//! With the largest count of the last [`FEWER_FOR`], the shares of every replica deciding
//! locally add up to at most L as long as the partial outage is shorter than that. The price:
//! after a real scale-down, shares stay those of the larger fleet for [`FEWER_FOR`] (stricter,
//! never looser), and a Redis that lost the set (a restart, a failover) shows fewer members
//! until every replica has beaten again, which the same rule rides out. After a scale-up, the
//! new replicas are counted from their first beat.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[cfg(feature = "redis")]
use crate::store::RedisStore;

/// How often a replica refreshes its member.
pub const BEAT: Duration = Duration::from_secs(2);

/// A member not refreshed for this long is no longer counted: a few beats, so one slow beat
/// does not drop a live replica.
pub const LIVE: Duration = Duration::from_secs(10);

/// How long every beat must see fewer replicas, and answer, before the count is lowered: far
/// longer than a replica cut off from Redis takes to drop out of the set ([`LIVE`]), so that a
/// partial outage shorter than this never grows the other replicas' shares.
pub const FEWER_FOR: Duration = Duration::from_secs(3600);

/// The longest one beat may take; a beat that does not answer keeps the last count.
// Learning reads Redis: without the `redis` feature the count is configured or 1.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
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

    /// Refreshes this replica's member every [`BEAT`] and keeps the count (`Learnt`), until
    /// the store is dropped. `key` is `prefix{sluice_replicas}`; `redis` reaches the Redis store inside
    /// `store` (the beat bypasses the breaker: it is not a decision); `publish` is told each
    /// count learnt (the metric `sluice_degraded_replicas`).
    #[cfg(feature = "redis")]
    pub async fn learn_forever<T: Send + Sync + 'static>(
        self: Arc<Self>,
        store: std::sync::Weak<T>,
        redis: fn(&T) -> &RedisStore,
        key: String,
        publish: impl Fn(u64) + Send + 'static,
    ) {
        let member = format!("{:016x}", rand::random::<u64>());
        let live_ms = LIVE.as_millis() as u64;
        let mut learnt = Learnt::default();
        loop {
            let Some(layer) = store.upgrade() else {
                return;
            };
            let beat = redis(&layer).count_replicas(&key, &member, live_ms);
            match tokio::time::timeout(BEAT_TIMEOUT, beat).await {
                Ok(Ok(seen)) => {
                    let before = learnt.count;
                    let count = learnt.beat(seen, Instant::now());
                    self.learnt.store(count, Ordering::Relaxed);
                    publish(count);
                    if before != count {
                        tracing::info!(replicas = count, seen, "replica count learnt from redis");
                    } else if seen < count {
                        tracing::debug!(
                            replicas = count,
                            seen,
                            "fewer replicas seen; not yet believed"
                        );
                    }
                }
                Ok(Err(e)) => {
                    learnt.missed();
                    tracing::debug!(error = %e, "replica count not refreshed");
                }
                Err(_) => {
                    learnt.missed();
                    tracing::debug!("replica count not refreshed in time");
                }
            }
            drop(layer);
            tokio::time::sleep(BEAT).await;
        }
    }
}

/// The count learnt from the beats so far: the most seen, until fewer have been seen by every
/// beat for [`FEWER_FOR`] (see the module's doc).
#[derive(Debug, Default)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
struct Learnt {
    /// The count in use; 0 before the first beat.
    count: u64,
    /// Since when every beat has answered and seen fewer than `count`, and the most any of
    /// them saw.
    fewer: Option<(Instant, u64)>,
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl Learnt {
    /// A beat that answered, at `now`, seeing `seen` members: the count to use.
    fn beat(&mut self, seen: u64, now: Instant) -> u64 {
        if seen >= self.count {
            self.count = seen;
            self.fewer = None;
            return self.count;
        }
        let (since, most) = self.fewer.get_or_insert((now, seen));
        *most = (*most).max(seen);
        if now.duration_since(*since) >= FEWER_FOR {
            self.count = *most;
            self.fewer = None;
        }
        self.count
    }

    /// A beat that did not answer: this replica cannot tell who else is there, so the time of
    /// seeing fewer starts again at the next beat that answers.
    fn missed(&mut self) {
        self.fewer = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewer_replicas_are_believed_only_after_seeing_fewer_for_a_long_time() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut learnt = Learnt::default();
        assert_eq!(learnt.beat(3, at(0)), 3, "first count");
        assert_eq!(learnt.beat(4, at(2)), 4, "scale-up at once");
        // One replica cut off from Redis: it drops out of the set after LIVE, and keeps
        // deciding with a quarter. The others keep a quarter too.
        assert_eq!(learnt.beat(3, at(14)), 4);
        assert_eq!(learnt.beat(3, at(14 + FEWER_FOR.as_secs() / 2)), 4);
        // Redis restarted empty: fewer seen for a while, not believed either.
        assert_eq!(learnt.beat(1, at(20 + FEWER_FOR.as_secs() / 2)), 4);
        // A beat that did not answer starts the wait again.
        learnt.missed();
        assert_eq!(learnt.beat(3, at(FEWER_FOR.as_secs())), 4);
        assert_eq!(learnt.beat(2, at(FEWER_FOR.as_secs() + 10)), 4);
        // Fewer seen by every beat for FEWER_FOR: the most of them is believed.
        assert_eq!(learnt.beat(2, at(2 * FEWER_FOR.as_secs())), 3);
        // Back up at once.
        assert_eq!(learnt.beat(4, at(2 * FEWER_FOR.as_secs() + 2)), 4);
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
