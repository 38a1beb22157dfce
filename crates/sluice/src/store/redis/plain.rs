//! The common decision in plain commands, without Lua: every check a fixed window charged on its
//! own (`script::fits_lean`) is, per check, `INCRBY key hits` then `PEXPIRE key ttl_ms NX`, all
//! of a decision's commands in one call of the coalescer (so in one pipelined write).
//!
//! Why not a script: any `EVALSHA` costs Redis about 5 µs of CPU before it does anything (the
//! call, the script's top level, `TIME`), where `INCRBY` costs about 0.1 µs and a `PEXPIRE` that
//! changes nothing about 0.3 µs (docs/BENCHMARKS.md, issue #30). This is upstream's work for a
//! fixed window (`INCRBY` + `EXPIRE`), and the same writes as the lean script:
//! - `INCRBY` alone is atomic and exact, so a limit of N admits at most N whatever runs between
//!   a decision's commands.
//! - `PEXPIRE .. NX` (Redis 7.0 and later) gives a TTL only to a key that has none: the new
//!   counter right after its first `INCRBY`, or one another writer left without a TTL (upstream
//!   sends `INCRBY` and `EXPIRE` as two commands), repaired on the next decision where the lean
//!   script waits for the count to pass a multiple of `TTL_REPAIR_PERIOD`. A `PEXPIRE NX` that
//!   changes nothing is neither replicated nor written to the AOF (checked on Redis 7.0), so a hot
//!   key costs its replicas no more than with the script.
//! - A check of zero hits only looks: `GET`, no write.
//!
//! The counts are judged in Rust as the lean script's are (`fixed_window_outcome`), against the
//! service's clock, which already chose the window the key names: the reset is measured on the
//! same clock as the window it ends, as upstream does (a test pins it; see `mod.rs`).
//!
//! Unlike a script, the commands of one decision are not one atomic step: a check whose key
//! holds another type fails the decision (`WRONGTYPE`, as with the scripts) but the other checks'
//! `INCRBY`s still ran, where the lean script stops at the failing one; either way the call is an
//! error and its hits may have been counted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::{Cmd, Value};

use super::conn::{Connection, fail, redis_error};
use super::script::fixed_window_ttl_ms;
use crate::store::algorithms::fixed_window_outcome;
use crate::store::{Check, Outcome, Rule, StoreError};

/// The commands deciding `checks`, which must fit the lean path (`script::fits_lean`: every check
/// a fixed window): per check `INCRBY` and `PEXPIRE .. NX` with the window plus a drawn jitter as
/// TTL, or `GET` for zero hits.
pub(super) fn commands(checks: &[&Check], mut ttl_jitter_ms: impl FnMut() -> u64) -> Vec<Cmd> {
    let mut cmds = Vec::with_capacity(checks.len() * 2);
    for check in checks {
        let key = check.key.as_str();
        if check.hits == 0 {
            cmds.push(redis::cmd("GET").arg(key).clone());
            continue;
        }
        let window_secs = match check.rule {
            Rule::FixedWindow { window_secs, .. } => window_secs,
            // Excluded by fits_lean; a TTL of the shortest window keeps the key from leaking.
            _ => 1,
        };
        let mut incr = Cmd::with_capacity(3, key.len() + 26);
        incr.arg("INCRBY").arg(key).arg(check.hits);
        let mut expire = Cmd::with_capacity(4, key.len() + 30);
        expire
            .arg("PEXPIRE")
            .arg(key)
            .arg(fixed_window_ttl_ms(window_secs, ttl_jitter_ms()))
            .arg("NX");
        cmds.push(incr);
        cmds.push(expire);
    }
    cmds
}

/// What the replies to [`commands`] say.
#[derive(Debug)]
pub(super) struct Counted {
    /// Each check's outcome, or the first error reply of a count (`INCRBY`, `GET`) as the
    /// scripts' errors are mapped (`conn::redis_error`).
    pub outcomes: Result<Vec<Outcome>, StoreError>,
    /// A `PEXPIRE .. NX` that failed; the counts stand either way.
    pub expiry_failed: Option<ExpiryFailed>,
}

/// Why a `PEXPIRE .. NX` failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ExpiryFailed {
    /// Refused as a command it does not know in that form (`ERR`: a server older than 7.0, which
    /// has no `NX`, says "wrong number of arguments"): the store should go back to the lean
    /// script, which gives such keys their TTL ([`ExpireNx::refused`]).
    Refused(String),
    /// Any other error (`LOADING`, `READONLY` during a failover, a cluster's own errors that were
    /// not redirections): nothing says the server lacks `NX`, and the key's next decision sends
    /// `PEXPIRE .. NX` again, which gives it its TTL. Only a key never decided again is left
    /// without one, as with upstream's `INCRBY` + `EXPIRE`.
    Other(String),
}

/// Reads the replies to [`commands`] for `checks`: each count judged at `now_ms` on the service's
/// clock. Replies of another shape are a [`StoreError::Protocol`], never a panic.
pub(super) fn read(replies: &[Value], checks: &[&Check], now_ms: u64) -> Counted {
    let mut expiry_failed = None;
    let mut replies = replies.iter();
    let mut outcomes = Vec::with_capacity(checks.len());
    for check in checks {
        let count = replies.next().map(count_of);
        if check.hits > 0 {
            match replies.next() {
                Some(Value::Int(_)) => {}
                Some(Value::ServerError(e)) => {
                    let text = format!("{e:?}");
                    expiry_failed = Some(match e.code() {
                        "ERR" => ExpiryFailed::Refused(text),
                        _ => ExpiryFailed::Other(text),
                    });
                }
                other => {
                    return Counted {
                        outcomes: Err(unexpected("PEXPIRE", other)),
                        expiry_failed,
                    };
                }
            }
        }
        let count = match count {
            Some(Ok(count)) => count,
            Some(Err(e)) => {
                return Counted {
                    outcomes: Err(e),
                    expiry_failed,
                };
            }
            None => {
                return Counted {
                    outcomes: Err(unexpected("a count", None)),
                    expiry_failed,
                };
            }
        };
        outcomes.push(judge(check, count, now_ms));
    }
    let outcomes = match replies.next() {
        None => outcomes.into_iter().collect(),
        extra => Err(unexpected("nothing more", extra)),
    };
    Counted {
        outcomes,
        expiry_failed,
    }
}

/// The count an `INCRBY` or `GET` replied, read as the lean script reads it: a missing key is 0,
/// and so is what Sluice never writes (a negative number, a value that is not a number).
fn count_of(reply: &Value) -> Result<u64, StoreError> {
    match reply {
        Value::Int(n) => Ok(u64::try_from(*n).unwrap_or(0)),
        Value::Nil => Ok(0),
        Value::BulkString(bytes) => {
            let text = std::str::from_utf8(bytes).unwrap_or("");
            let number = text
                .parse::<i64>()
                .or_else(|_| text.parse::<f64>().map(|f| f as i64))
                .unwrap_or(0);
            Ok(u64::try_from(number).unwrap_or(0))
        }
        Value::ServerError(e) => Err(redis_error(redis::RedisError::from(e.clone()))),
        other => Err(unexpected("a count", Some(other))),
    }
}

fn judge(check: &Check, count: u64, now_ms: u64) -> Result<Outcome, StoreError> {
    match check.rule {
        Rule::FixedWindow {
            limit,
            window_secs,
            window_start,
        } => Ok(fixed_window_outcome(
            count,
            limit,
            window_secs,
            window_start,
            now_ms,
        )),
        _ => Err(StoreError::Protocol(
            "plain commands for a check that is not a fixed window".into(),
        )),
    }
}

fn unexpected(wanted: &str, got: Option<&Value>) -> StoreError {
    StoreError::Protocol(format!("expected {wanted}, got {got:?}"))
}

/// Whether the servers (every master of a cluster) take `PEXPIRE .. NX`, which the plain path
/// needs. Learnt from `INFO server` when the scripts are loaded ([`takes_expire_nx`]); unlearnt
/// when a server refuses it ([`ExpiryFailed::Refused`]: a failover to an older server); and
/// while unlearnt, asked again every `every` ([`ExpireNx::ask_due`]), so that neither a transient
/// answer nor a failover back keeps a store that could use plain commands on the lean script.
#[derive(Debug)]
pub(super) struct ExpireNx {
    takes: AtomicBool,
    /// When the servers may next be asked, in milliseconds since `epoch`.
    next_ask_ms: AtomicU64,
    every_ms: AtomicU64,
    epoch: Instant,
}

impl ExpireNx {
    /// How often a store not using plain commands asks the servers again: one `INFO` per master
    /// a minute costs nothing, and a failover back is noticed within a minute.
    pub(super) const EVERY: Duration = Duration::from_secs(60);

    /// Not known yet: no plain commands until the servers have been asked.
    pub(super) fn new() -> Self {
        Self {
            takes: AtomicBool::new(false),
            next_ask_ms: AtomicU64::new(0),
            every_ms: AtomicU64::new(Self::EVERY.as_millis() as u64),
            epoch: Instant::now(),
        }
    }

    pub(super) fn takes(&self) -> bool {
        self.takes.load(Ordering::Relaxed)
    }

    /// What the servers said (`true`: every one takes it); the next ask is `every` from now.
    pub(super) fn learnt(&self, takes: bool) {
        self.next_ask_ms.store(
            self.now_ms() + self.every_ms.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        if self.takes.swap(takes, Ordering::Relaxed) != takes {
            tracing::info!(
                plain_commands = takes,
                "redis {} PEXPIRE NX: fixed windows decided with {}",
                if takes { "takes" } else { "does not take" },
                if takes {
                    "plain commands"
                } else {
                    "the lean script"
                },
            );
        }
    }

    /// A server refused `PEXPIRE .. NX` (`refusal`, for the log).
    pub(super) fn refused(&self, refusal: &str) {
        if self.takes() {
            tracing::warn!(%refusal, "redis refused PEXPIRE NX");
        }
        self.learnt(false);
    }

    /// Whether the caller should ask the servers now: true for one caller once `every` has
    /// passed since the last answer while plain commands are off.
    pub(super) fn ask_due(&self) -> bool {
        if self.takes() {
            return false;
        }
        let now = self.now_ms();
        let due = self.next_ask_ms.load(Ordering::Relaxed);
        now >= due
            && self
                .next_ask_ms
                .compare_exchange(
                    due,
                    now + self.every_ms.load(Ordering::Relaxed),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Asks more or less often than [`ExpireNx::EVERY`] (tests).
    pub(super) fn ask_every(&self, every: Duration) {
        self.every_ms
            .store(every.as_millis() as u64, Ordering::Relaxed);
        self.next_ask_ms
            .store(self.now_ms() + every.as_millis() as u64, Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// Asks the server behind `conn` whether it takes `PEXPIRE .. NX` (`INFO server`): `None` if it
/// does, else why not, for the log. A refused `INFO` (it is in ACL's `@dangerous`, which a managed
/// Redis may deny) counts as no, as the lean script works on every version.
pub(super) async fn why_no_expire_nx(conn: &mut Connection) -> Result<Option<String>, StoreError> {
    let info: Result<String, redis::RedisError> = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn.redis)
        .await;
    match info {
        Ok(info) if takes_expire_nx(&info) => Ok(None),
        Ok(info) => Ok(Some(format!(
            "redis_version {} (7.0 added NX)",
            redis_version(&info).unwrap_or("unknown")
        ))),
        Err(e) if e.is_io_error() => Err(fail(conn, e)),
        Err(e) => Ok(Some(format!("INFO refused: {e}"))),
    }
}

/// Whether the server that sent this `INFO server` text takes `PEXPIRE .. NX` (Redis 7.0 and
/// later; Valkey reports a `redis_version` too). Unknown means no: the lean script works on all.
pub(super) fn takes_expire_nx(info: &str) -> bool {
    redis_version(info)
        .and_then(|version| version.split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 7)
}

/// The `redis_version` an `INFO server` text names (Valkey names one too).
fn redis_version(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("redis_version:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(key: &str, hits: u64) -> Check {
        Check {
            key: key.into(),
            hits,
            rule: Rule::FixedWindow {
                limit: 10,
                window_secs: 60,
                window_start: 60,
            },
            record_refused: false,
            group: None,
        }
    }

    fn text(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => panic!("only simple arguments"),
            })
            .collect()
    }

    /// An error reply as the wire brings it.
    fn error(code: &str) -> Value {
        redis::parse_redis_value(format!("-{code} detail\r\n").as_bytes()).unwrap()
    }

    #[test]
    fn counts_with_incrby_and_expires_only_new_keys() {
        let (a, look) = (check("a", 3), check("b", 0));
        let cmds = commands(&[&a, &look], || 7);
        let cmds: Vec<Vec<String>> = cmds.iter().map(text).collect();
        assert_eq!(
            cmds,
            [
                vec!["INCRBY", "a", "3"],
                vec!["PEXPIRE", "a", "60007", "NX"],
                vec!["GET", "b"],
            ]
        );
    }

    #[test]
    fn replies_are_judged_like_the_lean_scripts() {
        let (a, look) = (check("a", 3), check("b", 0));
        // 100.5 s: 19.5 s before the window ends.
        let replies = [Value::Int(12), Value::Int(0), Value::Nil];
        let counted = read(&replies, &[&a, &look], 100_500);
        assert!(counted.expiry_failed.is_none());
        assert_eq!(
            counted.outcomes.unwrap(),
            [
                fixed_window_outcome(12, 10, 60, 60, 100_500),
                fixed_window_outcome(0, 10, 60, 60, 100_500),
            ]
        );
        let stored = [Value::BulkString(b"4".to_vec())];
        assert_eq!(
            read(&stored, &[&look], 100_500).outcomes.unwrap()[0].used,
            4
        );
        // What Sluice never writes reads as zero, as in Lua.
        for odd in [&b"-5"[..], b"abc", b""] {
            let reply = [Value::BulkString(odd.to_vec())];
            assert_eq!(read(&reply, &[&look], 0).outcomes.unwrap()[0].used, 0);
        }
    }

    #[test]
    fn errors_and_odd_shapes_are_errors_not_panics() {
        let a = check("a", 3);
        let wrongtype = read(&[error("WRONGTYPE"), Value::Int(0)], &[&a], 0);
        assert!(matches!(wrongtype.outcomes, Err(StoreError::Script(_))));
        let oom = read(&[error("OOM"), Value::Int(0)], &[&a], 0);
        assert!(matches!(oom.outcomes, Err(StoreError::Redis(_))));
        for bad in [
            &[][..],
            &[Value::Int(1)],
            &[Value::Int(1), Value::Nil],
            &[Value::Int(1), Value::Int(1), Value::Int(1)],
            &[Value::Okay, Value::Int(1)],
        ] {
            assert!(
                matches!(read(bad, &[&a], 0).outcomes, Err(StoreError::Protocol(_))),
                "{bad:?}"
            );
        }
        // An older server refusing NX: the count stands, the store is told.
        let refused = read(&[Value::Int(3), error("ERR")], &[&a], 0);
        assert!(matches!(
            refused.expiry_failed,
            Some(ExpiryFailed::Refused(_))
        ));
        assert_eq!(refused.outcomes.unwrap()[0].used, 3);
        // Any other error says nothing about the server's version.
        for code in ["LOADING", "READONLY", "CLUSTERDOWN", "OOM", "BUSY"] {
            let failed = read(&[Value::Int(3), error(code)], &[&a], 0);
            assert!(
                matches!(failed.expiry_failed, Some(ExpiryFailed::Other(_))),
                "{code}"
            );
            assert_eq!(failed.outcomes.unwrap()[0].used, 3);
        }
    }

    #[test]
    fn a_refusal_turns_plain_commands_off_until_the_servers_are_asked_again() {
        let nx = ExpireNx::new();
        assert!(!nx.takes());
        nx.learnt(true);
        assert!(nx.takes());
        assert!(!nx.ask_due(), "nothing to ask while plain commands are on");
        nx.ask_every(Duration::from_millis(50));
        nx.refused("ERR wrong number of arguments for 'pexpire' command");
        assert!(!nx.takes());
        assert!(!nx.ask_due(), "asked again only after the period");
        std::thread::sleep(Duration::from_millis(60));
        assert!(nx.ask_due());
        assert!(!nx.ask_due(), "one caller asks");
        nx.learnt(true);
        assert!(nx.takes());
    }

    #[test]
    fn expire_nx_from_redis_7() {
        let info = |v: &str| format!("# Server\r\nredis_version:{v}\r\nredis_mode:standalone\r\n");
        assert!(takes_expire_nx(&info("7.0.15")));
        assert!(takes_expire_nx(&info("7.2.4")));
        assert!(takes_expire_nx(&info("8.0.0")));
        assert!(!takes_expire_nx(&info("6.2.14")));
        assert!(!takes_expire_nx(&info("5.0.7")));
        assert!(!takes_expire_nx("# Server\r\n"));
        assert!(!takes_expire_nx(&info("garbage")));
    }
}
