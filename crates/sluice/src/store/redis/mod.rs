//! The Redis store: one `EVALSHA` of the decision script per request; on a Redis Cluster one
//! per master the request's slots are on (see `RedisStore::run`). The common request, every
//! check a plain fixed window charged each (`script::fits_lean`), takes the cheapest path the
//! server allows (`DecisionPath`): plain `INCRBY` and `PEXPIRE .. NX` (`plain.rs`) on Redis 7.0
//! or later (a single server, a Sentinel master, or every master of a cluster), else the lean
//! script. A request whose checks all use one other algorithm takes that algorithm's lean script.
//!
//! Connections come from a `bb8` pool of Sluice's own pipelined connections (`wire.rs`: callers
//! write to the socket, one reader task hands out the replies in order). Script calls go through
//! `coalesce.rs`, which sends the calls of concurrent requests as one pipeline on one pooled
//! connection (checked out, cloned and returned at once), the calls of one lean script among
//! them as one call (`merge.rs`). A failed call sets a flag on its connection (`conn::Manager`),
//! and so does a connection that stopped answering; the pool then replaces it on its next
//! checkout, without a PING per request.
//!
//! The scripts are loaded with `SCRIPT LOAD` at start-up and called by SHA1. Redis forgets scripts
//! on restart, failover and `SCRIPT FLUSH`; a `NOSCRIPT` reply means the script did not run, so
//! the store loads them all again and resends, up to 3 times (`coalesce::send_on`), and the caller
//! sees no error.
//!
//! Its parts import in one direction: `options`, `slot` and `script` are leaves; `merge` (one
//! call for several of a lean script) takes from `script`; `wire` (one connection) ← `conn`
//! (pools, connection settings, errors) ← `coalesce` (one pipelined write for concurrent calls) ←
//! `cluster` (the slot map and a pool and batcher per master) ← this module (the [`Store`]
//! implementation); `plain` (the common decision in plain commands) takes from `conn` and
//! `script`; `timeout` (each call's deadline, and what its running out says of Redis) takes from
//! `wire`; `named` (the named limiters' operations, `LimiterStore`) is this module's too.

mod cluster;
mod coalesce;
mod conn;
mod merge;
mod named;
mod options;
mod plain;
mod script;
pub mod slot;
mod timeout;
mod wire;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use redis::{RedisError, Value};

use crate::clock::Clock;

pub use coalesce::PipelineCounts;
pub use conn::ConnectionCounts;
pub use options::{RedisAuth, RedisOptions, StartupRetry, Target, TlsFiles, redact_url};
pub use script::TTL_REPAIR_PERIOD;

use self::cluster::Cluster;
use self::coalesce::Coalescer;
use self::conn::Connection;
use self::conn::{
    Pool, PoolSettings, checkout, connection_info, fail, host_port, load, new_pool, redis_error,
    sentinel_pool, tls_config,
};
use self::plain::{ExpireNx, ExpiryFailed, why_no_expire_nx};
use self::script::{ELSEWHERE, FIXED_WINDOW_LEAN, Keys, LIMITER, LuaScript, Reply};
use self::wire::Heard;
use super::{
    Call, Charging, Check, CounterStore, LimiterKeys, Outcome, Store, StoreError, StoreFuture,
    needs_trial,
};

/// Counters and named limiters in Redis (a single server, a Sentinel master or a Cluster),
/// shared by every replica that uses the same Redis and key prefix.
pub struct RedisStore {
    connector: Connector,
    /// Every connection the store's pools opened and closed.
    connections: Arc<ConnectionCounts>,
    /// What all of them have been told and have said: tells a slow Redis from a dead one for
    /// calls that ran out of time before reaching a server (each pool keeps its server's).
    heard: Arc<Heard>,
    options: RedisOptions,
    /// The cheapest [`DecisionPath`] calls may take (all of them, but for tests that compare
    /// the paths: [`RedisStore::use_path`]).
    fastest: AtomicU8,
    /// Whether the servers take `PEXPIRE .. NX` (Redis 7.0 and later), which the plain path
    /// needs: learnt when the scripts are loaded, unlearnt when a `PEXPIRE .. NX` is refused,
    /// asked again every minute while unlearnt.
    expire_nx: ExpireNx,
}

/// How a call whose checks are all plain fixed windows charged each (`script::fits_lean`) is
/// decided, from the dearest for Redis to the cheapest; a call of one other algorithm takes its
/// lean script from [`DecisionPath::LeanScript`] up (`script::fits_each`), any other call the full
/// script. All give the same answers and leave the same state (`tests/it/redis_store.rs`).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum DecisionPath {
    /// The full decision script (`lua/decide.lua`).
    FullScript = 0,
    /// The lean script that only counts (`lua/fixed_window_lean.lua`), for Redis older than 7.0;
    /// and for the other algorithms, their lean scripts (`lua/decide_each.lua`).
    LeanScript = 1,
    /// `INCRBY` and `PEXPIRE .. NX` per check, no Lua (`plain.rs`).
    PlainCommands = 2,
}

/// How calls reach Redis.
enum Connector {
    /// bb8 pool of pipelined connections to one server; concurrent calls are coalesced.
    Single(Coalescer<Pool>),
    /// A bb8 pool per master, routed by slot (see `cluster.rs`).
    Cluster(Arc<Cluster>),
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("options", &self.options)
            .finish()
    }
}

impl RedisStore {
    /// Sets up the connections without connecting; call [`RedisStore::wait_until_ready`] next.
    pub fn new(options: RedisOptions) -> Result<Self, StoreError> {
        if let Some(path) = &options.auth_file {
            // Read again for every connection; a file that cannot be used now stops the start.
            RedisAuth::read(path).map_err(StoreError::Setup)?;
        }
        if options.target.tls() {
            // rustls needs one process-wide crypto provider; a second install is a no-op error.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let connections = Arc::new(ConnectionCounts::default());
        let heard = Arc::new(Heard::default());
        let pools = PoolSettings {
            size: options.pool_size,
            connect_timeout: options.timeout,
            tls: if options.target.tls() {
                Some(tls_config(&options.tls)?)
            } else {
                None
            },
            auth_file: options.auth_file.clone(),
            counts: connections.clone(),
            heard: heard.clone(),
        };
        // Connecting through Sentinel or to a cluster node may take longer than a decision's
        // deadline (TLS, asking the sentinels); requests are bounded by their own deadline anyway.
        let slow_connect = PoolSettings {
            connect_timeout: options.timeout.max(Duration::from_secs(1)),
            ..pools.clone()
        };
        let connector = match &options.target {
            Target::Single(url) => Connector::Single(Coalescer::new(
                new_pool(connection_info(url, &options)?, &pools),
                Keys::Declared,
            )),
            Target::Sentinel { master, sentinels } => Connector::Single(Coalescer::new(
                sentinel_pool(master, sentinels, &options, &slow_connect)?,
                Keys::Declared,
            )),
            Target::Cluster(nodes) => {
                let template = connection_info(&nodes[0], &options)?;
                let seeds = nodes
                    .iter()
                    .map(|n| host_port(n))
                    .collect::<Result<Vec<_>, _>>()?;
                Connector::Cluster(Arc::new(Cluster::new(template, seeds, slow_connect)))
            }
        };
        Ok(Self {
            connector,
            connections,
            heard,
            options,
            fastest: AtomicU8::new(DecisionPath::PlainCommands as u8),
            expire_nx: ExpireNx::new(),
        })
    }

    /// Keeps decisions off paths cheaper than `fastest`, for tests that compare the paths'
    /// answers and writes; they are the same, so nothing else should call this.
    #[doc(hidden)]
    pub fn use_path(&self, fastest: DecisionPath) {
        self.fastest.store(fastest as u8, Ordering::Relaxed);
    }

    /// How often a store not using the plain commands asks the servers again whether they take
    /// `PEXPIRE .. NX` ([`plain::ExpireNx::EVERY`]); for tests.
    #[doc(hidden)]
    pub fn ask_servers_every(&self, every: Duration) {
        self.expire_nx.ask_every(every);
    }

    /// Whether calls that fit it may take `path`: the tests' cap, and for the plain commands
    /// servers (every master of a cluster) that take `PEXPIRE .. NX`.
    fn may_take(&self, path: DecisionPath) -> bool {
        self.fastest.load(Ordering::Relaxed) >= path as u8
            && (path != DecisionPath::PlainCommands || self.expire_nx.takes())
    }

    /// The SHA1 of the lean decision script (`lua/fixed_window_lean.lua`), as `EVALSHA` names it;
    /// for tests that check which script a decision ran.
    #[doc(hidden)]
    pub fn lean_script_sha1() -> &'static str {
        &FIXED_WINDOW_LEAN.sha1
    }

    /// Script calls and the pipelined writes they went out in, since the store was made (every
    /// master of a cluster summed); for the benchmark's batch depth.
    pub fn pipeline_counts(&self) -> PipelineCounts {
        match &self.connector {
            Connector::Single(coalescer) => coalescer.counts(),
            Connector::Cluster(cluster) => cluster.pipeline_counts(),
        }
    }

    /// The connections the store has opened and closed (every master of a cluster summed), for
    /// upstream's pool stats.
    pub fn connections(&self) -> Arc<ConnectionCounts> {
        self.connections.clone()
    }

    /// Pings Redis and loads the script, retrying on `retry`'s schedule until its
    /// `max_elapsed` has passed (`None`: forever), as upstream's `REDIS_STARTUP_*` settings do.
    pub async fn wait_until_ready(&self, retry: &StartupRetry) -> Result<(), StoreError> {
        let started = Instant::now();
        let mut interval = retry.initial;
        loop {
            match self.load_script().await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let delay = options::randomized(interval);
                    if retry
                        .max_elapsed
                        .is_some_and(|max| started.elapsed() + delay > max)
                    {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, retry_in = ?delay, "redis is not ready");
                    tokio::time::sleep(delay).await;
                    interval = retry.grown(interval);
                }
            }
        }
    }

    /// The circuit breaker's own probe ([`crate::store::layers::Layered::probe_while_open`]):
    /// loads the scripts (a Redis back from a restart has none), within `PROBE_TIMEOUT`.
    pub fn probe(&self) -> StoreFuture<'_, ()> {
        Box::pin(async {
            tokio::time::timeout(PROBE_TIMEOUT, self.load_script())
                .await
                .unwrap_or(Err(StoreError::Timeout(PROBE_TIMEOUT)))
        })
    }

    /// Loads every script (on every master of a cluster); Redis must compute the SHA1s we call
    /// them by.
    async fn load_script(&self) -> Result<(), StoreError> {
        // The plain path needs Redis 7.0 on the server, or on every master of a cluster; a
        // failover to an older server is caught by the first refused `PEXPIRE .. NX` (see
        // [`RedisStore::run_plain`]).
        let mut takes_nx = true;
        for mut conn in self.servers().await? {
            if let Some(why) = why_no_expire_nx(&mut conn).await? {
                tracing::info!(%why, "no PEXPIRE NX: fixed windows decided with the lean script");
                takes_nx = false;
            }
            for script in script::all() {
                let sha = load(&mut conn.redis, script)
                    .await
                    .map_err(|e| fail(&conn, e))?;
                if sha != script.sha1 {
                    return Err(StoreError::Protocol(format!(
                        "redis computed script sha {sha}, expected {}",
                        script.sha1
                    )));
                }
            }
        }
        self.expire_nx.learnt(takes_nx);
        Ok(())
    }

    /// A connection to the server, or to each master of a cluster (the slot map refreshed).
    async fn servers(&self) -> Result<Vec<Connection>, StoreError> {
        match &self.connector {
            Connector::Single(coalescer) => Ok(vec![checkout(coalescer.source()).await?]),
            Connector::Cluster(cluster) => {
                cluster.refresh().await?;
                let mut connections = Vec::new();
                for node in cluster.masters() {
                    connections.push(cluster.connection(&node).await?);
                }
                Ok(connections)
            }
        }
    }

    /// Asks the servers again whether they all take `PEXPIRE .. NX` ([`ExpireNx::ask_due`]);
    /// an error leaves things as they are until the next ask.
    async fn ask_servers(&self) {
        let answer = async {
            let mut takes_nx = true;
            for mut conn in self.servers().await? {
                // Said at start-up; not again every minute.
                takes_nx &= why_no_expire_nx(&mut conn).await?.is_none();
            }
            Ok::<_, StoreError>(takes_nx)
        };
        match answer.await {
            Ok(takes_nx) => self.expire_nx.learnt(takes_nx),
            Err(e) => {
                tracing::debug!(error = %e, "could not ask redis whether it takes PEXPIRE NX")
            }
        }
    }

    /// Runs `script` by SHA1 with the arguments `build` appends; every key is in `slot`.
    /// `capacity` is the (arguments, bytes) `build` will append (see [`script::evalsha`]).
    async fn eval<T: redis::FromRedisValue>(
        &self,
        slot: u16,
        script: &'static LuaScript,
        capacity: (usize, usize),
        build: impl FnOnce(&mut redis::Cmd, Option<u64>),
    ) -> Result<T, StoreError> {
        let mut cmd = script::evalsha(script, capacity);
        build(&mut cmd, self.pinned_now());
        parse(self.route(slot, cmd).await?)
    }

    /// Marks `member` as a live replica in the sorted set `key` (score: Redis's clock, in
    /// milliseconds), drops members not seen for `live_ms`, and returns how many are left: the
    /// replica count of the `local_share` failure policy (`store::layers::local_share::replicas`). One
    /// key, so one slot on a cluster; Redis's clock, so the replicas' clocks need not agree.
    pub async fn count_replicas(
        &self,
        key: &str,
        member: &str,
        live_ms: u64,
    ) -> Result<u64, StoreError> {
        const SCRIPT: &str = "local t = redis.call('TIME') \
            local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
            redis.call('ZADD', KEYS[1], now, ARGV[1]) \
            redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2])) \
            redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2])) \
            return redis.call('ZCARD', KEYS[1])";
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SCRIPT).arg(1).arg(key).arg(member).arg(live_ms);
        let slot = slot::slot(key.as_bytes());
        self.bounded(Call::detached(), async move {
            parse(self.route(slot, cmd).await?)
        })
        .await
    }

    /// The time tests pin instead of Redis's clock, in microseconds.
    fn pinned_now(&self) -> Option<u64> {
        self.options.pinned_clock.as_ref().map(|c| c.now_micros())
    }

    /// Sends a script call whose keys are all in `slot` to the server (the master of `slot` on a
    /// cluster) and returns its reply; an error reply is an error.
    async fn route(&self, slot: u16, cmd: redis::Cmd) -> Result<Value, StoreError> {
        match &self.connector {
            Connector::Single(coalescer) => match coalescer.call(cmd).await? {
                Value::ServerError(e) => Err(redis_error(RedisError::from(e))),
                value => Ok(value),
            },
            Connector::Cluster(cluster) => cluster.run(slot, &cmd).await,
        }
    }

    /// Decides the checks: one script call for a single server. On a cluster a script call's
    /// declared keys must share one slot, so checks are split by slot; then the slots that one
    /// master serves go to it in one call that takes its keys undeclared
    /// ([`Keys::AcrossSlots`]), and a master that refuses one of them (the slot moved or is
    /// migrating) writes nothing and gets one call per slot instead, which follows the
    /// redirections. The calls to different masters run concurrently; outcomes are merged back
    /// in request order.
    ///
    /// `charging` applies to each call on its own. A call that needs a trial pass
    /// ([`needs_trial`]: [`Charging::StopWhenOver`] over several checks, a group of limits) stays
    /// one call per slot, so which checks stop each other's charges depends on slots as
    /// documented, never on which master serves them; the other checks are each decided on their
    /// own, so one call per master answers exactly what one call per slot would.
    async fn run(&self, checks: &[&Check], charging: Charging) -> Result<Vec<Outcome>, StoreError> {
        let plain = self.fastest.load(Ordering::Relaxed) >= DecisionPath::PlainCommands as u8
            && script::fits_lean(checks, charging);
        if plain && self.expire_nx.takes() {
            return self.run_plain(checks).await;
        }
        // The script paths' futures are two to three times the plain one's, and a decision's
        // future is moved whole by each layer that wraps it (deadline, breaker, metrics): boxed,
        // they leave the common decision's future small (docs/BENCHMARKS.md, "Issue #30, part 4").
        if plain && self.expire_nx.ask_due() {
            // Alongside this decision, which goes by script, so it waits for no extra round trip.
            let (outcomes, ()) = Box::pin(async {
                futures::join!(self.run_scripts(checks, charging), self.ask_servers())
            })
            .await;
            return outcomes;
        }
        Box::pin(self.run_scripts(checks, charging)).await
    }

    /// [`RedisStore::run`] by script calls.
    async fn run_scripts(
        &self,
        checks: &[&Check],
        charging: Charging,
    ) -> Result<Vec<Outcome>, StoreError> {
        let cluster = match &self.connector {
            Connector::Single(_) => return self.run_batch(0, checks, charging).await,
            Connector::Cluster(cluster) => cluster,
        };
        // Each slot's checks, as indexes in request order.
        let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (index, check) in checks.iter().enumerate() {
            by_slot
                .entry(slot::slot(check.key.as_bytes()))
                .or_default()
                .push(index);
        }
        if by_slot.len() == 1 {
            let slot = *by_slot.keys().next().expect("one group");
            return self.run_batch(slot, checks, charging).await;
        }
        // The slots of each master as the slot map has them; `None` holds the slots that go one
        // call each (no known master, or the call needs a trial pass).
        let across = !needs_trial(checks, charging);
        let mut by_master: BTreeMap<Option<String>, Vec<(u16, Vec<usize>)>> = BTreeMap::new();
        for (slot, indexes) in by_slot {
            let master = if across { cluster.owner(slot) } else { None };
            by_master.entry(master).or_default().push((slot, indexes));
        }
        let calls = by_master.iter().map(|(master, slots)| {
            self.run_on_master(cluster, master.as_deref(), slots, checks, charging)
        });
        let replies = futures::future::try_join_all(calls).await?;
        let mut outcomes = vec![None; checks.len()];
        for (index, outcome) in replies.into_iter().flatten() {
            outcomes[index] = Some(outcome);
        }
        Ok(outcomes
            .into_iter()
            .map(|o| o.expect("every check belongs to one slot"))
            .collect())
    }

    /// Decides the checks of `slots` (each with its checks' indexes into `checks`): in one call
    /// on `master` when it serves several of them and takes the call, else one call per slot.
    async fn run_on_master(
        &self,
        cluster: &Cluster,
        master: Option<&str>,
        slots: &[(u16, Vec<usize>)],
        checks: &[&Check],
        charging: Charging,
    ) -> Result<Vec<(usize, Outcome)>, StoreError> {
        if let (Some(master), true) = (master, slots.len() > 1) {
            let mut indexes: Vec<usize> = slots.iter().flat_map(|(_, i)| i).copied().collect();
            indexes.sort_unstable();
            let part: Vec<&Check> = indexes.iter().map(|&i| checks[i]).collect();
            let (cmd, layout) = self.decision(&part, charging, Keys::AcrossSlots);
            match cluster.run_on(master, cmd).await? {
                // Refused before anything was written (lua/across_slots.lua): one call per slot.
                Some(Value::SimpleString(refusal)) if refusal.starts_with(ELSEWHERE) => {
                    tracing::debug!(master, %refusal, "a master refused a call across its slots");
                }
                Some(value) => {
                    let reply: Vec<i64> = parse(value)?;
                    return Ok(indexes
                        .into_iter()
                        .zip(layout.decode(&reply, &part)?)
                        .collect());
                }
                // Not sent, or refused as a whole by the cluster: nothing ran.
                None => {}
            }
        }
        let calls = slots.iter().map(|(slot, indexes)| async move {
            let part: Vec<&Check> = indexes.iter().map(|&i| checks[i]).collect();
            let outcomes = self.run_batch(*slot, &part, charging).await?;
            Ok::<_, StoreError>(indexes.iter().copied().zip(outcomes).collect::<Vec<_>>())
        });
        let replies = futures::future::try_join_all(calls).await?;
        Ok(replies.into_iter().flatten().collect())
    }

    /// One script call deciding `checks`, all in `slot`.
    async fn run_batch(
        &self,
        slot: u16,
        checks: &[&Check],
        charging: Charging,
    ) -> Result<Vec<Outcome>, StoreError> {
        let (cmd, layout) = self.decision(checks, charging, Keys::Declared);
        let reply: Vec<i64> = parse(self.route(slot, cmd).await?)?;
        layout.decode(&reply, checks)
    }

    /// Decides `checks` ([`script::fits_lean`]) with plain commands: on one server in one call
    /// of the coalescer, on a cluster in one per master (following redirections command by
    /// command, [`Cluster::run_commands`]); the counts are judged on the service's clock (or the
    /// pinned one).
    async fn run_plain(&self, checks: &[&Check]) -> Result<Vec<Outcome>, StoreError> {
        let cmds = plain::commands(checks, self.ttl_jitter());
        let replies = match &self.connector {
            Connector::Single(coalescer) => coalescer.call_all(cmds).await?,
            Connector::Cluster(cluster) => cluster.run_commands(cmds).await?,
        };
        let now_micros = self
            .pinned_now()
            .unwrap_or_else(|| crate::clock::SystemClock.now_micros());
        let counted = plain::read(&replies, checks, now_micros / 1000);
        match counted.expiry_failed {
            // The counts stand; keys left without a TTL get one from the lean script's repair.
            Some(ExpiryFailed::Refused(refusal)) => self.expire_nx.refused(&refusal),
            Some(ExpiryFailed::Other(error)) => {
                tracing::debug!(%error, "PEXPIRE NX failed; the key's next decision sets its TTL");
            }
            None => {}
        }
        counted.outcomes
    }

    /// The script call deciding `checks`, with each new counter's expiry jittered, and how its
    /// reply is laid out.
    fn decision(&self, checks: &[&Check], charging: Charging, keys: Keys) -> (redis::Cmd, Reply) {
        script::decision_call(
            checks,
            charging,
            self.may_take(DecisionPath::LeanScript),
            keys,
            self.pinned_now(),
            self.ttl_jitter(),
        )
    }

    /// Draws the jitter added to each new counter's expiry (`EXPIRATION_JITTER_MAX_SECONDS`).
    fn ttl_jitter(&self) -> impl FnMut() -> u64 + use<> {
        let jitter_ms = self.options.expiration_jitter_max.as_millis() as u64;
        let mut rng = rand::rng();
        move || {
            if jitter_ms == 0 {
                0
            } else {
                rng.random_range(0..jitter_ms)
            }
        }
    }

    /// One operation of `lua/limiter.lua` on a limiter's keys: the config, the shared state and
    /// epoch, the client's (the shared ones again when there is no client), and the set of
    /// clients holding a state.
    async fn limiter_op<T: redis::FromRedisValue>(
        &self,
        keys: &LimiterKeys,
        op: &str,
        args: impl FnOnce(&mut redis::Cmd),
    ) -> Result<T, StoreError> {
        let client = keys.client.as_ref().unwrap_or(&keys.shared);
        let slot = slot::slot(keys.config.as_bytes());
        self.eval(slot, &LIMITER, (0, 0), |cmd, pinned| {
            cmd.arg(6)
                .arg(&keys.config)
                .arg(&keys.shared.state)
                .arg(&keys.shared.epoch)
                .arg(&client.state)
                .arg(&client.epoch)
                .arg(&keys.clients)
                .arg(pinned.map_or(String::new(), |t| t.to_string()))
                .arg(op)
                .arg(u8::from(keys.client.is_some()));
            args(cmd);
        })
        .await
    }
}

/// How long the breaker's own probe may take: a Redis that cannot load a script within a
/// second is not back yet, and a probe held longer would keep the breaker half-open (every
/// call refused) after Redis had recovered.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A script's reply as the caller's type.
fn parse<T: redis::FromRedisValue>(value: Value) -> Result<T, StoreError> {
    T::from_redis_value(value).map_err(|e| StoreError::Protocol(e.to_string()))
}

impl RedisStore {
    /// `work` within `call`'s deadline, judged when it runs out (`timeout.rs`).
    fn bounded<'a, T: Send + 'a>(
        &'a self,
        call: Call<'a>,
        work: impl Future<Output = Result<T, StoreError>> + Send + 'a,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let result = timeout::within(self.options.timeout, &self.heard, call, work).await;
            if let (
                Err(StoreError::Timeout(_) | StoreError::Late(_)),
                Connector::Cluster(cluster),
            ) = (&result, &self.connector)
            {
                // A node may have failed over without telling us: look again, in the
                // background, so the next calls find the new master. Not for a caller's short
                // deadline, which says nothing of the nodes.
                let cluster = cluster.clone();
                tokio::spawn(async move { cluster.refresh().await });
            }
            result
        })
    }
}

impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }
}

impl CounterStore for RedisStore {
    fn check_with<'a>(
        &'a self,
        call: Call<'a>,
        checks: &'a [&'a Check],
        charging: Charging,
    ) -> StoreFuture<'a> {
        self.bounded(call, self.run(checks, charging))
    }

    /// One `DEL` per key, each sent to the master of its slot (a counter's whole state is its
    /// one key, for every algorithm); they go concurrently through the batcher.
    fn reset<'a>(&'a self, call: Call<'a>, keys: &'a [&'a str]) -> StoreFuture<'a, u64> {
        self.bounded(call, async move {
            let deletes = keys.iter().map(|key| async move {
                let cmd = redis::cmd("DEL").arg(*key).clone();
                parse::<u64>(self.route(slot::slot(key.as_bytes()), cmd).await?)
            });
            Ok(futures::future::try_join_all(deletes).await?.iter().sum())
        })
    }

    /// One call of `lua/refund.lua` per check, each to the master of its key's slot.
    fn refund<'a>(&'a self, call: Call<'a>, checks: &'a [&'a Check]) -> StoreFuture<'a, Vec<u64>> {
        self.bounded(call, async move {
            let refunds = checks.iter().map(|check| async move {
                let cmd = script::refund(check, self.pinned_now());
                parse::<u64>(self.route(slot::slot(check.key.as_bytes()), cmd).await?)
            });
            futures::future::try_join_all(refunds).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let options = RedisOptions {
            target: Target::Single("redis://admin:hunter2@localhost:6379".into()),
            auth: Some(RedisAuth::parse("user:s3cret")),
            auth_file: None,
            sentinel_auth: None,
            tls: TlsFiles::default(),
            pool_size: 1,
            timeout: Duration::from_millis(10),
            expiration_jitter_max: Duration::ZERO,
            pinned_clock: None,
        };
        let shown = format!("{options:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("s3cret"),
            "{shown}"
        );
        assert!(shown.contains("admin:<redacted>@localhost:6379"), "{shown}");
    }

    #[test]
    fn auth_forms() {
        let plain = RedisAuth::parse("pw");
        assert_eq!((plain.username, plain.password.as_str()), (None, "pw"));
        let acl = RedisAuth::parse("user:pw:with:colons");
        assert_eq!(acl.username.as_deref(), Some("user"));
        assert_eq!(acl.password, "pw:with:colons");
    }
}
