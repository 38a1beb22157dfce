//! The counting algorithms on in-process state: the memory store runs these, and each has a twin
//! in `lua/` that Redis runs. The two must give the same answers (tests/it/store_conformance.rs), so
//! where Lua computes with doubles these functions compute with `f64` in the same order.
//!
//! All times are microseconds on the store's clock. Every function takes the state it finds
//! (`None` for a new or expired key) and returns the outcome with the state to keep and how long
//! to keep it (the time until the state would be indistinguishable from a fresh key).
//!
//! Conventions shared by all algorithms: `remaining` is what could be admitted now; `reset_ms`
//! is, when refused, the wait until the same request would be admitted, and when admitted, the
//! time until the limit is fully replenished. A request that asks for more than the algorithm can
//! ever grant is refused at once, without touching the state. A refused request never changes
//! the state (the upstream fixed window, in `memory/` and `lua/fixed_window.lua`, is the one
//! exception: it counts refused hits, as upstream does).
//!
//! A zero-cost check (`hits` 0) never changes the state either, and is refused exactly when a
//! one-hit request would be (no permit is left): it asks "may this request go on?" of a request
//! whose cost is charged later (upstream's check-then-charge pattern), so that pattern admits at
//! most the limit.
//!
//! `record_refused` (the per-limit `record_refused_hits: true`) makes a refused request with a
//! cost still charge it, as upstream's fixed window does, within a bound per algorithm:
//!
//! * a window never holds more than its limit: the log is filled up to `limit` hits, the
//!   counter's current window up to `limit`, and the rest of the charge is forgotten;
//! * a bucket (GCRA) takes the hits in full, past empty, into a debt of at most one bucket: the
//!   TAT moves by `hits × interval`, to two bucket times from now at most, never back. The refill
//!   pays the debt back before anything is admitted again, so a cost charged after the fact (as
//!   Envoy's stream-done charge) counts in full up to one bucket past empty; and no charge,
//!   however large, keeps a key refused for longer than one bucket time and one token's (its
//!   state then lives until the bucket is full again, two bucket times);
//! * a warm-up's next free time moves by the hits' stable cost, to one window from now at most.
//!   A warm-up is no bucket for this rule: it holds no balance of tokens that could go below
//!   zero, only the time the next request may start, and it admits one request per spacing
//!   whatever that request costs. One window is the wait its largest request
//!   (`permits_per_window`) leaves at the stable rate, so a recorded refusal never makes a client
//!   wait longer than an admitted request of the largest size would.
//!
//! The outcome is then computed on the charged state. Zero-cost checks are never recorded.

use std::collections::VecDeque;

use super::Outcome;

/// Per-key state in the memory store.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum State {
    Count(u64),
    /// (time, running total) entries, oldest first. Boxed: the other states are two words at
    /// most, and every entry of the memory store is as large as the largest variant.
    Log(Box<Log>),
    /// Counts never exceed the limit, a u32: two words, like the other states.
    Windows {
        start: u64,
        current: u32,
        previous: u32,
    },
    /// Theoretical arrival time.
    Tat(u64),
    WarmUp {
        /// Stored permits in millionths, an integer so that no float drifts across calls.
        stored_millionths: u64,
        next_free: u64,
    },
    /// Concurrency's leases by expiry (`store/concurrency.rs`); boxed like the log.
    Leases(Box<super::concurrency::Leases>),
}

/// What an algorithm decided and what to keep.
#[derive(Debug)]
pub(crate) struct Step {
    pub(crate) outcome: Outcome,
    /// `None` keeps the state as it was (including "no state").
    pub(crate) keep: Option<(State, u64)>,
}

fn micros_to_ms(us: u64) -> u64 {
    us.div_ceil(1000).max(1)
}

/// Upstream's fixed window on the count `state` of the window the key names (`window_start`,
/// unix seconds, picked by the caller). For the RLS path (`take` false) the hits are counted
/// even when refused, as upstream counts them; for a named limiter (`take` true) only when they
/// fit, so a refused acquisition takes nothing. A zero-hit look creates nothing. The state lives
/// until the window ends. Twin of `fixed_window` and `fixed_window_take` in
/// `lua/fixed_window.lua`.
pub(crate) fn fixed_window(
    state: Option<State>,
    hits: u64,
    take: bool,
    limit: u64,
    (window_secs, window_start): (u64, u64),
    now: u64,
) -> Step {
    let before = match state {
        Some(State::Count(count)) => count,
        _ => 0,
    };
    let expires_at = (window_start + window_secs) * 1_000_000;
    let now_ms = now / 1000;
    let (outcome, count) = if take {
        fixed_window_take(before, hits, limit, window_secs, window_start, now_ms)
    } else {
        let count = before.saturating_add(hits);
        let outcome = fixed_window_outcome(count, limit, window_secs, window_start, now_ms);
        (outcome, (hits > 0).then_some(count))
    };
    Step {
        outcome,
        keep: count
            .filter(|_| expires_at > now)
            .map(|count| (State::Count(count), expires_at - now)),
    }
}

/// Fixed-window arithmetic: admitted/remaining/reset from the count after this request's hits
/// (which upstream's fixed window counts even when it refuses them), the reset measured at
/// `now_ms` against the end of the window the key names, clamped to [1 ms, window]. The memory
/// store and the Redis store's lean script (which returns only counts and the time it read,
/// `lua/fixed_window_lean.lua`) both judge with this function; the full Lua script has its
/// twin in `fixed_window` (`lua/fixed_window.lua`).
pub(crate) fn fixed_window_outcome(
    count: u64,
    limit: u64,
    window_secs: u64,
    window_start: u64,
    now_ms: u64,
) -> Outcome {
    let window_ms = window_secs * 1000;
    let end_ms = (window_start + window_secs) * 1000;
    // Not `clamp(1, window_ms)`, which panics on a zero window; the same for any other.
    let reset_ms = end_ms.saturating_sub(now_ms).min(window_ms).max(1);
    Outcome {
        admitted: count <= limit,
        remaining: limit.saturating_sub(count),
        reset_ms,
        used: count,
    }
}

/// A named limiter's fixed window (native API): the hits are counted only when they fit
/// (`before + hits <= limit`), so a refused acquisition takes nothing. Returns the outcome and
/// the count to store, if any (none for a refusal or a zero-permit look). Twin of
/// `fixed_window_take` in `lua/fixed_window.lua`.
fn fixed_window_take(
    before: u64,
    hits: u64,
    limit: u64,
    window_secs: u64,
    window_start: u64,
    now_ms: u64,
) -> (Outcome, Option<u64>) {
    match before.checked_add(hits).filter(|&after| after <= limit) {
        Some(after) => (
            fixed_window_outcome(after, limit, window_secs, window_start, now_ms),
            (hits > 0).then_some(after),
        ),
        None => (
            Outcome {
                admitted: false,
                ..fixed_window_outcome(before, limit, window_secs, window_start, now_ms)
            },
            None,
        ),
    }
}

/// A sliding-window log as (time, running total) entries: each call that logs hits adds one
/// entry, or adds to the newest when it has the same time, whatever its hits; so a call costs the
/// same at 1 hit and at 100 000 (issue #27: one entry per hit let a single costly call hold a
/// store for hundreds of milliseconds and leave that many entries behind). It holds at most
/// min(hits logged, calls that logged) entries, so never more than the limit it was logged
/// under. The running total makes "the time of the n-th hit in the window" a binary search.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Log {
    /// The running total before the first entry: the hits the log dropped.
    base: u64,
    /// (time, running total after this entry's hits), oldest first; both strictly increasing.
    entries: VecDeque<(u64, u64)>,
}

impl Log {
    /// The hits the log holds.
    pub(crate) fn hits(&self) -> u64 {
        self.entries.back().map_or(self.base, |&(_, end)| end) - self.base
    }

    /// How many entries it holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no entry (every hit has left the window).
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn newest(&self) -> Option<u64> {
        self.entries.back().map(|&(t, _)| t)
    }

    /// Where the window `(now - window, now]` starts: the index of its first entry and the
    /// running total before it. A binary search, so a look never walks the log.
    fn window_start(&self, window: u64, now: u64) -> (usize, u64) {
        let first = self.entries.partition_point(|&(t, _)| t + window <= now);
        let base = match first {
            0 => self.base,
            i => self.entries[i - 1].1,
        };
        (first, base)
    }

    /// The time of the hit `index` (0 the oldest) counted from the running total `base`.
    fn time_of_hit(&self, base: u64, index: u64) -> u64 {
        let i = self
            .entries
            .partition_point(|&(_, end)| end <= base + index);
        self.entries[i].0
    }

    /// Logs `n` hits at `now` (never before the newest entry).
    fn push(&mut self, now: u64, n: u64) {
        if n == 0 {
            return;
        }
        let end = self.entries.back().map_or(self.base, |&(_, end)| end) + n;
        match self.entries.back_mut() {
            Some(newest) if newest.0 == now => newest.1 = end,
            _ => self.entries.push_back((now, end)),
        }
    }
}

/// What the log decides at `now` (already no earlier than its newest entry) for `hits`, given
/// the window's running-total `base` and the `count` of hits in it, when `record` more hits
/// are logged for a refusal. Returns the outcome and the hits to log.
fn log_decision(
    log: &Log,
    (base, count): (u64, u64),
    hits: u64,
    record_refused: bool,
    (limit, window): (u64, u64),
    now: u64,
) -> (Outcome, u64) {
    // Until the newest hit leaves the window, with `logged` hits added at `now`.
    let until_empty = |logged: u64| match (logged > 0, log.newest()) {
        (true, _) => window,
        (false, Some(newest)) if count > 0 => newest + window - now,
        _ => 0,
    };
    // A zero-cost check is decided as a one-hit request and counts nothing.
    let probe = hits.max(1);
    if probe <= limit && count + probe <= limit {
        let outcome = Outcome {
            admitted: true,
            remaining: limit - count - hits,
            reset_ms: micros_to_ms(until_empty(hits)),
            used: count + hits,
        };
        return (outcome, hits);
    }
    // Refused, still charged: up to what fills the log to the limit.
    let logged = if record_refused {
        hits.min(limit.saturating_sub(count))
    } else {
        0
    };
    let count = count + logged;
    let wait = if probe > limit {
        until_empty(logged)
    } else {
        // The (count + probe - limit)-th oldest hit must leave the window first. (The log may
        // hold more than the limit after UPDATE_KEEP_STATE lowered it.)
        let index = count + probe - limit - 1;
        let at = if index < count - logged {
            log.time_of_hit(base, index)
        } else {
            now
        };
        at + window - now
    };
    let outcome = Outcome {
        admitted: false,
        remaining: limit.saturating_sub(count),
        reset_ms: micros_to_ms(wait),
        used: count,
    };
    (outcome, logged)
}

/// Sliding-window log: admitted iff fewer than `limit` admissions (counting this one's hits)
/// lie in the window `(now - window, now]`. Only admitted hits are logged (and refused ones
/// under `record_refused`, up to the limit), as [`Log`] entries: a call costs O(log entries)
/// whatever its hits, and the log never holds more than `limit` hits. Twin of
/// `lua/sliding_window_log.lua`.
pub(crate) fn sliding_window_log(
    state: Option<State>,
    hits: u64,
    record_refused: bool,
    limit: u64,
    window: u64,
    now: u64,
) -> Step {
    let mut log = match state {
        Some(State::Log(log)) => *log,
        _ => Log::default(),
    };
    // A clock that steps back must not reorder the log.
    let now = log.newest().map_or(now, |newest| now.max(newest));
    // Entries that left the window go: each was added by one call, so this is O(1) amortised.
    let (first, base) = log.window_start(window, now);
    log.entries.drain(..first);
    log.base = base;
    let (outcome, logged) = log_decision(
        &log,
        (base, log.hits()),
        hits,
        record_refused,
        (limit, window),
        now,
    );
    log.push(now, logged);
    let ttl = log.newest().map_or(0, |newest| newest + window - now);
    Step {
        outcome,
        keep: (!log.is_empty()).then(|| (State::Log(Box::new(log)), ttl)),
    }
}

/// [`sliding_window_log`]'s outcome for a trial (a dry run), read from the log in place: nothing
/// is logged (a trial's refusals are never recorded, as in the Lua twin's dry run) and nothing
/// copied, so a trial costs O(log entries) too.
pub(crate) fn sliding_window_log_trial(
    state: Option<&State>,
    hits: u64,
    limit: u64,
    window: u64,
    now: u64,
) -> Outcome {
    let empty = Log::default();
    let log = match state {
        Some(State::Log(log)) => log,
        _ => &empty,
    };
    let now = log.newest().map_or(now, |newest| now.max(newest));
    // Entries that left the window stay (nothing is written); they end at or below `base`, so
    // neither the count nor "the time of hit n" sees them.
    let (_, base) = log.window_start(window, now);
    let count = log.entries.back().map_or(base, |&(_, end)| end) - base;
    log_decision(log, (base, count), hits, false, (limit, window), now).0
}

/// Sliding-window counter: the current window's count plus the previous window's, weighted by the
/// share of the trailing window that still overlaps it. Windows are aligned to the epoch on the
/// store's clock. It assumes the previous window's hits were spread evenly, so a burst at the end
/// of the previous window is under-weighted by up to its size times the elapsed fraction.
///
/// The reported reset never exceeds the window, like every other window's: the estimate's own
/// horizon (the current window's hits weigh until the end of the next one) reaches up to twice
/// the window, which no client should be told to wait. A request refused early in a window may
/// therefore be refused once more at that retry.
pub(crate) fn sliding_window_counter(
    state: Option<State>,
    hits: u64,
    record_refused: bool,
    limit: u64,
    window: u64,
    now: u64,
) -> Step {
    let (start, mut current, previous, now) = roll_windows(state, window, now);
    let elapsed = now - start;
    let weighted = (previous as f64 * (window - elapsed) as f64 / window as f64).floor() as u64;
    let estimate = weighted + current;
    // A zero-cost check is decided as a one-hit request and counts nothing.
    let probe = hits.max(1);
    let admitted = probe <= limit && estimate + probe <= limit;
    let recorded = !admitted && record_refused && hits > 0;
    if admitted {
        current += hits;
    } else if recorded {
        // Refused, still charged: this window's count grows up to the limit.
        current = (current + hits.min(limit)).min(limit);
    }
    let estimate = if recorded {
        weighted + current
    } else {
        estimate
    };
    let ttl = start + 2 * window - now;
    let until_empty = if current > 0 {
        ttl
    } else if previous > 0 {
        start + window - now
    } else {
        0
    };
    let wait = sliding_window_wait(
        (admitted, probe, limit),
        (current, previous),
        (window, elapsed),
        until_empty,
    );
    let used = if admitted { estimate + hits } else { estimate };
    Step {
        outcome: Outcome {
            admitted,
            remaining: limit.saturating_sub(used),
            reset_ms: micros_to_ms(wait),
            used,
        },
        // Rolling the windows forward is a pure function of the old state and the time, so only
        // an admission that counted something needs to be written (as in the Lua twin).
        keep: ((admitted && hits > 0 || recorded) && (current > 0 || previous > 0)).then(|| {
            // Admitted counts are at most the limit, which is a u32.
            let narrow = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
            (
                State::Windows {
                    start,
                    current: narrow(current),
                    previous: narrow(previous),
                },
                ttl,
            )
        }),
    }
}

/// The sliding-window counter's windows at `now` (clamped to the newest window seen, which it
/// also returns): the current window's start and count and the previous window's count, rolled
/// forward from `state`.
fn roll_windows(state: Option<State>, window: u64, now: u64) -> (u64, u64, u64, u64) {
    let (mut start, mut current, mut previous) = match state {
        Some(State::Windows {
            start,
            current,
            previous,
        }) => (start, u64::from(current), u64::from(previous)),
        _ => (0, 0, 0),
    };
    // A clock that steps back stays in the newest window seen.
    let now = now.max(start);
    let aligned = now / window * window;
    if aligned == start + window {
        previous = current;
        current = 0;
    } else if aligned != start {
        previous = 0;
        current = 0;
    }
    start = aligned;
    (start, current, previous, now)
}

/// How long a sliding-window counter's caller should wait (in the window's unit, at most the
/// window): until the counts are empty when admitted or when the request can never fit, else
/// until the weighted estimate leaves room for it.
fn sliding_window_wait(
    (admitted, probe, limit): (bool, u64, u64),
    (current, previous): (u64, u64),
    (window, elapsed): (u64, u64),
    until_empty: u64,
) -> u64 {
    let wait = if admitted || probe > limit {
        until_empty
    } else if current + probe <= limit {
        // Wait for the previous window's weight to shrink enough, at the latest to its end.
        let room = (limit - current - probe) as f64;
        let at = (window as f64 - (room + 1.0) * window as f64 / previous as f64).floor() + 1.0;
        (at.max(elapsed as f64 + 1.0).min(window as f64) as u64) - elapsed
    } else {
        // This window's count becomes the previous one; wait until its weight has shrunk.
        let room = (limit - probe) as f64;
        let at = (window as f64 - (room + 1.0) * window as f64 / current as f64).floor() + 1.0;
        window - elapsed + at.max(0.0) as u64
    };
    wait.min(window)
}

/// A refused GCRA request, still charged (`record_refused`): the hits are taken in full, past
/// empty into a debt that the refill pays back before anything is admitted again, so a cost
/// charged after the fact (Envoy's stream-done charge) counts as a cost. The debt stops at one
/// bucket (the TAT at two bucket times from now, never moved back), so no charge, however large,
/// keeps a key refused for longer than one bucket time and one token's. Returns the state to
/// keep, if the TAT moved. Twin of `gcra_charge` in `lua/gcra.lua`.
fn gcra_charge(
    tat: u64,
    hits: u64,
    interval: u64,
    capacity: u64,
    now: u64,
) -> Option<(State, u64)> {
    let charged = tat
        .saturating_add(hits.saturating_mul(interval))
        .min(now.saturating_add(capacity.saturating_mul(2)))
        .max(tat);
    (charged > tat).then_some((State::Tat(charged), charged - now))
}

/// GCRA with emission interval `interval` and room for `burst` requests at once. This is also the
/// token bucket (capacity `burst`, one token per `interval`) and the leaky bucket as a meter
/// (size `burst`, draining one per `interval`): with tokens = burst - (TAT - now) / interval the
/// three admission rules are the same inequality.
pub(crate) fn gcra(
    state: Option<State>,
    hits: u64,
    record_refused: bool,
    interval: u64,
    burst: u64,
    now: u64,
) -> Step {
    let stored = match state {
        Some(State::Tat(tat)) => tat,
        _ => now,
    };
    // A TAT in the future is kept when the clock steps back: no tokens are minted.
    let tat = stored.max(now);
    // Saturating here and below: the numbers a config allows keep every sum far from u64::MAX
    // (a bucket spans at most 2^51 µs), but a degraded share (`degraded/share.rs`) multiplies
    // the interval, and a charge multiplies it by hits up to 2^32.
    let capacity = burst.saturating_mul(interval);
    let charge = |tat| gcra_charge(tat, hits, interval, capacity, now);
    let tokens =
        |tat: u64| ((capacity - (tat - now).min(capacity)) as f64 / interval as f64).floor() as u64;
    if hits > burst {
        // More than the bucket holds: never admissible, so no wait would help.
        let keep = if record_refused { charge(tat) } else { None };
        let tat = keep.as_ref().map_or(tat, |(_, ttl)| now + ttl);
        let remaining = tokens(tat);
        return Step {
            outcome: Outcome {
                admitted: false,
                remaining,
                reset_ms: micros_to_ms(tat - now),
                used: burst - remaining,
            },
            keep,
        };
    }
    // A zero-cost check is decided as a one-hit request and counts nothing.
    let probe_tat = tat.saturating_add(hits.max(1).saturating_mul(interval));
    if probe_tat - now <= capacity {
        let new_tat = tat.saturating_add(hits.saturating_mul(interval));
        let remaining = tokens(new_tat);
        return Step {
            outcome: Outcome {
                admitted: true,
                remaining,
                reset_ms: micros_to_ms(new_tat - now),
                used: burst - remaining,
            },
            keep: (hits > 0 && new_tat > now).then_some((State::Tat(new_tat), new_tat - now)),
        };
    }
    let keep = if record_refused && hits > 0 {
        charge(tat)
    } else {
        None
    };
    let tat = keep.as_ref().map_or(tat, |(_, ttl)| now + ttl);
    let remaining = tokens(tat);
    Step {
        outcome: Outcome {
            admitted: false,
            remaining,
            reset_ms: micros_to_ms(
                tat.saturating_add(hits.max(1).saturating_mul(interval)) - now - capacity,
            ),
            used: burst - remaining,
        },
        keep,
    }
}

/// Parameters of Guava's SmoothWarmingUp, derived from the limit as Guava derives them.
struct WarmUpShape {
    stable: f64,
    threshold: f64,
    max_permits: f64,
    slope: f64,
    cool_down: f64,
}

impl WarmUpShape {
    fn new(permits_per_window: u64, window: u64, warmup: u64, cold_factor: f64) -> Self {
        let stable = window as f64 / permits_per_window as f64;
        let cold = stable * cold_factor;
        let warmup = warmup as f64;
        let threshold = 0.5 * warmup / stable;
        let max_permits = threshold + 2.0 * warmup / (stable + cold);
        Self {
            stable,
            threshold,
            max_permits,
            slope: (cold - stable) / (max_permits - threshold),
            cool_down: warmup / max_permits,
        }
    }

    /// Time to take `take` of `stored` permits: the area under the interval curve.
    fn cost(&self, stored: f64, take: f64) -> f64 {
        let above = stored - self.threshold;
        let mut take = take;
        let mut micros = 0.0;
        if above > 0.0 {
            let used = above.min(take);
            let length =
                self.stable + above * self.slope + (self.stable + (above - used) * self.slope);
            micros = used * length / 2.0;
            take -= used;
        }
        micros + self.stable * take
    }
}

/// Guava's SmoothWarmingUp as an admission rule: a request is admitted when the previous
/// reservation's wait has passed (Guava's `tryAcquire(permits, 0)`), and then pushes the next
/// free time out by its own cost, which is larger while the limiter is cold (idle). Guava lets one
/// request of any size through and makes the next wait ("pay later"); here a single request may
/// not cost more than one unit's worth (`permits_per_window`). So `remaining` is
/// `permits_per_window` while the next free time has passed (any request up to that size would
/// be admitted) and 0 before.
// The arguments mirror the Lua twin's, one for one, so the two are easy to compare.
#[allow(clippy::too_many_arguments)]
pub(crate) fn warm_up(
    state: Option<State>,
    hits: u64,
    record_refused: bool,
    permits_per_window: u64,
    window: u64,
    warmup: u64,
    cold_factor: f64,
    now: u64,
) -> Step {
    let shape = WarmUpShape::new(permits_per_window, window, warmup, cold_factor);
    let (mut stored, mut next_free) = match state {
        Some(State::WarmUp {
            stored_millionths,
            next_free,
        }) => (stored_millionths as f64 / 1e6, next_free),
        // A new limiter starts cold, as Guava's does.
        _ => (shape.max_permits, now),
    };
    if now > next_free {
        stored = shape
            .max_permits
            .min(stored + (now - next_free) as f64 / shape.cool_down);
        next_free = now;
    }
    let admitted = hits <= permits_per_window && next_free <= now;
    if admitted && hits > 0 {
        let spend = (hits as f64).min(stored);
        let wait = shape.cost(stored, spend) + (hits as f64 - spend) * shape.stable;
        next_free += wait.floor() as u64;
        stored -= spend;
    }
    let recorded = !admitted && record_refused && hits > 0;
    if recorded {
        // Refused, still charged: the next free time moves by the hits' stable cost, to one
        // window from now at most (and never back).
        let pushed = next_free.saturating_add((hits as f64 * shape.stable).floor() as u64);
        next_free = next_free.max(pushed.min(now + window));
    }
    let stored_millionths = (stored * 1e6).floor() as u64;
    let free_in = next_free.saturating_sub(now);
    let ttl = free_in + ((shape.max_permits - stored) * shape.cool_down).ceil() as u64;
    let remaining = if next_free <= now {
        permits_per_window
    } else {
        0
    };
    Step {
        outcome: Outcome {
            admitted,
            remaining,
            reset_ms: micros_to_ms(free_in),
            used: permits_per_window - remaining,
        },
        // Refilling the stored permits is a pure function of the old state and the time, so a
        // zero-cost check writes nothing.
        keep: (admitted && hits > 0 || recorded).then_some((
            State::WarmUp {
                stored_millionths,
                next_free,
            },
            ttl.max(1),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    /// Runs `f` over arrivals, threading the state, and returns the admitted flags.
    fn run(mut f: impl FnMut(Option<State>, u64) -> Step, arrivals: &[u64]) -> Vec<bool> {
        let mut state = None;
        arrivals
            .iter()
            .map(|&t| {
                let step = f(state.clone(), t);
                if let Some((s, _)) = step.keep {
                    state = Some(s);
                }
                step.outcome.admitted
            })
            .collect()
    }

    #[test]
    fn log_is_strict_over_any_trailing_window() {
        // Limit 3 per 10 s; 3 at t=9 s, then t=10..=18 refused, t=19 s admitted again.
        let arrivals: Vec<u64> = [9, 9, 9, 10, 18, 19, 19, 19, 20]
            .iter()
            .map(|s| s * S)
            .collect();
        let got = run(
            |st, t| sliding_window_log(st, 1, false, 3, 10 * S, t),
            &arrivals,
        );
        assert_eq!(
            got,
            [true, true, true, false, false, true, true, true, false]
        );
    }

    #[test]
    fn log_reports_the_wait_for_the_oldest_needed_entry() {
        let mut state = None;
        for t in [1, 2, 3] {
            state = sliding_window_log(state, 1, false, 3, 10 * S, t * S)
                .keep
                .map(|(s, _)| s);
        }
        let refused = sliding_window_log(state.clone(), 2, false, 3, 10 * S, 5 * S);
        assert!(!refused.outcome.admitted);
        // Two entries must go: the one from t=2 leaves at 12 s, 7 s from now.
        assert_eq!(refused.outcome.reset_ms, 7_000);
        assert_eq!(refused.outcome.remaining, 0);
        let too_big = sliding_window_log(state, 4, false, 3, 10 * S, 5 * S);
        assert!(!too_big.outcome.admitted);
    }

    #[test]
    fn counter_weights_the_previous_window() {
        // Limit 10 per 10 s; 10 admitted in [0, 10); at 15 s the previous weighs 5.
        let mut state = None;
        for _ in 0..10 {
            let step = sliding_window_counter(state, 1, false, 10, 10 * S, S);
            assert!(step.outcome.admitted);
            state = step.keep.map(|(s, _)| s);
        }
        let mid = sliding_window_counter(state.clone(), 1, false, 10, 10 * S, 15 * S);
        assert_eq!(mid.outcome.used, 6);
        let five_more = sliding_window_counter(state, 6, false, 10, 10 * S, 15 * S);
        assert!(!five_more.outcome.admitted);
        // 5 + 6 > 10 needs the weight at most 4: floor(10 * (10 - e) / 10) <= 4 once e > 5 s,
        // which is 1 µs away (reported as the 1 ms minimum).
        assert_eq!(five_more.outcome.reset_ms, 1);
    }

    #[test]
    fn gcra_bursts_then_paces() {
        // 1 per second, burst 3: three at once, then one per second.
        let arrivals: Vec<u64> = [0, 0, 0, 0, 1, 1, 2, 3]
            .iter()
            .map(|s| 100 * S + s * S)
            .collect();
        let got = run(|st, t| gcra(st, 1, false, S, 3, t), &arrivals);
        assert_eq!(got, [true, true, true, false, true, false, true, true]);
    }

    #[test]
    fn gcra_matches_a_literal_token_bucket() {
        // A plain token bucket in integer microtokens, fed the same random-ish traffic.
        let (interval, burst) = (250_000u64, 4u64);
        let mut tokens = burst * interval; // microtokens: one token = `interval`
        let mut last = 0u64;
        let mut state = None;
        let mut t = 0u64;
        for i in 0..2_000u64 {
            t += (i * 7919) % 400_000;
            let cost = 1 + (i % 3);
            tokens = (tokens + (t - last)).min(burst * interval);
            last = t;
            let expected = tokens >= cost * interval;
            if expected {
                tokens -= cost * interval;
            }
            let step = gcra(state.clone(), cost, false, interval, burst, t);
            assert_eq!(step.outcome.admitted, expected, "request {i} at {t}");
            assert_eq!(step.outcome.remaining, tokens / interval, "request {i}");
            if let Some((s, _)) = step.keep {
                state = Some(s);
            }
        }
    }

    #[test]
    fn warm_up_starts_slow_and_reaches_the_stable_rate() {
        // 10 per second (stable 100 ms), warm-up 1 s, cold factor 3: cold interval 300 ms.
        let mut state = None;
        let mut t = 1_000 * S;
        let mut gaps = Vec::new();
        let mut last = t;
        for _ in 0..2_000 {
            // Ask every 10 ms; record the spacing of admissions.
            let step = warm_up(state.clone(), 1, false, 10, S, S, 3.0, t);
            if step.outcome.admitted {
                gaps.push(t - last);
                last = t;
                state = step.keep.map(|(s, _)| s);
            }
            t += 10_000;
            if gaps.len() > 12 {
                break;
            }
        }
        // First gap is 0 (admitted at once); the next ones shrink from ~300 ms towards 100 ms.
        assert!(gaps[1] >= 250_000, "{gaps:?}");
        assert!(*gaps.last().unwrap() <= 110_000, "{gaps:?}");
        assert!(
            gaps.windows(2).skip(1).all(|w| w[1] <= w[0] + 10_000),
            "{gaps:?}"
        );
    }

    /// Threads the state through `f` for each cost in `costs` at time `now`; returns the last
    /// step's outcome and the state after it.
    fn after(
        mut f: impl FnMut(Option<State>, u64) -> Step,
        costs: &[u64],
    ) -> (Option<Outcome>, Option<State>) {
        let mut state = None;
        let mut last = None;
        for &hits in costs {
            let step = f(state.clone(), hits);
            last = Some(step.outcome);
            if let Some((s, _)) = step.keep {
                state = Some(s);
            }
        }
        (last, state)
    }

    /// One algorithm with its numbers fixed: (state, hits) to step.
    type Algorithm = dyn Fn(Option<State>, u64) -> Step;

    #[test]
    fn a_zero_cost_check_is_refused_when_no_permit_is_left_and_writes_nothing() {
        let now = 1_000 * S;
        // Each algorithm, limit 3, after 3 admitted hits: a zero-cost check is refused, and
        // before that it is admitted; neither writes a state.
        let algorithms: [(&str, Box<Algorithm>); 4] = [
            (
                "log",
                Box::new(move |st, h| sliding_window_log(st, h, false, 3, 10 * S, now)),
            ),
            (
                "counter",
                Box::new(move |st, h| sliding_window_counter(st, h, false, 3, 10 * S, now)),
            ),
            ("gcra", Box::new(move |st, h| gcra(st, h, false, S, 3, now))),
            (
                "warm_up",
                Box::new(move |st, h| warm_up(st, h, false, 3, S, S, 3.0, now)),
            ),
        ];
        for (name, f) in &algorithms {
            let (_, full) = after(f, if *name == "warm_up" { &[3] } else { &[1, 2] });
            let (_, some_left) = after(f, &[1]);
            let look = f(some_left.clone(), 0);
            if *name != "warm_up" {
                assert!(look.outcome.admitted, "{name}: a permit is left");
                assert_eq!(look.outcome.remaining, 2, "{name}");
            }
            let look = f(full.clone(), 0);
            assert!(!look.outcome.admitted, "{name}: no permit left");
            assert_eq!(look.outcome.remaining, 0, "{name}");
            // The wait is the one-hit request's wait.
            assert_eq!(
                look.outcome.reset_ms,
                f(full.clone(), 1).outcome.reset_ms,
                "{name}"
            );
            assert!(
                look.keep.is_none() || look.keep.map(|(s, _)| s) == full,
                "{name}: a zero-cost check changes nothing"
            );
        }
        // A fresh key: admitted, nothing written (the log keeps nothing when empty).
        for (name, f) in &algorithms {
            let look = f(None, 0);
            assert!(look.outcome.admitted, "{name}");
            assert!(
                look.keep.is_none(),
                "{name}: a zero-cost check writes nothing"
            );
        }
    }

    #[test]
    fn warm_up_reports_what_one_request_may_take() {
        // 50 per second: ready means any request up to 50 is admitted, so 50 are available.
        let look = warm_up(None, 0, false, 50, S, S, 3.0, S);
        assert_eq!(look.outcome.remaining, 50);
        let taken = warm_up(None, 50, false, 50, S, S, 3.0, S);
        assert!(taken.outcome.admitted);
        assert_eq!(taken.outcome.remaining, 0);
        let next = warm_up(taken.keep.map(|(s, _)| s), 0, false, 50, S, S, 3.0, S);
        assert_eq!(next.outcome.remaining, 0);
    }

    #[test]
    fn the_counter_never_reports_a_reset_beyond_its_window() {
        // Limit 3 per 10 s, all taken 1 s into a window: the estimate only empties at the end of
        // the next window (19 s away), but the reported reset is at most the window.
        let (out, state) = after(
            |st, h| sliding_window_counter(st, h, false, 3, 10 * S, 21 * S),
            &[3],
        );
        assert_eq!(out.map(|o| o.reset_ms), Some(10_000));
        let refused = sliding_window_counter(state, 2, false, 3, 10 * S, 21 * S);
        assert!(!refused.outcome.admitted);
        assert!(refused.outcome.reset_ms <= 10_000, "{:?}", refused.outcome);
    }

    #[test]
    fn recorded_refusals_fill_a_window_or_put_a_bucket_in_debt() {
        let now = 1_000 * S;
        // Log, limit 3: 2 logged, a refused charge of 5 fills it to 3, never beyond.
        let (_, state) = after(
            |st, h| sliding_window_log(st, h, false, 3, 10 * S, now),
            &[2],
        );
        let step = sliding_window_log(state, 5, true, 3, 10 * S, now);
        assert!(!step.outcome.admitted);
        assert_eq!((step.outcome.used, step.outcome.remaining), (3, 0));
        assert!(matches!(step.keep, Some((State::Log(ref log), _)) if log.hits() == 3));

        // Counter, limit 3: the current window's count grows to 3 at most.
        let (_, state) = after(
            |st, h| sliding_window_counter(st, h, false, 3, 10 * S, now),
            &[2],
        );
        let step = sliding_window_counter(state, 5, true, 3, 10 * S, now);
        assert!(!step.outcome.admitted);
        assert!(matches!(
            step.keep,
            Some((State::Windows { current: 3, .. }, _))
        ));

        // Bucket, burst 3 at 1 per second, one taken: a refused charge of 3 is taken in full,
        // one token into debt (TAT = now + 4 s); a huge one is taken in full too, up to a debt
        // of one bucket (TAT = now + 6 s), never beyond.
        let (_, state) = after(|st, h| gcra(st, h, false, S, 3, now), &[1]);
        let step = gcra(state.clone(), 3, true, S, 3, now);
        assert!(!step.outcome.admitted);
        assert_eq!(step.outcome.remaining, 0);
        let in_debt = step.keep.map(|(s, _)| s);
        assert_eq!(in_debt, Some(State::Tat(now + 4 * S)));
        let huge = gcra(state, 1_000, true, S, 3, now);
        assert_eq!(huge.keep.map(|(s, _)| s), Some(State::Tat(now + 6 * S)));
        let deeper = gcra(in_debt.clone(), 3, true, S, 3, now);
        assert_eq!(deeper.keep.map(|(s, _)| s), Some(State::Tat(now + 6 * S)));
        // In debt, even a zero-cost check waits until the debt is paid and a token is back.
        let check = gcra(in_debt, 0, true, S, 3, now);
        assert!(!check.outcome.admitted);
        assert_eq!(check.outcome.reset_ms, 2_000);
        // Not recorded unless asked, and never for a zero-cost check.
        let (_, full) = after(|st, h| gcra(st, h, false, S, 3, now), &[3]);
        assert!(gcra(full.clone(), 1, false, S, 3, now).keep.is_none());
        assert!(gcra(full, 0, true, S, 3, now).keep.is_none());

        // Warm-up, 10 per second: a refused charge moves the next free time by its stable cost
        // (100 ms per hit), one window (1 s) from now at most.
        let taken = warm_up(None, 1, false, 10, S, S, 3.0, now);
        let state = taken.keep.map(|(s, _)| s);
        let Some(State::WarmUp { next_free, .. }) = state else {
            panic!("{state:?}")
        };
        let step = warm_up(state.clone(), 2, true, 10, S, S, 3.0, now);
        assert!(matches!(
            step.keep,
            Some((State::WarmUp { next_free: n, .. }, _)) if n == (next_free + 200_000).min(now + S)
        ));
        let step = warm_up(state, 10, true, 10, S, S, 3.0, now);
        assert!(matches!(
            step.keep,
            Some((State::WarmUp { next_free: n, .. }, _)) if n == next_free.max(now + S)
        ));
    }

    #[test]
    fn a_recorded_charge_above_the_bucket_leaves_a_debt_of_one_bucket() {
        // Issue #40: token_bucket, 100 a minute (a token every 600 ms), record_refused_hits, a
        // full bucket. A charge of 100 empties it: 3 tokens are back 2 s later. A charge of 200
        // or of 10^9 goes one bucket into debt (TAT = now + 120 s), as deep as a debt goes.
        let (interval, burst, now) = (600_000, 100, 1_000 * S);
        let bucket = |state, hits, at| gcra(state, hits, true, interval, burst, at);
        let emptied = bucket(None, 100, now);
        assert!(emptied.outcome.admitted);
        let look = bucket(emptied.keep.map(|(s, _)| s), 0, now + 2 * S);
        assert_eq!((look.outcome.admitted, look.outcome.remaining), (true, 3));
        for charge in [200, 1_000_000_000] {
            let step = bucket(None, charge, now);
            let want = Outcome {
                admitted: false,
                remaining: 0,
                // More than the bucket holds: the wait until it is full again.
                reset_ms: 120_000,
                used: 100,
            };
            assert_eq!(step.outcome, want, "{charge}");
            // The key lives until the bucket is full again: two minutes.
            assert_eq!(
                step.keep,
                Some((State::Tat(now + 120 * S), 120 * S)),
                "{charge}"
            );
            let in_debt = step.keep.map(|(s, _)| s);
            // 2 s later: no token, a zero-cost check refused until the debt is paid (60 s) and
            // one token is back (600 ms more), and nothing changed by asking.
            let look = bucket(in_debt.clone(), 0, now + 2 * S);
            let want = Outcome {
                admitted: false,
                remaining: 0,
                reset_ms: 58_600,
                used: 100,
            };
            assert_eq!(look.outcome, want, "{charge}");
            assert!(look.keep.is_none());
            // At the same instant, a charge into a full debt moves nothing.
            assert!(bucket(in_debt.clone(), 1, now).keep.is_none());
            let just_before = bucket(in_debt.clone(), 0, now + 60_600_000 - 1);
            assert!(!just_before.outcome.admitted, "{charge}");
            let first_token = bucket(in_debt, 1, now + 60_600_000);
            assert!(first_token.outcome.admitted, "{charge}");
            assert_eq!(first_token.outcome.remaining, 0);
        }
    }

    #[test]
    fn a_debt_stays_exact_and_bounded_at_the_largest_numbers() {
        // The longest bucket a config allows (2^51 µs: burst 1, a token every 2^51 µs) and the
        // largest cost (2^32): the debt is one bucket, no arithmetic overflows. An interval
        // multiplied past u64 (a degraded share of an already long one) saturates instead.
        let now = 1_700_000_000_123_457;
        let span = 1 << 51;
        let step = gcra(None, 1 << 32, true, span, 1, now);
        assert_eq!(step.keep, Some((State::Tat(now + 2 * span), 2 * span)));
        assert_eq!(step.outcome.remaining, 0);
        for interval in [u64::MAX / 2, u64::MAX] {
            let step = gcra(None, 1 << 32, true, interval, 2, now);
            assert!(!step.outcome.admitted);
            assert_eq!(step.keep, Some((State::Tat(u64::MAX), u64::MAX - now)));
        }
    }

    /// The log as it was before issue #27: one entry per hit. The (time, total) log must give
    /// exactly its answers.
    fn per_hit_log(
        log: &mut VecDeque<u64>,
        hits: u64,
        record_refused: bool,
        (limit, window): (u64, u64),
        now: u64,
    ) -> Outcome {
        let now = log.back().map_or(now, |&newest| now.max(newest));
        while log.front().is_some_and(|&t| t + window <= now) {
            log.pop_front();
        }
        let count = log.len() as u64;
        let until_empty = |log: &VecDeque<u64>| log.back().map_or(0, |&n| n + window - now);
        let probe = hits.max(1);
        if probe <= limit && count + probe <= limit {
            log.extend(std::iter::repeat_n(now, hits as usize));
            return Outcome {
                admitted: true,
                remaining: limit - count - hits,
                reset_ms: micros_to_ms(until_empty(log)),
                used: count + hits,
            };
        }
        if record_refused {
            let n = hits.min(limit.saturating_sub(count));
            log.extend(std::iter::repeat_n(now, n as usize));
        }
        let count = log.len() as u64;
        let wait = if probe > limit {
            until_empty(log)
        } else {
            log[(count + probe - limit - 1) as usize] + window - now
        };
        Outcome {
            admitted: false,
            remaining: limit.saturating_sub(count),
            reset_ms: micros_to_ms(wait),
            used: count,
        }
    }

    proptest::proptest! {
        /// Random sequences (gaps, clock steps back, costs from 0 to above the limit, the limit
        /// lowered and raised as UPDATE_KEEP_STATE does, refusals recorded or not): the log of
        /// (time, total) entries answers as the log of one entry per hit, holds as many hits,
        /// never more entries than calls that logged, and a trial answers as the charge would
        /// without recording.
        #[test]
        fn the_entry_log_answers_as_the_per_hit_log(
            steps in proptest::collection::vec(
                (0u64..4_000_000, proptest::bool::weighted(0.1), 0u64..12, proptest::bool::ANY,
                 1u64..10),
                1..80,
            ),
        ) {
            let window = 10 * S;
            let mut reference = VecDeque::new();
            let mut state: Option<State> = None;
            let mut now = 1_000 * S;
            for (gap, back, hits, record, limit) in steps {
                if back { now -= gap / 4 } else { now += gap }
                let trial = sliding_window_log_trial(state.as_ref(), hits, limit, window, now);
                let mut looked = reference.clone();
                let want_trial = per_hit_log(&mut looked, hits, false, (limit, window), now);
                proptest::prop_assert_eq!(trial, want_trial);
                let want = per_hit_log(&mut reference, hits, record, (limit, window), now);
                let step = sliding_window_log(state.take(), hits, record, limit, window, now);
                proptest::prop_assert_eq!(step.outcome, want);
                state = step.keep.map(|(s, _)| s);
                let held = match &state {
                    Some(State::Log(log)) => {
                        proptest::prop_assert!(log.len() as u64 <= log.hits());
                        log.hits()
                    }
                    _ => 0,
                };
                let newest = reference.back().copied().unwrap_or(0);
                let live = reference.iter().filter(|&&t| t + window > now.max(newest)).count();
                proptest::prop_assert_eq!(held, live as u64);
            }
        }
    }

    #[test]
    fn a_costly_call_is_one_entry() {
        // 100 000 hits in one call: one entry; 1 000 calls at one instant: one entry.
        let step = sliding_window_log(None, 100_000, false, 100_000, 10 * S, S);
        let Some((State::Log(log), _)) = step.keep else {
            panic!("{:?}", step.keep)
        };
        assert_eq!((log.len(), log.hits()), (1, 100_000));
        let mut state = None;
        for _ in 0..1_000 {
            state = sliding_window_log(state, 3, false, 100_000, 10 * S, S)
                .keep
                .map(|(s, _)| s);
        }
        let Some(State::Log(log)) = state else {
            panic!("{state:?}")
        };
        assert_eq!((log.len(), log.hits()), (1, 3_000));
    }

    #[test]
    fn warm_up_refuses_more_than_one_unit() {
        let step = warm_up(None, 11, false, 10, S, S, 3.0, S);
        assert!(!step.outcome.admitted);
        assert!(step.keep.is_none());
    }
}
