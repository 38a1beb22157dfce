//! The Lua scripts: their sources (assembled from the files in `lua/`), their SHA1s, and the
//! layout of their arguments and of the decision scripts' replies. The one place that knows how
//! a [`Rule`] is spelled for Lua and how a reply is read back into [`Outcome`]s.

use std::sync::LazyLock;

use crate::store::algorithms::fixed_window_outcome;
use crate::store::{Charging, Check, LimiterRecord, Outcome, Rule, StoreError};

/// Helpers and algorithms, shared by both entry points; each script is one chunk so its entry
/// point can call them.
const LIBRARY: &[&str] = &[
    include_str!("../../../lua/common.lua"),
    include_str!("../../../lua/fixed_window.lua"),
    include_str!("../../../lua/sliding_window_log.lua"),
    include_str!("../../../lua/sliding_window_counter.lua"),
    include_str!("../../../lua/gcra.lua"),
    include_str!("../../../lua/warm_up.lua"),
    include_str!("../../../lua/concurrency.lua"),
    include_str!("../../../lua/dispatch.lua"),
];

/// Integers in the decision script's reply per check.
pub(super) const REPLY_PER_CHECK: usize = 4;

/// A fixed-window counter that another writer left without a TTL gets one back at the latest
/// when its count passes a multiple of this (`lua/fixed_window.lua`): checking on every hit cost
/// a `PTTL` per descriptor.
pub const TTL_REPAIR_PERIOD: u64 = 64;

/// Arguments before the first check's, as `lua/decide.lua` reads them: the pinned time and
/// the charging mode.
const LEADING_ARGS: usize = 2;

/// Arguments per check after the leading ones, as `lua/decide.lua` reads them.
const ARGS_PER_CHECK: usize = 7;

pub(super) struct LuaScript {
    pub source: String,
    pub sha1: String,
}

impl LuaScript {
    fn assemble(entry_point: &str) -> Self {
        let mut parts = LIBRARY.to_vec();
        parts.push(entry_point);
        Self::join(&parts)
    }

    /// `parts` with [`ACROSS_SLOTS`] first: the same script, taking its keys in ARGV.
    fn across_slots(parts: &[&str]) -> Self {
        let mut all = vec![ACROSS_SLOTS];
        all.extend_from_slice(parts);
        Self::join(&all)
    }

    fn join(parts: &[&str]) -> Self {
        let source = parts.join("\n");
        let sha1 = sha1_smol::Sha1::from(&source).digest().to_string();
        Self { source, sha1 }
    }
}

/// Decides a batch of RLS checks (`lua/decide.lua`).
pub(super) static DECISION: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::assemble(include_str!("../../../lua/decide.lua")));

/// Prepended to a decision script to make its twin that takes its keys in ARGV and may be given
/// keys of several slots of one cluster master ([`Keys::AcrossSlots`]).
const ACROSS_SLOTS: &str = include_str!("../../../lua/across_slots.lua");

/// The status reply (its first word) of a [`Keys::AcrossSlots`] call that wrote nothing because
/// the node refused one of its keys (`lua/across_slots.lua`).
pub(super) const ELSEWHERE: &str = "ELSEWHERE";

/// [`DECISION`] taking its keys in ARGV ([`Keys::AcrossSlots`]).
pub(super) static DECISION_ACROSS_SLOTS: LazyLock<LuaScript> = LazyLock::new(|| {
    let mut parts = LIBRARY.to_vec();
    parts.push(include_str!("../../../lua/decide.lua"));
    LuaScript::across_slots(&parts)
});

/// Where a decision call carries its checks' keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keys {
    /// In KEYS, all in one slot: a standalone server, or one slot of a cluster, which routes
    /// the call by them.
    Declared,
    /// In ARGV, for one call on a cluster master with keys of several of its slots: Redis
    /// refuses declared keys of different slots (CROSSSLOT), and `lua/across_slots.lua` checks
    /// that the node serves every key before anything is written.
    AcrossSlots,
}

/// How a decision call's reply is laid out: which script the call went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reply {
    /// [`DECISION`]'s: [`REPLY_PER_CHECK`] integers per check, the outcome ([`decode`]).
    Decided,
    /// [`FIXED_WINDOW_LEAN`]'s: the time it read, then each check's count ([`decode_lean`]).
    Counted,
}

impl Reply {
    /// The outcomes of `checks` from the reply of the call [`decision_call`] made for them.
    pub(super) fn decode(
        self,
        reply: &[i64],
        checks: &[&Check],
    ) -> Result<Vec<Outcome>, StoreError> {
        match self {
            Reply::Decided => decode(reply, checks.len()),
            Reply::Counted => decode_lean(reply, checks),
        }
    }
}

/// One call deciding `checks` with their keys laid out as `keys` says: `EVALSHA`, the SHA1 of
/// the lean fixed-window script when [`fits_lean`], of an algorithm's lean script when
/// [`fits_each`] (both only with `lean`, which only tests turn off), or else of the full one,
/// and its arguments; and how to read its reply. `pinned_now_micros` and
/// `ttl_jitter_ms` as [`encode`] takes them.
pub(super) fn decision_call(
    checks: &[&Check],
    charging: Charging,
    lean: bool,
    keys: Keys,
    pinned_now_micros: Option<u64>,
    ttl_jitter_ms: impl FnMut() -> u64,
) -> (redis::Cmd, Reply) {
    if lean && fits_lean(checks, charging) {
        let script = match keys {
            Keys::Declared => &FIXED_WINDOW_LEAN,
            Keys::AcrossSlots => &FIXED_WINDOW_LEAN_ACROSS_SLOTS,
        };
        let mut cmd = evalsha(script, capacity_lean(checks, keys));
        encode_lean(&mut cmd, checks, keys, pinned_now_micros, ttl_jitter_ms);
        (cmd, Reply::Counted)
    } else if let Some(each) = fits_each(checks, charging).filter(|_| lean) {
        let script = match keys {
            Keys::Declared => &each.declared,
            Keys::AcrossSlots => &each.across_slots,
        };
        let mut cmd = evalsha(script, capacity_each(checks, each, keys));
        encode_each(&mut cmd, checks, each, keys, pinned_now_micros);
        (cmd, Reply::Decided)
    } else {
        let script = match keys {
            Keys::Declared => &DECISION,
            Keys::AcrossSlots => &DECISION_ACROSS_SLOTS,
        };
        let mut cmd = evalsha(script, capacity(checks, keys));
        encode(
            &mut cmd,
            checks,
            keys,
            charging,
            pinned_now_micros,
            ttl_jitter_ms,
        );
        (cmd, Reply::Decided)
    }
}

/// `EVALSHA` and `script`'s SHA1, with room for the (arguments, bytes) still to be appended: a
/// hint that saves growing the command one argument at a time; (0, 0) when no one measured that
/// it matters.
pub(super) fn evalsha(script: &LuaScript, (arguments, bytes): (usize, usize)) -> redis::Cmd {
    // Plus the command name and the SHA1 (40 hex digits).
    let mut cmd = redis::Cmd::with_capacity(arguments + 2, bytes + "EVALSHA".len() + 40);
    cmd.arg("EVALSHA").arg(script.sha1.as_str());
    cmd
}

/// Counts a batch of RLS checks that [`fits_lean`] (`lua/fixed_window_lean.lua`): the same
/// writes as [`DECISION`], and with [`decode_lean`] the same answers. It carries only the fixed
/// window's counting, so defining the other algorithms' functions on every call is not part of
/// its cost, and it leaves the judging to Rust, so per check it takes two arguments and
/// returns one integer.
pub(super) static FIXED_WINDOW_LEAN: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::join(LEAN_PARTS));

/// [`FIXED_WINDOW_LEAN`] taking its keys in ARGV ([`Keys::AcrossSlots`]).
pub(super) static FIXED_WINDOW_LEAN_ACROSS_SLOTS: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::across_slots(LEAN_PARTS));

/// The files of the lean script, in order.
const LEAN_PARTS: &[&str] = &[
    include_str!("../../../lua/common.lua"),
    include_str!("../../../lua/fixed_window.lua"),
    CALLS,
    include_str!("../../../lua/fixed_window_lean.lua"),
];

/// What lets one call of a lean script carry several callers' calls (`merge.rs`).
const CALLS: &str = include_str!("../../../lua/calls.lua");

/// `ARGV[2]` of a lean script's call made for one caller: no merged calls (`lua/calls.lua`).
pub(super) const ONE_CALLER: &str = "";

/// Arguments per check of [`FIXED_WINDOW_LEAN`], after its two leading arguments (the pinned
/// time, the merged calls): what `fixed_window_count` in `lua/fixed_window.lua` takes, hits and ttl_ms.
const LEAN_ARGS_PER_CHECK: usize = 2;

/// Integers before the first check's in [`FIXED_WINDOW_LEAN`]'s reply: the time it read, in
/// microseconds.
const LEAN_LEADING_REPLY: usize = 1;

/// Integers per check in [`FIXED_WINDOW_LEAN`]'s reply: the count after its hits.
const LEAN_REPLY_PER_CHECK: usize = 1;

/// Whether every check of a call is charged on its own, as the lean scripts and the plain
/// commands decide them: not only looked at, and needing no trial pass (which
/// [`Charging::StopWhenOver`] over several checks and a group of limits decided all or nothing
/// need, see [`crate::store::needs_trial`]).
fn charged_each_alone(checks: &[&Check], charging: Charging) -> bool {
    charging != Charging::LookOnly && !crate::store::needs_trial(checks, charging)
}

/// Whether [`FIXED_WINDOW_LEAN`] decides `checks` exactly as [`DECISION`] would, and so may
/// stand in for it: every check is a fixed window, charged on its own
/// ([`charged_each_alone`]). A pinned clock is read the same way by both. The one place that
/// decides it: whatever else needs the full script must be excluded here.
pub(super) fn fits_lean(checks: &[&Check], charging: Charging) -> bool {
    charged_each_alone(checks, charging)
        && checks
            .iter()
            .all(|check| matches!(check.rule, Rule::FixedWindow { .. }))
}

/// One operation on a named limiter (`lua/limiter.lua`).
pub(super) static LIMITER: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::assemble(include_str!("../../../lua/limiter.lua")));

/// One operation on the registry of named limiters (`lua/registry.lua`).
pub(super) static REGISTRY: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::assemble(include_str!("../../../lua/registry.lua")));

/// A refund of the admin API (`lua/refund.lua`).
pub(super) static REFUND: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::assemble(include_str!("../../../lua/refund.lua")));

/// The call of [`REFUND`] giving back up to `check.hits` to its counter: the fixed window's
/// count, or a bucket's arrival time one interval per hit.
pub(super) fn refund(check: &Check, pinned_now_micros: Option<u64>) -> redis::Cmd {
    let (kind, interval) = match check.rule {
        Rule::Gcra { interval, .. } => ("tat", interval),
        _ => ("count", 0),
    };
    let mut cmd = evalsha(&REFUND, (6, check.key.len() + 64));
    cmd.arg(1)
        .arg(&check.key)
        .arg(pinned_now_micros.map_or(String::new(), |t| t.to_string()))
        .arg(kind)
        .arg(check.hits)
        .arg(interval);
    cmd
}

/// Every script, for loading at start-up.
pub(super) fn all() -> Vec<&'static LuaScript> {
    let mut all = vec![
        &*DECISION,
        &*FIXED_WINDOW_LEAN,
        &*DECISION_ACROSS_SLOTS,
        &*FIXED_WINDOW_LEAN_ACROSS_SLOTS,
        &*LIMITER,
        &*REGISTRY,
        &*REFUND,
    ];
    for each in EACH.iter() {
        all.push(&each.declared);
        all.push(&each.across_slots);
    }
    all
}

/// An algorithm's lean decision script (`lua/decide_each.lua`), with its keys declared and
/// across slots ([`Keys`]).
pub(super) struct EachScript {
    /// The algorithm, as [`rule_name`] spells it and as its Lua function is named.
    algorithm: &'static str,
    /// Its arguments after the hits, the first of [`stored_args`].
    arguments: usize,
    declared: LuaScript,
    across_slots: LuaScript,
}

/// The algorithms that [`EACH`] has a script for: the name, the file, and how many of
/// [`stored_args`] the function takes (after key, now, hits and record, `lua/dispatch.lua`).
/// The one place that says how many arguments each takes in the lean scripts.
const EACH_ALGORITHMS: [(&str, &str, usize); 5] = [
    (
        "sliding_window_log",
        include_str!("../../../lua/sliding_window_log.lua"),
        2,
    ),
    (
        "sliding_window_counter",
        include_str!("../../../lua/sliding_window_counter.lua"),
        2,
    ),
    ("gcra", include_str!("../../../lua/gcra.lua"), 2),
    ("warm_up", include_str!("../../../lua/warm_up.lua"), 4),
    (
        "concurrency",
        include_str!("../../../lua/concurrency.lua"),
        3,
    ),
];

/// One lean decision script per algorithm other than the fixed window: `lua/common.lua`, the
/// algorithm's file, `lua/calls.lua`, the line naming its function and argument count,
/// `lua/decide_each.lua`.
/// A call then defines only the functions it runs (the full script defines every algorithm's
/// on every call) and carries no charging mode, flags or unused arguments.
pub(super) static EACH: LazyLock<Vec<EachScript>> = LazyLock::new(|| {
    EACH_ALGORITHMS
        .iter()
        .map(|&(algorithm, file, arguments)| {
            let binding = format!("local decide_one, ALGORITHM_ARGS = {algorithm}, {arguments}\n");
            let parts = [
                include_str!("../../../lua/common.lua"),
                file,
                CALLS,
                binding.as_str(),
                include_str!("../../../lua/decide_each.lua"),
            ];
            EachScript {
                algorithm,
                arguments,
                declared: LuaScript::join(&parts),
                across_slots: LuaScript::across_slots(&parts),
            }
        })
        .collect()
});

/// When `sha` names a lean script that takes several callers' calls merged into one
/// (`merge.rs`, `lua/calls.lua`), [`FIXED_WINDOW_LEAN`] or one of [`EACH`] with keys declared:
/// its twin taking keys across slots, which a cluster node's merged call runs.
pub(super) fn mergeable(sha: &[u8]) -> Option<&'static LuaScript> {
    if FIXED_WINDOW_LEAN.sha1.as_bytes() == sha {
        return Some(&FIXED_WINDOW_LEAN_ACROSS_SLOTS);
    }
    EACH.iter()
        .find(|each| each.declared.sha1.as_bytes() == sha)
        .map(|each| &each.across_slots)
}

/// The lean script of [`EACH`] that decides `checks` exactly as [`DECISION`] would, if one
/// does: every check is charged on its own ([`charged_each_alone`]) and every check uses the
/// same algorithm, other than the fixed window. The one place that decides it.
pub(super) fn fits_each(checks: &[&Check], charging: Charging) -> Option<&'static EachScript> {
    if !charged_each_alone(checks, charging) {
        return None;
    }
    let algorithm = rule_name(&checks.first()?.rule);
    let each = EACH.iter().find(|each| each.algorithm == algorithm)?;
    checks
        .iter()
        .all(|check| rule_name(&check.rule) == algorithm)
        .then_some(each)
}

/// Appends the KEYS count, KEYS and ARGV of one call of `each` deciding `checks` ([`fits_each`]):
/// an empty list of merged calls (`merge.rs` fills it when it merges calls), then per check its
/// hits, the algorithm's arguments, and whether refused hits are charged.
pub(super) fn encode_each(
    cmd: &mut redis::Cmd,
    checks: &[&Check],
    each: &EachScript,
    keys: Keys,
    pinned_now_micros: Option<u64>,
) {
    keys_and_clock(cmd, checks, keys, pinned_now_micros);
    cmd.arg(ONE_CALLER);
    for check in checks {
        cmd.arg(check.hits)
            .arg(&stored_args(&check.rule)[..each.arguments])
            .arg(if check.record_refused { "1" } else { "" });
    }
}

/// [`capacity`] for [`encode_each`].
fn capacity_each(checks: &[&Check], each: &EachScript, keys: Keys) -> (usize, usize) {
    const NUMBER: usize = 20;
    let key_bytes: usize = checks.iter().map(|c| c.key.len()).sum();
    // The key count, the pinned time and the merged calls, then per check its key, hits,
    // arguments and flag.
    let per_check = 2 + each.arguments;
    let arguments = 3 + checks.len() * (1 + per_check);
    with_layout(
        keys,
        (
            arguments,
            2 * NUMBER + key_bytes + checks.len() * per_check * NUMBER,
        ),
    )
}

/// Appends the KEYS count, KEYS and ARGV of one script call deciding `checks` to `cmd`.
///
/// `pinned_now_micros` replaces Redis's clock (tests only); `ttl_jitter_ms` is added to the expiry
/// of each new counter, one value per check.
pub(super) fn encode(
    cmd: &mut redis::Cmd,
    checks: &[&Check],
    keys: Keys,
    charging: Charging,
    pinned_now_micros: Option<u64>,
    mut ttl_jitter_ms: impl FnMut() -> u64,
) {
    keys_and_clock(cmd, checks, keys, pinned_now_micros);
    cmd.arg(match charging {
        Charging::Each => "",
        Charging::StopWhenOver => "stop",
        Charging::LookOnly => "look",
    });
    for check in checks {
        cmd.arg(rule_name(&check.rule)).arg(check.hits);
        // Integers travel as decimal strings; the script hands `hits` to INCRBY as is.
        match check.rule {
            Rule::FixedWindow {
                limit,
                window_secs,
                window_start,
            } => fixed_window_args(cmd, limit, window_secs, window_start, ttl_jitter_ms()),
            ref rule => {
                cmd.arg(&stored_args(rule)[..]);
            }
        }
        // Last, so the algorithms' own arguments keep their places (the named-limiter script
        // passes none: it never records refused hits). A check of a group prefixes its group
        // number and a colon (`lua/decide.lua`), so a check on its own costs what it did.
        let record = if check.record_refused { "1" } else { "" };
        match check.group {
            None => cmd.arg(record),
            Some(group) => cmd.arg(format!("{group}:{record}")),
        };
    }
}

/// What both decision scripts take first: the KEYS count, the keys, and `ARGV[1]`, the pinned
/// time in microseconds or empty for Redis's clock. [`Keys::AcrossSlots`] declares no key and
/// puts their count and the keys first in ARGV, as `lua/across_slots.lua` reads them.
fn keys_and_clock(
    cmd: &mut redis::Cmd,
    checks: &[&Check],
    keys: Keys,
    pinned_now_micros: Option<u64>,
) {
    if keys == Keys::AcrossSlots {
        cmd.arg(0);
    }
    cmd.arg(checks.len());
    for check in checks {
        cmd.arg(check.key.as_str());
    }
    match pinned_now_micros {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
}

/// Appends the KEYS count, KEYS and ARGV of one [`FIXED_WINDOW_LEAN`] call deciding `checks`,
/// which must be fixed windows ([`fits_lean`]); like [`encode`] otherwise.
pub(super) fn encode_lean(
    cmd: &mut redis::Cmd,
    checks: &[&Check],
    keys: Keys,
    pinned_now_micros: Option<u64>,
    mut ttl_jitter_ms: impl FnMut() -> u64,
) {
    keys_and_clock(cmd, checks, keys, pinned_now_micros);
    cmd.arg(ONE_CALLER);
    for check in checks {
        if let Rule::FixedWindow { window_secs, .. } = check.rule {
            cmd.arg(check.hits)
                .arg(fixed_window_ttl_ms(window_secs, ttl_jitter_ms()));
        }
    }
}

/// A fixed window's arguments after the hits, as `fixed_window` in `lua/fixed_window.lua` takes
/// them: limit, window_ms, window_end_ms, ttl_ms.
fn fixed_window_args(
    cmd: &mut redis::Cmd,
    limit: u64,
    window_secs: u64,
    window_start: u64,
    ttl_jitter_ms: u64,
) {
    cmd.arg(limit)
        .arg(window_secs * 1000)
        .arg((window_start + window_secs) * 1000)
        .arg(fixed_window_ttl_ms(window_secs, ttl_jitter_ms));
}

/// The expiry a new fixed-window counter gets: its window plus the jitter drawn for it.
pub(super) fn fixed_window_ttl_ms(window_secs: u64, ttl_jitter_ms: u64) -> u64 {
    window_secs * 1000 + ttl_jitter_ms
}

/// The outcomes of [`DECISION`]'s reply for `checks` checks: [`REPLY_PER_CHECK`] integers each,
/// admitted (1/0), remaining, reset in ms, used. A reply of another length is an error.
pub(super) fn decode(reply: &[i64], checks: usize) -> Result<Vec<Outcome>, StoreError> {
    if reply.len() != checks * REPLY_PER_CHECK {
        return Err(StoreError::Protocol(format!(
            "expected {} integers, got {}",
            checks * REPLY_PER_CHECK,
            reply.len()
        )));
    }
    Ok(reply
        .chunks_exact(REPLY_PER_CHECK)
        .map(|r| Outcome {
            admitted: r[0] == 1,
            remaining: non_negative(r[1]),
            reset_ms: non_negative(r[2]).max(1),
            used: non_negative(r[3]),
        })
        .collect())
}

/// The outcomes of [`FIXED_WINDOW_LEAN`]'s reply for `checks` (fixed windows, [`fits_lean`]):
/// each check's count judged with the memory store's arithmetic ([`fixed_window_outcome`]) at
/// the time the script read, so the answers are [`DECISION`]'s. A reply of another length, or a
/// check that is not a fixed window, is an error.
pub(super) fn decode_lean(reply: &[i64], checks: &[&Check]) -> Result<Vec<Outcome>, StoreError> {
    let expected = LEAN_LEADING_REPLY + checks.len() * LEAN_REPLY_PER_CHECK;
    let (leading, counts) = match reply.split_at_checked(LEAN_LEADING_REPLY) {
        Some(split) if reply.len() == expected => split,
        _ => {
            return Err(StoreError::Protocol(format!(
                "expected {expected} integers, got {}",
                reply.len()
            )));
        }
    };
    // The time the script read, in microseconds, as the memory store's clock gives it.
    let now_ms = non_negative(leading[0]) / 1000;
    checks
        .iter()
        .zip(counts.chunks_exact(LEAN_REPLY_PER_CHECK))
        .map(|(check, count)| match check.rule {
            Rule::FixedWindow {
                limit,
                window_secs,
                window_start,
            } => Ok(fixed_window_outcome(
                non_negative(count[0]),
                limit,
                window_secs,
                window_start,
                now_ms,
            )),
            ref rule => Err(StoreError::Protocol(format!(
                "a count for a {} check",
                rule_name(rule)
            ))),
        })
        .collect()
}

/// A reply's integer as a `u64`; a negative one (never written by Sluice) as 0.
fn non_negative(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// [`capacity`] for [`encode_lean`].
pub(super) fn capacity_lean(checks: &[&Check], keys: Keys) -> (usize, usize) {
    const NUMBER: usize = 20;
    let key_bytes: usize = checks.iter().map(|c| c.key.len()).sum();
    // The key count, the pinned time and the merged calls, then per check its key and its
    // arguments.
    let arguments = 3 + checks.len() * (1 + LEAN_ARGS_PER_CHECK);
    with_layout(
        keys,
        (
            arguments,
            2 * NUMBER + key_bytes + checks.len() * LEAN_ARGS_PER_CHECK * NUMBER,
        ),
    )
}

/// A capacity with the one more argument (the declared key count, 0) that
/// [`Keys::AcrossSlots`] takes.
fn with_layout(keys: Keys, (arguments, bytes): (usize, usize)) -> (usize, usize) {
    match keys {
        Keys::Declared => (arguments, bytes),
        Keys::AcrossSlots => (arguments + 1, bytes + 1),
    }
}

/// Arguments and bytes that [`encode`] appends for `checks`: an upper bound, since a `u64` has
/// at most 20 digits and the longest algorithm name is 22 bytes.
pub(super) fn capacity(checks: &[&Check], keys: Keys) -> (usize, usize) {
    const NUMBER: usize = 20;
    const ALGORITHM_NAME: usize = 22;
    let key_bytes: usize = checks.iter().map(|c| c.key.len()).sum();
    // The key count and the leading arguments (a number and a short word), then per check its
    // key and its arguments.
    let arguments = 1 + LEADING_ARGS + checks.len() * (1 + ARGS_PER_CHECK);
    let per_check = ALGORITHM_NAME + (ARGS_PER_CHECK - 1) * NUMBER;
    with_layout(
        keys,
        (arguments, 3 * NUMBER + key_bytes + checks.len() * per_check),
    )
}

pub(super) fn rule_name(rule: &Rule) -> &'static str {
    match rule {
        Rule::FixedWindow { .. } => "fixed_window",
        Rule::SlidingWindowLog { .. } => "sliding_window_log",
        Rule::SlidingWindowCounter { .. } => "sliding_window_counter",
        Rule::Gcra { .. } => "gcra",
        Rule::WarmUp { .. } => "warm_up",
        Rule::Concurrency { .. } => "concurrency",
    }
}

/// A rule's four parameters as a named limiter's config hash keeps them (`a`..`d`), which is
/// also how the decision script receives them, except for the fixed window: stored as limit and
/// window seconds, its window is picked by the script.
pub(super) fn stored_args(rule: &Rule) -> [String; 4] {
    match *rule {
        Rule::FixedWindow {
            limit, window_secs, ..
        } => [
            limit.to_string(),
            window_secs.to_string(),
            String::new(),
            String::new(),
        ],
        Rule::SlidingWindowLog { limit, window } | Rule::SlidingWindowCounter { limit, window } => {
            [
                limit.to_string(),
                window.to_string(),
                String::new(),
                String::new(),
            ]
        }
        Rule::Gcra { interval, burst } => [
            interval.to_string(),
            burst.to_string(),
            String::new(),
            String::new(),
        ],
        Rule::WarmUp {
            permits_per_window,
            window,
            warmup,
            cold_factor,
        } => [
            permits_per_window.to_string(),
            window.to_string(),
            warmup.to_string(),
            // `{}` prints the shortest text that reads back as the same f64, in Lua too.
            cold_factor.to_string(),
        ],
        Rule::Concurrency {
            limit,
            lease,
            release,
        } => [
            limit.to_string(),
            lease.to_string(),
            if release { "1" } else { "" }.to_string(),
            String::new(),
        ],
    }
}

/// The inverse of [`rule_name`] and [`stored_args`].
pub(super) fn parse_rule(name: &str, args: &[String; 4]) -> Result<Rule, StoreError> {
    let bad = || StoreError::Protocol(format!("stored limiter rule {name} {args:?}"));
    let int = |i: usize| args[i].parse::<u64>().map_err(|_| bad());
    Ok(match name {
        "fixed_window" => Rule::FixedWindow {
            limit: int(0)?,
            window_secs: int(1)?,
            window_start: 0,
        },
        "sliding_window_log" => Rule::SlidingWindowLog {
            limit: int(0)?,
            window: int(1)?,
        },
        "sliding_window_counter" => Rule::SlidingWindowCounter {
            limit: int(0)?,
            window: int(1)?,
        },
        "gcra" => Rule::Gcra {
            interval: int(0)?,
            burst: int(1)?,
        },
        "warm_up" => Rule::WarmUp {
            permits_per_window: int(0)?,
            window: int(1)?,
            warmup: int(2)?,
            cold_factor: args[3].parse().map_err(|_| bad())?,
        },
        "concurrency" => Rule::Concurrency {
            limit: int(0)?,
            lease: int(1)?,
            release: args[2] == "1",
        },
        _ => return Err(bad()),
    })
}

/// The stored fields of a limiter (`rule`, `a`..`d`, `cap`, `pc`, `desc`), as HMGET returns
/// them.
pub(super) type RecordFields = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<Vec<u8>>,
);

/// The limiter these fields describe; `None` when there is none.
pub(super) fn parse_record(fields: RecordFields) -> Result<Option<LimiterRecord>, StoreError> {
    let (Some(rule), Some(a), Some(b), c, d, Some(cap), per_client, desc) = fields else {
        return Ok(None);
    };
    let args = [a, b, c.unwrap_or_default(), d.unwrap_or_default()];
    Ok(Some(LimiterRecord {
        rule: parse_rule(&rule, &args)?,
        capacity: cap
            .parse()
            .map_err(|_| StoreError::Protocol(format!("stored capacity {cap:?}")))?,
        per_client: per_client.as_deref() == Some("1"),
        description: desc.unwrap_or_default(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed-window check of 3 hits on a limit of 10 per minute, in the window from 60 s.
    fn fixed_window_check(record_refused: bool) -> Check {
        Check {
            key: "d_k_v_60".into(),
            hits: 3,
            rule: Rule::FixedWindow {
                limit: 10,
                window_secs: 60,
                window_start: 60,
            },
            record_refused,
            group: None,
        }
    }

    /// A command's arguments as text, to compare with what a script reads.
    fn text_args(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => panic!("only simple arguments"),
            })
            .collect()
    }

    /// The numbers Rust and Lua must agree on are written once on each side, and equal.
    #[test]
    fn the_lua_constants_are_the_ones_rust_mirrors() {
        let decide = include_str!("../../../lua/decide.lua");
        let lean = include_str!("../../../lua/fixed_window_lean.lua");
        let fixed_window = include_str!("../../../lua/fixed_window.lua");
        for (source, line) in [
            (
                lean,
                format!("local ARGS_PER_CHECK = {LEAN_ARGS_PER_CHECK}\n"),
            ),
            (
                lean,
                format!("local LEADING_REPLY = {LEAN_LEADING_REPLY}\n"),
            ),
            (
                lean,
                format!("local REPLY_PER_CHECK = {LEAN_REPLY_PER_CHECK}\n"),
            ),
            (decide, format!("local LEADING_ARGS = {LEADING_ARGS}\n")),
            (decide, format!("local ARGS_PER_CHECK = {ARGS_PER_CHECK}\n")),
            (
                decide,
                format!("local REPLY_PER_CHECK = {REPLY_PER_CHECK}\n"),
            ),
            (
                fixed_window,
                format!("local TTL_REPAIR_PERIOD = {TTL_REPAIR_PERIOD}\n"),
            ),
            (
                include_str!("../../../lua/decide_each.lua"),
                format!("local REPLY_PER_CHECK = {REPLY_PER_CHECK}\n"),
            ),
            (ACROSS_SLOTS, format!("redis.status_reply('{ELSEWHERE} '")),
        ] {
            assert!(source.contains(&line), "the Lua source lacks {line:?}");
        }
    }

    /// A check of `rule` on its own key, charged on its own.
    fn check_of(rule: Rule) -> Check {
        Check {
            key: format!("k_{}", rule_name(&rule)),
            hits: 2,
            rule,
            record_refused: false,
            group: None,
        }
    }

    #[test]
    fn an_algorithms_lean_script_takes_its_checks_charged_each() {
        let gcra = check_of(Rule::Gcra {
            interval: 7,
            burst: 9,
        });
        let recorded = Check {
            record_refused: true,
            ..gcra.clone()
        };
        let grouped = Check {
            group: Some(0),
            ..gcra.clone()
        };
        let warm_up = check_of(Rule::WarmUp {
            permits_per_window: 4,
            window: 8,
            warmup: 9,
            cold_factor: 2.5,
        });
        let fixed = fixed_window_check(false);
        let name = |each: Option<&EachScript>| each.map(|e| e.algorithm);
        assert_eq!(
            name(fits_each(&[&gcra, &recorded], Charging::Each)),
            Some("gcra")
        );
        assert_eq!(
            name(fits_each(&[&warm_up], Charging::Each)),
            Some("warm_up")
        );
        assert_eq!(
            name(fits_each(&[&gcra, &warm_up], Charging::Each)),
            None,
            "two algorithms"
        );
        assert_eq!(
            name(fits_each(&[&gcra, &grouped], Charging::Each)),
            None,
            "a group"
        );
        assert_eq!(
            name(fits_each(&[&gcra], Charging::StopWhenOver)),
            Some("gcra"),
            "one check on its own is charged as under Each"
        );
        assert_eq!(
            name(fits_each(&[&gcra, &gcra], Charging::StopWhenOver)),
            None
        );
        assert_eq!(name(fits_each(&[&gcra], Charging::LookOnly)), None);
        assert_eq!(
            name(fits_each(&[&fixed], Charging::Each)),
            None,
            "the fixed window's own"
        );
        assert_eq!(name(fits_each(&[], Charging::Each)), None);

        // Per check: hits, the algorithm's arguments and no unused one, the record flag.
        let each = fits_each(&[&gcra, &recorded], Charging::Each).unwrap();
        let mut cmd = redis::Cmd::new();
        encode_each(&mut cmd, &[&gcra, &recorded], each, Keys::Declared, Some(5));
        let args = text_args(&cmd);
        assert_eq!(
            args,
            [
                "2", "k_gcra", "k_gcra", "5", "", "2", "7", "9", "", "2", "7", "9", "1"
            ]
        );
        let (arguments, bytes) = capacity_each(&[&gcra, &recorded], each, Keys::Declared);
        assert_eq!(arguments, args.len());
        assert!(bytes >= args.iter().map(String::len).sum());
        let each = fits_each(&[&warm_up], Charging::Each).unwrap();
        let mut cmd = redis::Cmd::new();
        encode_each(&mut cmd, &[&warm_up], each, Keys::AcrossSlots, None);
        assert_eq!(
            text_args(&cmd),
            ["0", "1", "k_warm_up", "", "", "2", "4", "8", "9", "2.5", ""]
        );
        // The script binds the algorithm's function and defines no other algorithm's.
        for each in EACH.iter() {
            assert!(each.declared.source.contains(&format!(
                "local decide_one, ALGORITHM_ARGS = {}, {}\n",
                each.algorithm, each.arguments
            )));
            for (other, _, _) in EACH_ALGORITHMS {
                let defines = each
                    .declared
                    .source
                    .contains(&format!("local function {other}("));
                assert_eq!(
                    defines,
                    other == each.algorithm,
                    "{} defines {other}",
                    each.algorithm
                );
            }
        }
    }

    #[test]
    fn stored_rules_read_back() {
        let rules = [
            Rule::FixedWindow {
                limit: 3,
                window_secs: 60,
                window_start: 0,
            },
            Rule::SlidingWindowLog {
                limit: 3,
                window: 5,
            },
            Rule::SlidingWindowCounter {
                limit: 3,
                window: 5,
            },
            Rule::Gcra {
                interval: 7,
                burst: 9,
            },
            Rule::WarmUp {
                permits_per_window: 4,
                window: 8,
                warmup: 9,
                cold_factor: 2.75,
            },
        ];
        for rule in rules {
            assert_eq!(
                parse_rule(rule_name(&rule), &stored_args(&rule)).unwrap(),
                rule
            );
        }
    }

    #[test]
    fn entry_point_stride_matches() {
        assert!(
            DECISION
                .source
                .contains(&format!("local ARGS_PER_CHECK = {ARGS_PER_CHECK}"))
        );
        assert_eq!(DECISION.sha1.len(), 40);
    }

    #[test]
    fn encodes_one_check_per_stride() {
        let check = fixed_window_check(false);
        let mut cmd = redis::cmd("EVALSHA");
        encode(
            &mut cmd,
            &[&check, &check],
            Keys::Declared,
            Charging::StopWhenOver,
            None,
            || 7,
        );
        let args = text_args(&cmd);
        assert_eq!(args.len(), 1 + 1 + 2 + LEADING_ARGS + 2 * ARGS_PER_CHECK);
        assert_eq!(&args[1..6], ["2", "d_k_v_60", "d_k_v_60", "", "stop"]);
        assert_eq!(
            &args[6..13],
            ["fixed_window", "3", "10", "60000", "120000", "60007", ""]
        );
    }

    #[test]
    fn the_lean_script_takes_fixed_windows_charged_each() {
        let fixed = fixed_window_check(true);
        let gcra = Check {
            key: "d_k_w".into(),
            hits: 1,
            rule: Rule::Gcra {
                interval: 7,
                burst: 9,
            },
            record_refused: false,
            group: None,
        };
        let grouped = Check {
            group: Some(0),
            ..fixed.clone()
        };
        assert!(fits_lean(&[&fixed, &fixed], Charging::Each));
        assert!(
            fits_lean(&[&fixed], Charging::StopWhenOver),
            "one check on its own is charged as under Each"
        );
        assert!(!fits_lean(&[&fixed, &fixed], Charging::StopWhenOver));
        assert!(!fits_lean(&[&fixed], Charging::LookOnly));
        assert!(!fits_lean(&[&fixed, &gcra], Charging::Each));
        assert!(
            !fits_lean(&[&fixed, &grouped], Charging::Each),
            "a group of limits needs the full script's trial"
        );

        let mut cmd = redis::Cmd::new();
        encode_lean(&mut cmd, &[&fixed, &fixed], Keys::Declared, Some(5), || 7);
        let args = text_args(&cmd);
        assert_eq!(args.len(), 1 + 2 + 2 + 2 * LEAN_ARGS_PER_CHECK);
        assert_eq!(&args[..5], ["2", "d_k_v_60", "d_k_v_60", "5", ""]);
        // Only what the count needs: the hits and the new counter's expiry.
        assert_eq!(&args[5..], ["3", "60007", "3", "60007"]);
        let (arguments, bytes) = capacity_lean(&[&fixed, &fixed], Keys::Declared);
        assert_eq!(arguments, args.len());
        assert!(bytes >= args.iter().map(String::len).sum());

        // Across slots: no declared key, then the key count and the keys, then the same ARGV.
        let mut cmd = redis::Cmd::new();
        encode_lean(
            &mut cmd,
            &[&fixed, &fixed],
            Keys::AcrossSlots,
            Some(5),
            || 7,
        );
        let across = text_args(&cmd);
        assert_eq!(&across[..5], ["0", "2", "d_k_v_60", "d_k_v_60", "5"]);
        assert_eq!(across[1..], args[..]);
        assert_eq!(
            capacity_lean(&[&fixed, &fixed], Keys::AcrossSlots).0,
            across.len()
        );
    }

    /// The lean script's reply, the time it read and each count, is judged as the memory store
    /// judges a count; a reply of any other shape is an error, never a panic.
    #[test]
    fn lean_replies_are_judged_like_the_memory_store_and_checked() {
        let check = fixed_window_check(false);
        let (limit, window_secs, window_start) = (10, 60, 60);
        let checks = [&check, &check];
        // 100.5 s: 19.5 s before the window ends.
        let outcomes = decode_lean(&[100_500_000, 4, 12], &checks).unwrap();
        assert_eq!(
            outcomes,
            [
                fixed_window_outcome(4, limit, window_secs, window_start, 100_500),
                fixed_window_outcome(12, limit, window_secs, window_start, 100_500),
            ]
        );
        assert_eq!(
            (
                outcomes[0].admitted,
                outcomes[0].remaining,
                outcomes[0].reset_ms
            ),
            (true, 6, 19_500)
        );
        assert_eq!((outcomes[1].admitted, outcomes[1].remaining), (false, 0));
        // The window over (reset at least 1 ms) or not begun (at most the window).
        assert_eq!(
            decode_lean(&[130_000_000, 1], &[&check]).unwrap()[0].reset_ms,
            1
        );
        assert_eq!(
            decode_lean(&[1_000_000, 1], &[&check]).unwrap()[0].reset_ms,
            60_000
        );
        // What Sluice never writes reads as zero.
        assert_eq!(decode_lean(&[-5, -1], &[&check]).unwrap()[0].used, 0);

        for bad in [&[][..], &[100_500_000], &[100_500_000, 4], &[1, 2, 3, 4]] {
            assert!(
                matches!(decode_lean(bad, &checks), Err(StoreError::Protocol(_))),
                "{bad:?}"
            );
        }
        let gcra = Check {
            rule: Rule::Gcra {
                interval: 7,
                burst: 9,
            },
            ..check.clone()
        };
        assert!(decode_lean(&[100_500_000, 1], &[&gcra]).is_err());
        // The full script's layout, and which one a call reads.
        assert!(decode(&[1, 2, 3], 1).is_err());
        assert!(Reply::Counted.decode(&[1, 2, 3, 4], &[&check]).is_err());
        assert!(Reply::Decided.decode(&[1, 2, 3, 4], &[&check]).is_ok());
    }

    #[test]
    fn capacity_covers_what_encode_appends() {
        let checks = [
            Check {
                key: "d_k_v_60".into(),
                hits: u64::MAX,
                rule: Rule::FixedWindow {
                    limit: u64::MAX,
                    window_secs: 60,
                    window_start: 60,
                },
                record_refused: false,
                group: None,
            },
            Check {
                key: "d_k_w".into(),
                hits: u64::MAX,
                rule: Rule::SlidingWindowCounter {
                    limit: u64::MAX,
                    window: u64::MAX,
                },
                record_refused: false,
                group: None,
            },
        ];
        let checks: Vec<&Check> = checks.iter().collect();
        for keys in [Keys::Declared, Keys::AcrossSlots] {
            let mut cmd = redis::Cmd::new();
            encode(
                &mut cmd,
                &checks,
                keys,
                Charging::StopWhenOver,
                Some(u64::MAX),
                || 7,
            );
            let args: Vec<usize> = text_args(&cmd).iter().map(String::len).collect();
            let (arguments, bytes) = capacity(&checks, keys);
            assert_eq!(arguments, args.len());
            assert!(bytes >= args.iter().sum(), "{bytes} < {args:?}");
        }
    }
}
