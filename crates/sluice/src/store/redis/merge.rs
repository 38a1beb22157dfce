//! Merging: concurrent callers' calls of one lean script (an algorithm's, `lua/decide_each.lua`,
//! or the fixed window's, `lua/fixed_window_lean.lua`) leave as one `EVALSHA` instead of one each.
//!
//! Why: on Redis, any `EVALSHA` costs a floor of 3–4 µs of CPU before it decides anything (the
//! call, the script's top level, reading `TIME`), several times what deciding one check costs
//! inside it; merged, the other algorithms cost Redis 0.53–0.66× what they did at 64 callers
//! (docs/BENCHMARKS.md, issue #30 part 3). The coalescer (`coalesce.rs`) already sends a batch of
//! concurrent calls in one write; here, the calls of a batch that run the same lean script with
//! the same clock argument become one call whose `ARGV[2]` lists how many checks each had.
//!
//! Each caller still gets what its own call would have: the script decides the calls one after
//! another, each within `pcall`, and replies one entry per call, its reply or the error that ended
//! it (later checks of that call not run, as alone); the other calls are untouched by it. Redis
//! runs the merged call atomically, as it ran the batch's calls one after another; the order of
//! calls within a batch was never promised, as they were concurrent.
//!
//! On a cluster node the merged call is the script's twin that takes its keys across slots
//! (`lua/across_slots.lua`: a call's declared keys must share a slot, and merged calls' keys do
//! not): it checks that the node serves every key before anything is written, and a refusal
//! (`ELSEWHERE`: a slot moved or is migrating) wrote nothing, so the coalescer sends the calls
//! again as they were, one each, which the cluster then redirects as usual. A call alone in its
//! batch goes as it is.

use redis::{Arg, Cmd, Value};

use super::script::{self, ELSEWHERE, Keys, LuaScript};

/// The arguments of a lean-script call that merging reads, borrowed from its [`Cmd`]: `EVALSHA
/// sha n key1..keyn now merged per-check-arguments..`.
struct Parts<'a> {
    sha: &'a [u8],
    /// The script's twin taking keys across slots.
    across_slots: &'static LuaScript,
    keys: Vec<&'a [u8]>,
    now: &'a [u8],
    rest: Vec<&'a [u8]>,
}

/// Reads `cmd` as a call that may merge: an `EVALSHA` of one of the lean scripts that take merged
/// calls ([`script::mergeable`]), not itself merged.
fn parts(cmd: &Cmd) -> Option<Parts<'_>> {
    let mut args = cmd.args_iter().map(|arg| match arg {
        Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let mut next = || args.next().flatten();
    if !next()?.eq_ignore_ascii_case(b"EVALSHA") {
        return None;
    }
    let sha = next()?;
    let across_slots = script::mergeable(sha)?;
    let count: usize = std::str::from_utf8(next()?).ok()?.parse().ok()?;
    let keys = (0..count).map(|_| next()).collect::<Option<Vec<_>>>()?;
    let now = next()?;
    if next()? != script::ONE_CALLER.as_bytes() {
        return None;
    }
    let rest = std::iter::from_fn(&mut next).collect();
    Some(Parts {
        sha,
        across_slots,
        keys,
        now,
        rest,
    })
}

/// What a call shares with the calls it may merge with: its script's SHA1 and the clock
/// argument.
type Shared<'a> = (&'a [u8], &'a [u8]);

/// Which of a batch's calls (each its commands) go as one merged command: groups of indexes into
/// `calls`, in the order of each group's first call. A group of one goes as it is. `None` when
/// no two calls merge, the common case (plain commands are not calls that merge), which then
/// costs no allocation per call.
pub(super) fn plan(calls: &[&[Cmd]]) -> Option<Vec<Vec<usize>>> {
    // What each call shares with the calls it may merge with.
    let shared: Vec<Option<Shared<'_>>> = calls
        .iter()
        .map(|cmds| match cmds {
            [cmd] => parts(cmd).map(|p| (p.sha, p.now)),
            _ => None,
        })
        .collect();
    let mergeable = shared.iter().flatten().count();
    if mergeable < 2 {
        return None;
    }
    let mut groups: Vec<Vec<usize>> = Vec::with_capacity(calls.len());
    // The groups that may take more calls: what their calls share (script, clock) and the
    // group's index.
    let mut open: Vec<(Shared<'_>, usize)> = Vec::new();
    for (index, shared) in shared.into_iter().enumerate() {
        match shared.and_then(|s| open.iter().find(|(o, _)| *o == s).map(|(_, g)| *g)) {
            Some(group) => groups[group].push(index),
            None => {
                if let Some(shared) = shared {
                    open.push((shared, groups.len()));
                }
                groups.push(vec![index]);
            }
        }
    }
    (groups.len() < calls.len()).then_some(groups)
}

/// One call deciding what `cmds` (each a call [`plan`] grouped) decide, in their order, with its
/// keys laid out as `keys` says: declared on one server, across slots on a cluster node.
pub(super) fn merge(cmds: &[&Cmd], keys: Keys) -> Cmd {
    let parts: Vec<Parts<'_>> = cmds
        .iter()
        .map(|cmd| parts(cmd).expect("plan merges only calls that parts reads"))
        .collect();
    let key_count: usize = parts.iter().map(|p| p.keys.len()).sum();
    let rest: usize = parts.iter().map(|p| p.rest.len()).sum();
    let bytes: usize = parts
        .iter()
        .flat_map(|p| p.keys.iter().chain(&p.rest))
        .map(|arg| arg.len())
        .sum();
    let mut merged = Cmd::with_capacity(6 + key_count + rest, bytes + 64 + 4 * parts.len());
    match keys {
        Keys::Declared => merged.arg("EVALSHA").arg(parts[0].sha).arg(key_count),
        Keys::AcrossSlots => merged
            .arg("EVALSHA")
            .arg(parts[0].across_slots.sha1.as_str())
            .arg(0)
            .arg(key_count),
    };
    for part in &parts {
        for key in &part.keys {
            merged.arg(*key);
        }
    }
    let counts: Vec<String> = parts.iter().map(|p| p.keys.len().to_string()).collect();
    merged.arg(parts[0].now).arg(counts.join(","));
    for part in &parts {
        for arg in &part.rest {
            merged.arg(*arg);
        }
    }
    merged
}

/// The reply of each of `calls` merged calls, from the merged call's `reply`: its entries, one
/// per call; anything else (an error that ended the whole call, such as `BUSY`) is every call's
/// reply, which an error is and anything else fails to decode as. `None` when a cluster node
/// refused the call across slots before writing anything (`ELSEWHERE`): the calls did not run.
pub(super) fn split(reply: Value, calls: usize) -> Option<Vec<Value>> {
    match reply {
        Value::Array(entries) if entries.len() == calls => Some(entries),
        Value::SimpleString(refusal) if refusal.starts_with(ELSEWHERE) => None,
        other => Some(vec![other; calls]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::script::{Keys, decision_call};
    use crate::store::{Charging, Check, Rule};

    fn gcra(key: &str, hits: u64) -> Check {
        Check {
            key: key.into(),
            hits,
            rule: Rule::Gcra {
                interval: 7,
                burst: 9,
            },
            record_refused: false,
            group: None,
        }
    }

    /// The call the store makes for `checks` (each a lean script's).
    fn call(checks: &[&Check], keys: Keys, now: Option<u64>) -> Cmd {
        decision_call(checks, Charging::Each, true, keys, now, || 0).0
    }

    fn text(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => panic!("only simple arguments"),
            })
            .collect()
    }

    #[test]
    fn calls_of_one_lean_script_and_clock_merge_in_order() {
        let (a, b, c) = (gcra("a", 1), gcra("b", 2), gcra("c", 3));
        let first = call(&[&a, &b], Keys::Declared, None);
        let second = call(&[&c], Keys::Declared, None);
        let merged = merge(&[&first, &second], Keys::Declared);
        let sha = text(&first)[1].clone();
        let sha = sha.as_str();
        assert_eq!(
            text(&merged),
            [
                "EVALSHA", sha, "3", "a", "b", "c", "", "2,1", "1", "7", "9", "", "2", "7", "9",
                "", "3", "7", "9", ""
            ]
        );
        // A merged call is not merged again.
        assert!(parts(&merged).is_none());
        // On a cluster node: the twin across slots, the keys counted and listed in ARGV.
        let across = merge(&[&first, &second], Keys::AcrossSlots);
        let twin = call(&[&a, &b], Keys::AcrossSlots, None);
        let twin_sha = text(&twin)[1].clone();
        assert_ne!(twin_sha, sha);
        assert_eq!(
            text(&across),
            [
                "EVALSHA", &twin_sha, "0", "3", "a", "b", "c", "", "2,1", "1", "7", "9", "", "2",
                "7", "9", "", "3", "7", "9", ""
            ]
        );
    }

    #[test]
    fn only_single_lean_calls_with_the_same_script_and_clock_share_a_group() {
        let (a, b) = (gcra("a", 1), gcra("b", 1));
        let log = Check {
            rule: Rule::SlidingWindowLog {
                limit: 3,
                window: 1_000_000,
            },
            ..gcra("l", 1)
        };
        let calls: Vec<Vec<Cmd>> = vec![
            vec![call(&[&a], Keys::Declared, None)],
            vec![call(&[&log], Keys::Declared, None)],
            vec![redis::cmd("INCRBY").arg("x").arg(1).clone()],
            vec![call(&[&b], Keys::Declared, None)],
            // Pinned to another time: decided on its own clock.
            vec![call(&[&b], Keys::Declared, Some(5))],
            // Keys across slots (a cluster master): never merged.
            vec![call(&[&b], Keys::AcrossSlots, None)],
            vec![call(&[&log], Keys::Declared, None)],
            // Two commands (a plain decision): as it is.
            vec![
                call(&[&a], Keys::Declared, None),
                call(&[&b], Keys::Declared, None),
            ],
        ];
        let calls: Vec<&[Cmd]> = calls.iter().map(Vec::as_slice).collect();
        assert_eq!(
            plan(&calls).unwrap(),
            [vec![0, 3], vec![1, 6], vec![2], vec![4], vec![5], vec![7]]
        );
        // Nothing to merge: no plan.
        assert_eq!(plan(&calls[..3]), None);
        assert_eq!(plan(&calls[4..6]), None);
    }

    #[test]
    fn a_merged_reply_goes_back_entry_by_entry_and_an_error_to_every_call() {
        let entries = vec![
            Value::Array(vec![Value::Int(1)]),
            redis::parse_redis_value(b"-WRONGTYPE no\r\n").unwrap(),
        ];
        assert_eq!(split(Value::Array(entries.clone()), 2), Some(entries));
        let busy = redis::parse_redis_value(b"-BUSY script\r\n").unwrap();
        assert_eq!(
            split(busy.clone(), 3),
            Some(vec![busy.clone(), busy.clone(), busy])
        );
        // A reply of another shape is each call's, whose decoding refuses it.
        let odd = Value::Array(vec![Value::Int(1)]);
        assert_eq!(split(odd.clone(), 2), Some(vec![odd.clone(), odd]));
        // A cluster node that does not serve one of the keys ran nothing.
        let elsewhere = Value::SimpleString("ELSEWHERE MOVED 12 127.0.0.1:7001".into());
        assert_eq!(split(elsewhere, 2), None);
    }
}
