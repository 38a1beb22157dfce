//! Upstream's local over-limit cache (`LOCAL_CACHE_SIZE_IN_BYTES`): a fixed-window counter the
//! store reported over its limit is answered OVER_LIMIT locally until its window ends, without a
//! store call.
//!
//! It can only refuse, never admit: once a fixed window's count is over the limit, every later
//! request in that window is over too (counts only grow within a window), so the local answer
//! is the one the store would give. Other algorithms are not cached (their refusals depend on the
//! request's cost and on time within the window). Hits refused locally are not added to the
//! store's counter, as upstream does. Entries are keyed by a 128-bit keyed hash of the counter
//! key and bounded by the configured size; when full, expired entries are dropped and new ones
//! skipped (the cache only saves store calls).
//!
//! It keeps the figures upstream reports of its freecache (`ratelimit.localcache.*`), counted
//! per shard under the shard's lock, which the lookup holds anyway.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use crate::metrics::CacheFigures;

/// Bytes one entry takes, for sizing: the 128-bit key, the expiry, and the map's overhead.
const ENTRY_BYTES: usize = 48;
const SHARDS: usize = 16;

#[derive(Debug)]
pub(super) struct OverLimitCache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hashes: [RandomState; 2],
}

/// Entries (key id → end of the window, in ms) and what happened to them.
#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<u128, u64>,
    figures: CacheFigures,
}

impl OverLimitCache {
    /// `None` when `size_bytes` is 0 (upstream's "off").
    pub(super) fn with_size(size_bytes: usize) -> Option<Self> {
        let entries = size_bytes / ENTRY_BYTES;
        (entries > 0).then(|| Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: entries.div_ceil(SHARDS),
            hashes: [RandomState::new(), RandomState::new()],
        })
    }

    fn id(&self, key: &str) -> u128 {
        let [high, low] = &self.hashes;
        (u128::from(high.hash_one(key)) << 64) | u128::from(low.hash_one(key))
    }

    fn shard(&self, id: u128) -> std::sync::MutexGuard<'_, Shard> {
        lock(&self.shards[(id >> 64) as usize % SHARDS])
    }

    /// Milliseconds until `key`'s window ends, if it is known to be over its limit now.
    pub(super) fn over_limit(&self, key: &str, now_ms: u64) -> Option<u64> {
        let id = self.id(key);
        let mut shard = self.shard(id);
        shard.figures.lookups += 1;
        let until = shard
            .entries
            .get(&id)
            .copied()
            .filter(|until| *until > now_ms);
        if until.is_some() {
            shard.figures.hits += 1;
        } else {
            shard.figures.misses += 1;
        }
        until.map(|until| until - now_ms)
    }

    /// Remembers that `key` is over its limit until `until_ms`.
    pub(super) fn remember(&self, key: &str, until_ms: u64, now_ms: u64) {
        let id = self.id(key);
        let mut shard = self.shard(id);
        let Shard { entries, figures } = &mut *shard;
        if entries.len() >= self.per_shard && !entries.contains_key(&id) {
            let before = entries.len();
            entries.retain(|_, until| *until > now_ms);
            figures.expired += (before - entries.len()) as u64;
            if entries.len() >= self.per_shard {
                // No room: upstream's freecache evicts an old entry here, this cache keeps
                // the old ones (each still saves store calls) and forgets the new one.
                figures.evacuations += 1;
                return;
            }
        }
        if entries.insert(id, until_ms).is_some() {
            figures.overwrites += 1;
        }
    }

    /// Forgets `key` (the admin API reset its counter): the next request asks the store.
    pub(super) fn forget(&self, key: &str) {
        let id = self.id(key);
        self.shard(id).entries.remove(&id);
    }

    /// Its figures so far, every shard summed; `entries` is how many it holds now.
    pub(super) fn figures(&self) -> CacheFigures {
        let mut total = CacheFigures::default();
        for shard in &self.shards {
            let shard = lock(shard);
            total += shard.figures;
            total.entries += shard.entries.len() as u64;
        }
        total
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_the_window_ends_within_its_size() {
        assert!(OverLimitCache::with_size(0).is_none());
        let cache = OverLimitCache::with_size(ENTRY_BYTES * SHARDS).unwrap();
        cache.remember("a", 2_000, 1_000);
        assert_eq!(cache.over_limit("a", 1_500), Some(500));
        assert_eq!(cache.over_limit("a", 2_000), None, "the window ended");
        assert_eq!(cache.over_limit("b", 1_500), None);
        // One entry per shard: many keys cannot grow it.
        for i in 0..1_000 {
            cache.remember(&format!("k{i}"), 10_000, 1_000);
        }
        let held: usize = cache
            .shards
            .iter()
            .map(|s| s.lock().unwrap().entries.len())
            .sum();
        assert!(held <= SHARDS, "{held}");
    }

    #[test]
    fn counts_what_upstream_reports_of_its_cache() {
        let cache = OverLimitCache::with_size(ENTRY_BYTES * SHARDS).unwrap();
        cache.remember("a", 2_000, 1_000);
        cache.remember("a", 2_500, 1_000);
        assert_eq!(cache.over_limit("a", 1_500), Some(1_000));
        assert_eq!(cache.over_limit("a", 2_600), None, "expired: a miss");
        assert_eq!(cache.over_limit("b", 1_500), None);
        let figures = cache.figures();
        assert_eq!((figures.lookups, figures.hits, figures.misses), (3, 1, 2));
        assert_eq!((figures.overwrites, figures.entries), (1, 1));
        // One entry per shard: keys landing on a full shard are forgotten, or replace expired
        // entries.
        for i in 0..200 {
            cache.remember(&format!("k{i}"), 10_000, 3_000);
        }
        let figures = cache.figures();
        assert_eq!(figures.entries, SHARDS as u64);
        assert_eq!(
            figures.expired, 1,
            "\"a\" made room when its window had ended"
        );
        assert_eq!(figures.evacuations, 200 - (SHARDS as u64 - 1) - 1);
    }
}
