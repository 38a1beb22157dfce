//! Redis Cluster routing: the slot map, one bb8 pool and one batcher (`coalesce.rs`) per
//! master, and the cluster's replies that move a call (`MOVED`, `ASK`, `TRYAGAIN`,
//! `CLUSTERDOWN`, a dead node).
//!
//! We route ourselves instead of using redis-rs's cluster client because a rate limiter needs
//! bounded, predictable behaviour when the cluster changes: redis-rs refreshes its slot map only
//! on `MOVED`, so after a master dies its calls fail until something else triggers a refresh,
//! and under resharding its refreshes held calls past their deadline (we measured both with
//! `tests/it/redis_cluster.rs`). Here:
//!
//! - the slot map comes from `CLUSTER SLOTS`, asked of any known node (the seeds from
//!   `REDIS_URL` and every master seen since), and is refreshed after a `MOVED`, after a
//!   connection failure, and at most every [`MIN_REFRESH_INTERVAL`];
//! - `MOVED` retries on the named node at once; `ASK` sends `ASKING` and the call to the named
//!   node in one pipeline; `TRYAGAIN`/`CLUSTERDOWN`/`MASTERDOWN` wait briefly and retry; all
//!   within the caller's deadline. None of these replies means the script ran, so retrying them
//!   cannot count twice;
//! - a call whose connection broke after it was sent is *not* retried: the script may have run,
//!   and a retry could count its hits twice. The caller gets an error (and the failure policy).
//! - a call across several slots of one master ([`Cluster::run_on`]) follows no redirection:
//!   its script refuses the whole call before writing when the node does not serve one of its
//!   keys, and the caller then sends the slots one call each through [`Cluster::run`];
//! - plain single-key commands (the fixed window's `INCRBY` + `PEXPIRE .. NX`,
//!   [`Cluster::run_commands`]) go one pipelined call per master whatever their slots, and
//!   only the commands the cluster redirects are sent again, each slot's in their order.
//!
//! Scripts are loaded on every master at start-up; a master that joins or is promoted later
//! answers `NOSCRIPT` once and gets them then (see `coalesce.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisError, ServerErrorKind, Value,
};

use super::coalesce::{CallError, Coalescer, Connect, PipelineCounts, send_on};
use super::conn::{Connection, Pool, PoolSettings, checkout, fail, new_pool, redis_error};
use super::script::Keys;
use super::slot::SLOTS;
use super::wire::{Heard, Watch};
use crate::store::StoreError;

/// Refreshes of the slot map are at least this far apart.
pub(super) const MIN_REFRESH_INTERVAL: Duration = Duration::from_millis(100);
/// Pause before retrying a call the cluster asked us to retry (`TRYAGAIN` and the like).
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// Redirections one call may follow.
const MAX_REDIRECTS: usize = 5;

/// Which master serves each slot.
struct Topology {
    /// Index into `masters` per slot; `None` while a slot has no master.
    owner: Vec<Option<usize>>,
    masters: Vec<String>,
}

pub(super) struct Cluster {
    /// Settings to connect with (auth, whether TLS); the address is replaced per node.
    template: ConnectionInfo,
    seeds: Vec<String>,
    /// What each node's pool is made with (TLS settings for `rediss://` nodes among them).
    pools: PoolSettings,
    topology: ArcSwap<Topology>,
    nodes: Mutex<HashMap<String, Arc<Coalescer<Node>>>>,
    /// When the slot map was last refreshed (`None`: never).
    refresh: tokio::sync::Mutex<Option<Instant>>,
}

/// How long a node that could not be reached is skipped.
const DOWN_FOR: Duration = Duration::from_millis(500);
/// Longest wait for a connection to a node before it counts as unreachable. New connections
/// are made in the background and are not cancelled by this.
const CHECKOUT_WAIT: Duration = Duration::from_millis(200);

/// How a call to one node ended.
enum Attempt<T> {
    Done(T),
    Moved(String),
    Ask(String),
    RetryLater,
    /// Could not reach the node; nothing was sent.
    Unreachable(StoreError),
}

impl Cluster {
    /// `seeds` are `host:port` addresses; `template` carries auth settings and whether to use
    /// TLS, `pools` the rest.
    pub(super) fn new(template: ConnectionInfo, seeds: Vec<String>, pools: PoolSettings) -> Self {
        Self {
            template,
            seeds,
            pools,
            topology: ArcSwap::from_pointee(Topology {
                owner: vec![None; usize::from(SLOTS)],
                masters: Vec::new(),
            }),
            nodes: Mutex::new(HashMap::new()),
            refresh: tokio::sync::Mutex::new(None),
        }
    }

    /// The masters currently known.
    pub(super) fn masters(&self) -> Vec<String> {
        self.topology.load().masters.clone()
    }

    /// The pipelines sent to every master so far.
    pub(super) fn pipeline_counts(&self) -> PipelineCounts {
        let mut total = PipelineCounts::default();
        for node in lock(&self.nodes).values() {
            total += node.counts();
        }
        total
    }

    /// The batcher of `node`, with its pool (created on first use).
    fn node(&self, node: &str) -> Result<Arc<Coalescer<Node>>, StoreError> {
        let mut nodes = lock(&self.nodes);
        if let Some(found) = nodes.get(node) {
            return Ok(found.clone());
        }
        // Merged calls take their keys across slots: one call's declared keys must share one.
        let source = Node {
            name: node.to_string(),
            pool: new_pool(self.node_info(node)?, &self.pools),
            down_until: Mutex::new(None),
        };
        let created = Arc::new(Coalescer::new(source, Keys::AcrossSlots));
        nodes.insert(node.to_string(), created.clone());
        Ok(created)
    }

    /// A connection to `node`, from its pool. A node that could not be reached recently fails
    /// at once.
    pub(super) async fn connection(&self, node: &str) -> Result<Connection, StoreError> {
        self.node(node)?.source().connect().await
    }

    fn node_info(&self, node: &str) -> Result<ConnectionInfo, StoreError> {
        let (host, port) = node
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_string(), p.parse().ok()?)))
            .ok_or_else(|| StoreError::Setup(format!("bad cluster node address {node:?}")))?;
        let addr = match self.template.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        Ok(self.template.clone().set_addr(addr))
    }

    /// Reloads the slot map from the first node that answers `CLUSTER SLOTS`. Calls closer
    /// together than [`MIN_REFRESH_INTERVAL`] share one refresh.
    pub(super) async fn refresh(&self) -> Result<(), StoreError> {
        let mut last = self.refresh.lock().await;
        if last.is_some_and(|at| at.elapsed() < MIN_REFRESH_INTERVAL) {
            return Ok(());
        }
        let mut candidates = self.masters();
        candidates.extend(self.seeds.iter().cloned());
        candidates.sort();
        candidates.dedup();
        if candidates.is_empty() {
            return Err(StoreError::Unavailable("no cluster node known".into()));
        }
        // Ask every known node at once and take the first good answer: a dead node must not
        // hold the refresh up.
        let asks = candidates.iter().map(|node| {
            Box::pin(async move {
                let mut conn = self.connection(node).await?;
                let slots = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut conn.redis)
                    .await
                    .map_err(|e| fail(&conn, e))?;
                let topology = parse_slots(&slots, node)?;
                if topology.owner.iter().any(Option::is_some) {
                    Ok(topology)
                } else {
                    Err(StoreError::Unavailable(format!(
                        "{node}: no slots assigned"
                    )))
                }
            })
        });
        let result = futures::future::select_ok(asks).await;
        *last = Some(Instant::now());
        match result {
            Ok((topology, _)) => {
                tracing::debug!(masters = ?topology.masters, "cluster slot map refreshed");
                self.topology.store(Arc::new(topology));
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Runs `cmd` (an `EVALSHA`) on the master of `slot`, following the cluster's
    /// redirections until the call completes or fails for good. Calls to a node are coalesced
    /// with other requests' (see `coalesce.rs`), except after `ASK`, which needs `ASKING` sent
    /// right before the call.
    pub(super) async fn run(&self, slot: u16, cmd: &redis::Cmd) -> Result<Value, StoreError> {
        let mut target: Option<(String, bool)> = None;
        for _ in 0..=MAX_REDIRECTS {
            let (node, asking) = match target.take() {
                Some(t) => t,
                None => (self.master_of(slot).await?, false),
            };
            let attempt = if asking {
                self.attempt_asking(&node, cmd).await?
            } else {
                self.attempt(&node, cmd).await?
            };
            log_attempt(slot, &node, &attempt);
            match attempt {
                Attempt::Done(value) => return Ok(value),
                Attempt::Moved(to) => {
                    // The map is stale: use the named node now, refresh for everyone else.
                    let _ = self.refresh().await;
                    target = Some((to, false));
                }
                Attempt::Ask(to) => target = Some((to, true)),
                Attempt::RetryLater => tokio::time::sleep(RETRY_PAUSE).await,
                Attempt::Unreachable(e) => {
                    // Its master may have failed over: look again, then retry once the map
                    // names another node (nothing was sent, so a retry cannot count twice).
                    let _ = self.refresh().await;
                    if self.owner(slot).is_none_or(|owner| owner == node) {
                        tokio::time::sleep(RETRY_PAUSE).await;
                        let _ = self.refresh().await;
                        if self.owner(slot).is_none_or(|owner| owner == node) {
                            return Err(e);
                        }
                    }
                }
            }
        }
        Err(StoreError::Unavailable(format!(
            "slot {slot}: more than {MAX_REDIRECTS} redirections"
        )))
    }

    /// Runs single-key commands (the key is each command's first argument): one pipelined call
    /// per master the slot map names, coalesced with other requests' calls to it; the replies
    /// come back in the order of `cmds`. A command the cluster redirects (`MOVED`, `ASK`) or
    /// asks to retry (`TRYAGAIN`, `CLUSTERDOWN`) did not run, and neither did any command sent
    /// to a node that could not be reached: those are sent again where the cluster says, each
    /// slot's in their order (so a key's `INCRBY` stays before its `PEXPIRE`), within
    /// [`MAX_REDIRECTS`] rounds. Other error replies are replies like any other. A call whose
    /// connection broke after it was sent is an error, never resent: its commands may have run.
    pub(super) async fn run_commands(&self, cmds: Vec<Cmd>) -> Result<Vec<Value>, StoreError> {
        let mut replies: Vec<Option<Value>> = vec![None; cmds.len()];
        // What is still to run, as (index into cmds, slot) in the order of `cmds`.
        let mut pending = slots_of(&cmds)?;
        // Per slot, where the cluster last sent its commands (the node, and whether with ASKING).
        let mut sent_to: HashMap<u16, (String, bool)> = HashMap::new();
        for _ in 0..=MAX_REDIRECTS {
            if pending.is_empty() {
                return Ok(replies
                    .into_iter()
                    .map(|r| r.expect("every command answered"))
                    .collect());
            }
            let groups = self.group_by_target(pending.drain(..), &sent_to).await?;
            let cmds = &cmds;
            let rounds = groups
                .into_iter()
                .map(|((node, asking), items)| async move {
                    let batch: Vec<Cmd> = items.iter().map(|&(i, _)| cmds[i].clone()).collect();
                    let answers = self.send_commands(&node, asking, batch).await?;
                    Ok::<_, StoreError>((node, items, answers))
                });
            sent_to.clear();
            let mut retry_later = false;
            for (node, items, answers) in futures::future::try_join_all(rounds).await? {
                match answers {
                    Ok(answers) => {
                        for (item, answer) in items.into_iter().zip(answers) {
                            match next_step(&node, item.1, answer, &mut sent_to) {
                                Ok(answer) => replies[item.0] = Some(answer),
                                Err(later) => {
                                    retry_later |= later;
                                    pending.push(item);
                                }
                            }
                        }
                    }
                    Err(unreachable) => {
                        // Nothing was sent: as in `run`, retry once the map names another node.
                        if self.still_serves(&node, &items).await {
                            return Err(unreachable);
                        }
                        pending.extend(items);
                    }
                }
            }
            if retry_later {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            if sent_to.values().any(|(_, asking)| !asking) {
                // A MOVED: the map is stale; refresh it for everyone else.
                let _ = self.refresh().await;
            }
            // Each slot's commands in their order again (a group may have mixed slots).
            pending.sort_unstable();
        }
        Err(StoreError::Unavailable(format!(
            "more than {MAX_REDIRECTS} redirections"
        )))
    }

    /// `pending` grouped by where each goes: the node and ASKING the cluster last named for its
    /// slot, else the slot's master; each group in the order of `pending`.
    async fn group_by_target(
        &self,
        pending: impl Iterator<Item = (usize, u16)>,
        sent_to: &HashMap<u16, (String, bool)>,
    ) -> Result<BTreeMap<(String, bool), Vec<(usize, u16)>>, StoreError> {
        let mut groups: BTreeMap<(String, bool), Vec<(usize, u16)>> = BTreeMap::new();
        for (index, slot) in pending {
            let target = match sent_to.get(&slot) {
                Some(target) => target.clone(),
                None => (self.master_of(slot).await?, false),
            };
            groups.entry(target).or_default().push((index, slot));
        }
        Ok(groups)
    }

    /// After `node` could not be reached: whether the slot map, refreshed (twice, a pause
    /// apart, if need be), still names it (or no one) for one of the `items`' slots.
    async fn still_serves(&self, node: &str, items: &[(usize, u16)]) -> bool {
        let named = |cluster: &Self| {
            items
                .iter()
                .any(|&(_, slot)| cluster.owner(slot).is_none_or(|owner| owner == node))
        };
        let _ = self.refresh().await;
        if !named(self) {
            return false;
        }
        tokio::time::sleep(RETRY_PAUSE).await;
        let _ = self.refresh().await;
        named(self)
    }

    /// One pipeline of single-key `cmds` on `node`: coalesced with other calls, or after an
    /// `ASK` on a connection of its own with `ASKING` before each command (it holds for one
    /// command only). `Err` inside when the node could not be reached: nothing was sent.
    async fn send_commands(
        &self,
        node: &str,
        asking: bool,
        cmds: Vec<Cmd>,
    ) -> Result<Result<Vec<Value>, StoreError>, StoreError> {
        if !asking {
            return match self.node(node)?.call_all(cmds).await {
                Ok(answers) => Ok(Ok(answers)),
                Err(CallError::NotSent(e)) => Ok(Err(e)),
                Err(CallError::Lost(e)) => Err(e),
            };
        }
        let mut conn = match self.connection(node).await {
            Ok(conn) => conn,
            Err(e) => return Ok(Err(e)),
        };
        if let Some(watch) = Watch::current() {
            watch.written_to(&conn.redis);
        }
        let mut pipe = Pipeline::with_capacity(2 * cmds.len());
        for cmd in cmds {
            pipe.cmd("ASKING").add_command(cmd);
        }
        let answers = send_on(&mut conn, &pipe)
            .await
            .map_err(|e| fail(&conn, e))?;
        if answers.len() != pipe.len() {
            return Err(StoreError::Protocol(format!(
                "{} replies to {} commands",
                answers.len(),
                pipe.len()
            )));
        }
        Ok(Ok(answers.into_iter().skip(1).step_by(2).collect()))
    }

    /// The master the slot map names for `slot`, refreshing the map once when it names none.
    async fn master_of(&self, slot: u16) -> Result<String, StoreError> {
        match self.owner(slot) {
            Some(node) => Ok(node),
            None => {
                self.refresh().await?;
                let node = self.owner(slot).ok_or_else(|| {
                    StoreError::Unavailable(format!("no master serves slot {slot}"))
                })?;
                Ok(node)
            }
        }
    }

    /// One try of `cmd` on `node` after an `ASK`: `ASKING` and the call in one pipeline on a
    /// connection of its own (not coalesced, since `ASKING` must come right before the call).
    async fn attempt_asking(
        &self,
        node: &str,
        cmd: &redis::Cmd,
    ) -> Result<Attempt<Value>, StoreError> {
        Ok(match self.connection(node).await {
            Err(e) => Attempt::Unreachable(e),
            Ok(mut conn) => {
                if let Some(watch) = Watch::current() {
                    watch.written_to(&conn.redis);
                }
                // After a NOSCRIPT the call is resent without ASKING; the node then
                // answers MOVED (the script did not run) and the loop follows it.
                let mut pipe = Pipeline::with_capacity(2);
                pipe.cmd("ASKING").add_command(cmd.clone());
                match send_on(&mut conn, &pipe).await {
                    Ok(mut replies) => match replies.pop() {
                        Some(Value::ServerError(e)) => {
                            classify(RedisError::from(e)).map_err(|e| fail(&conn, e))?
                        }
                        Some(value) => Attempt::Done(value),
                        None => {
                            return Err(StoreError::Protocol("no reply after ASKING".into()));
                        }
                    },
                    Err(e) => return Err(fail(&conn, e)),
                }
            }
        })
    }

    /// One try of `cmd` on `node`, coalesced with other requests' calls to it.
    async fn attempt(&self, node: &str, cmd: &redis::Cmd) -> Result<Attempt<Value>, StoreError> {
        Ok(match self.node(node)?.call(cmd.clone()).await {
            Ok(Value::ServerError(e)) => classify(RedisError::from(e)).map_err(redis_error)?,
            Ok(value) => Attempt::Done(value),
            Err(CallError::NotSent(e)) => Attempt::Unreachable(e),
            // The script may have run: not retried, so hits are never counted twice.
            Err(CallError::Lost(e)) => return Err(e),
        })
    }

    /// Sends `cmd` to `node` as it is, without following redirections: a call whose keys span
    /// several slots of the node (`script::Keys::AcrossSlots`), which the script itself runs or
    /// refuses as a whole. `None` when nothing ran: the node could not be reached, or the
    /// cluster refused the call as a whole (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`); the
    /// caller then routes by slot. A call that may have run is an error, never resent.
    pub(super) async fn run_on(
        &self,
        node: &str,
        cmd: redis::Cmd,
    ) -> Result<Option<Value>, StoreError> {
        match self.node(node)?.call(cmd).await {
            Ok(Value::ServerError(e)) => match classify::<()>(RedisError::from(e)) {
                Ok(_) => Ok(None),
                Err(e) => Err(redis_error(e)),
            },
            Ok(value) => Ok(Some(value)),
            Err(CallError::NotSent(e)) => {
                tracing::debug!(node, error = %e, "node unreachable");
                Ok(None)
            }
            Err(CallError::Lost(e)) => Err(e),
        }
    }

    /// The master serving `slot` in the current slot map.
    pub(super) fn owner(&self, slot: u16) -> Option<String> {
        let topology = self.topology.load();
        topology.owner[usize::from(slot)].map(|i| topology.masters[i].clone())
    }
}

/// Each single-key command's index and the slot of its key (its first argument).
fn slots_of(cmds: &[Cmd]) -> Result<Vec<(usize, u16)>, StoreError> {
    cmds.iter()
        .enumerate()
        .map(|(index, cmd)| match cmd.args_iter().nth(1) {
            Some(redis::Arg::Simple(key)) => Ok((index, super::slot::slot(key))),
            _ => Err(StoreError::Protocol("a command without a key".into())),
        })
        .collect()
}

/// What to do with `answer`, from `node`, to a command on `slot` ([`Cluster::run_commands`]):
/// `Ok` it is the command's reply; `Err` the command did not run and goes again, where
/// `sent_to` now says for a redirection (`Err(false)`), or after a pause (`Err(true)`).
fn next_step(
    node: &str,
    slot: u16,
    answer: Value,
    sent_to: &mut HashMap<u16, (String, bool)>,
) -> Result<Value, bool> {
    let attempt = match &answer {
        Value::ServerError(e) => classify::<()>(RedisError::from(e.clone())).ok(),
        _ => None,
    };
    match attempt {
        None | Some(Attempt::Done(())) => Ok(answer),
        Some(Attempt::Moved(to)) => {
            log_attempt(slot, node, &Attempt::<()>::Moved(to.clone()));
            // An ASK for another command of the slot keeps its ASKING: a node that owns the
            // slot ignores it.
            let asking = sent_to.get(&slot).is_some_and(|target| target.1);
            sent_to.insert(slot, (to, asking));
            Err(false)
        }
        Some(Attempt::Ask(to)) => {
            log_attempt(slot, node, &Attempt::<()>::Ask(to.clone()));
            sent_to.insert(slot, (to, true));
            Err(false)
        }
        Some(other) => {
            log_attempt(slot, node, &other);
            Err(true)
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sorts a failed call into what to do next. Errors that may mean the script ran are final
/// (returned as they are).
fn classify<T>(e: RedisError) -> Result<Attempt<T>, RedisError> {
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::Moved) => match e.redirect_node() {
            Some((node, _)) => Ok(Attempt::Moved(node.to_string())),
            None => Err(e),
        },
        ErrorKind::Server(ServerErrorKind::Ask) => match e.redirect_node() {
            Some((node, _)) => Ok(Attempt::Ask(node.to_string())),
            None => Err(e),
        },
        ErrorKind::Server(
            ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown | ServerErrorKind::MasterDown,
        ) => Ok(Attempt::RetryLater),
        _ => Err(e),
    }
}

/// One master: its pool, and until when it counts as unreachable.
pub(super) struct Node {
    name: String,
    pool: Pool,
    /// Calls fail at once until then instead of waiting for a connection that will not come.
    down_until: Mutex<Option<Instant>>,
}

impl Connect for Node {
    fn heard(&self) -> &Arc<Heard> {
        self.pool.heard()
    }

    async fn connect(&self) -> Result<Connection, StoreError> {
        {
            let mut down = lock(&self.down_until);
            match *down {
                Some(until) if until > Instant::now() => {
                    return Err(StoreError::Unavailable(format!(
                        "{}: unreachable",
                        self.name
                    )));
                }
                Some(_) => *down = None,
                None => {}
            }
        }
        // A node that refuses fails the checkout at once; one that does not answer the connect
        // would hold it for the whole connection timeout, and a checkout that takes this long
        // means the node is gone (connections are shared, so a live node hands one out
        // immediately).
        let checkout = tokio::time::timeout(CHECKOUT_WAIT, checkout(&self.pool)).await;
        let why = match checkout {
            Ok(Ok(connection)) => return Ok(connection),
            Ok(Err(StoreError::Unavailable(why))) => why,
            Ok(Err(other)) => other.to_string(),
            Err(_) => "no connection".to_string(),
        };
        *lock(&self.down_until) = Some(Instant::now() + DOWN_FOR);
        Err(StoreError::Unavailable(format!("{}: {why}", self.name)))
    }
}

/// Builds the slot map from a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id], replicas…], …]`.
/// An empty host means "the node you asked".
fn parse_slots(reply: &Value, asked: &str) -> Result<Topology, StoreError> {
    let bad = || StoreError::Protocol("malformed CLUSTER SLOTS reply".into());
    let Value::Array(ranges) = reply else {
        return Err(bad());
    };
    let asked_host = asked.rsplit_once(':').map_or(asked, |(h, _)| h);
    let mut topology = Topology {
        owner: vec![None; usize::from(SLOTS)],
        masters: Vec::new(),
    };
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(bad());
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return Err(bad());
        };
        let host = match master.first() {
            Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
            Some(Value::SimpleString(h)) => h.clone(),
            _ => return Err(bad()),
        };
        let host = if host.is_empty() || host == "?" {
            asked_host.to_string()
        } else {
            host
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return Err(bad());
        };
        let node = format!("{host}:{port}");
        let index = match topology.masters.iter().position(|m| *m == node) {
            Some(i) => i,
            None => {
                topology.masters.push(node);
                topology.masters.len() - 1
            }
        };
        let (start, end) = (*start as usize, *end as usize);
        if start > end || end >= usize::from(SLOTS) {
            return Err(bad());
        }
        for owner in &mut topology.owner[start..=end] {
            *owner = Some(index);
        }
    }
    Ok(topology)
}

/// Logs at debug level what became of one try on `node`.
fn log_attempt<T>(slot: u16, node: &str, attempt: &Attempt<T>) {
    match &attempt {
        Attempt::Done(_) => {}
        Attempt::Moved(to) => tracing::debug!(slot, node, to, "MOVED"),
        Attempt::Ask(to) => tracing::debug!(slot, node, to, "ASK"),
        Attempt::RetryLater => tracing::debug!(slot, node, "cluster asked to retry"),
        Attempt::Unreachable(e) => {
            tracing::debug!(slot, node, error = %e, "node unreachable")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn parses_cluster_slots() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("", 7001)]),
        ]);
        let t = parse_slots(&reply, "10.0.0.9:7001").unwrap();
        assert_eq!(t.masters, ["10.0.0.1:7000", "10.0.0.9:7001"]);
        assert_eq!(t.owner[0], Some(0));
        assert_eq!(t.owner[5460], Some(0));
        assert_eq!(t.owner[5461], Some(1));
        assert_eq!(t.owner[16383], Some(1));
        assert!(parse_slots(&Value::Int(1), "x:1").is_err());
    }
}
