//! Coalescing: the calls of concurrent requests leave in one pipelined write.
//!
//! Profiling the Redis path showed Sluice spending its CPU on syscalls rather than on deciding:
//! every `EVALSHA` went out in its own `writev` (which, on a loopback or a busy host, also pays for
//! waking Redis), and every reply came back as its own wake-up. Requests therefore hand their
//! command to one batcher task and wait for their own reply. Once woken, the batcher yields to
//! the runtime a single time, so that every request that is ready to run can queue its command
//! first, and then sends everything queued as one pipeline on one pooled connection. Nothing waits
//! on a timer: under load a batch holds whatever piled up meanwhile. A call that starts while no
//! other is in flight has nothing to share a write with, and goes out at once by itself.
//!
//! Redis runs a pipeline's commands one after another, each script atomically, so a script sees
//! exactly what it would have seen had its command been sent alone; each reply, error or not,
//! belongs to its own command. A call is usually one command (a script call); a decision made of
//! plain commands (`plain.rs`: `INCRBY` and `PEXPIRE` per check) is one call of several, which
//! stay together in the batch's write and come back as that call's replies, in order.
//!
//! A batch's calls of one lean script then go as one call (`merge.rs`; on a cluster node one that
//! takes its keys across slots), which replies to each as its call alone would have been
//! answered.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisError, ServerErrorKind, Value};
use tokio::sync::{mpsc, oneshot};

use super::conn::{Connection, Pool, checkout, fail, retire_if_broken};
use super::merge;
use super::script::{self, Keys};
use super::wire::{Heard, Watch};
use crate::store::StoreError;

/// Commands per pipeline at most, so one write stays a few kilobytes to a few hundred.
const MAX_BATCH: usize = 256;

/// Where a batch gets its connection: a pool (one server), or a cluster node.
pub(super) trait Connect: Send + Sync + 'static {
    fn connect(&self) -> impl Future<Output = Result<Connection, StoreError>> + Send;

    /// What the server has been told and has said, over all its connections (see `Watch`).
    fn heard(&self) -> &Arc<Heard>;
}

impl Connect for Pool {
    fn connect(&self) -> impl Future<Output = Result<Connection, StoreError>> + Send {
        checkout(self)
    }

    fn heard(&self) -> &Arc<Heard> {
        Pool::heard(self)
    }
}

/// Why a call has no reply. The difference matters to a cluster, which may send a call that was
/// never sent to another node, but must not resend one that may have run.
#[derive(Debug, Clone)]
pub(super) enum CallError {
    /// No connection could be had: the command was not sent.
    NotSent(StoreError),
    /// The connection failed with the command on it: the script may have run.
    Lost(StoreError),
}

impl From<CallError> for StoreError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::NotSent(e) | CallError::Lost(e) => e,
        }
    }
}

/// The batcher of the connections to one Redis server.
pub(super) struct Coalescer<C: Connect> {
    source: Arc<C>,
    /// Started on first use, because the task needs the runtime that serves the requests.
    queue: OnceLock<mpsc::UnboundedSender<Call>>,
    /// Calls between their start and their reply.
    in_flight: AtomicUsize,
    /// Calls and pipelines sent so far, for [`PipelineCounts`].
    counts: Arc<Counts>,
    /// How a batch's calls of one lean script go as one call (`merge.rs`): their keys declared
    /// on one server, across slots on a cluster node.
    merging: Keys,
}

/// How deep the pipelines are: calls sent (a script call, or one decision's plain commands),
/// and the pipelined writes they left in (a call that goes alone is a pipeline of one). Read by the benchmark; calls ÷ pipelines is the
/// batch depth the coalescer achieves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipelineCounts {
    /// Calls sent.
    pub calls: u64,
    /// Pipelined writes they went out in.
    pub pipelines: u64,
}

impl std::ops::AddAssign for PipelineCounts {
    fn add_assign(&mut self, other: Self) {
        self.calls += other.calls;
        self.pipelines += other.pipelines;
    }
}

#[derive(Default)]
struct Counts {
    calls: AtomicU64,
    pipelines: AtomicU64,
}

impl Counts {
    fn sent(&self, calls: usize) {
        self.calls.fetch_add(calls as u64, Ordering::Relaxed);
        self.pipelines.fetch_add(1, Ordering::Relaxed);
    }
}

struct Call {
    /// One or more commands, sent one after another in the same write.
    cmds: Vec<Cmd>,
    /// Their replies, one per command, or why there are none.
    reply: oneshot::Sender<Result<Vec<Value>, CallError>>,
    /// The caller's watch: told which connection the call was written to.
    watch: Option<Watch>,
}

impl<C: Connect> Coalescer<C> {
    /// The batcher of `source`'s connections, merging calls with their keys laid out as
    /// `merging` says.
    pub(super) fn new(source: C, merging: Keys) -> Self {
        Self {
            source: Arc::new(source),
            queue: OnceLock::new(),
            in_flight: AtomicUsize::new(0),
            counts: Arc::default(),
            merging,
        }
    }

    pub(super) fn counts(&self) -> PipelineCounts {
        PipelineCounts {
            calls: self.counts.calls.load(Ordering::Relaxed),
            pipelines: self.counts.pipelines.load(Ordering::Relaxed),
        }
    }

    pub(super) fn source(&self) -> &C {
        &self.source
    }

    /// Sends a script call (`EVALSHA`) in the next batch and waits for its reply, which may be
    /// an error reply (`Value::ServerError`). A script that Redis has forgotten is loaded again
    /// and the call resent, so callers never see `NOSCRIPT`.
    pub(super) async fn call(&self, cmd: Cmd) -> Result<Value, CallError> {
        let mut replies = self.call_all(vec![cmd]).await?;
        Ok(replies.pop().expect("one reply per command"))
    }

    /// Sends `cmds` one after another in the next batch and waits for their replies, one per
    /// command, each of which may be an error reply. If the connection fails, the whole call is
    /// [`CallError::Lost`]: some of the commands may have run.
    pub(super) async fn call_all(&self, cmds: Vec<Cmd>) -> Result<Vec<Value>, CallError> {
        let entered = InFlight::enter(&self.in_flight);
        if entered.alone {
            // Nothing to share a write with: send at once, without the two task hops (batcher,
            // sender) that a batch costs. This keeps an idle service's latency what it was.
            let mut pipe = Pipeline::with_capacity(cmds.len());
            for cmd in cmds {
                pipe.add_command(cmd);
            }
            self.counts.sent(1);
            let watch = Watch::current();
            let answers = exchange(&*self.source, &pipe, watch.as_slice()).await;
            return answers.into_iter().collect();
        }
        let queue = self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            let batches = Batches {
                source: self.source.clone(),
                counts: self.counts.clone(),
                merging: self.merging,
            };
            tokio::spawn(batcher(batches, receiver));
            sender
        });
        let (reply, answer) = oneshot::channel();
        queue
            .send(Call {
                cmds,
                reply,
                watch: Watch::current(),
            })
            .map_err(|_| CallError::NotSent(StoreError::Unavailable("batcher stopped".into())))?;
        // No answer means the sending task was dropped (the runtime is stopping) and the call may
        // have reached Redis, so it counts as lost: a cluster must not send it elsewhere.
        answer.await.map_err(|_| {
            CallError::Lost(StoreError::Unavailable(
                "the call was abandoned without an answer".into(),
            ))
        })?
    }
}

/// What the batcher task needs of its [`Coalescer`].
struct Batches<C> {
    source: Arc<C>,
    counts: Arc<Counts>,
    merging: Keys,
}

/// Gathers queued calls into batches until every sender is gone (the store was dropped).
async fn batcher<C: Connect>(batches: Batches<C>, mut queue: mpsc::UnboundedReceiver<Call>) {
    while let Some(first) = queue.recv().await {
        // Requests woken together run before this task does again; their commands join the batch.
        tokio::task::yield_now().await;
        let mut batch = Vec::with_capacity(queue.len().min(MAX_BATCH) + 1);
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(call) => batch.push(call),
                Err(_) => break,
            }
        }
        batches.counts.sent(batch.len());
        // Sent from its own task so that a slow reply (or connect) never holds up the next batch.
        tokio::spawn(send(batches.source.clone(), batch, batches.merging));
    }
}

/// Sends one batch as a pipeline and hands each caller its replies; the calls [`merge::plan`]
/// groups go as one command each, with their keys laid out as `merging` says.
async fn send<C: Connect>(source: Arc<C>, batch: Vec<Call>, merging: Keys) {
    let plan = if batch.len() > 1 {
        let calls: Vec<&[Cmd]> = batch.iter().map(|call| call.cmds.as_slice()).collect();
        merge::plan(&calls)
    } else {
        None
    };
    match plan {
        Some(groups) => send_merged(source, batch, groups, merging).await,
        None => send_as_they_are(source, batch).await,
    }
}

/// Sends one batch as a pipeline, the calls of each of `groups` as one merged command (a group
/// of one as it is), and hands each caller its replies. The calls of a merged command that a
/// cluster node refused before running it ([`merge::split`]) go again as they were, one each.
async fn send_merged<C: Connect>(
    source: Arc<C>,
    batch: Vec<Call>,
    groups: Vec<Vec<usize>>,
    keys: Keys,
) {
    let commands = batch.iter().map(|call| call.cmds.len()).sum();
    let mut pipe = Pipeline::with_capacity(commands);
    let mut watches = Vec::new();
    // Each caller's reply sender and how many commands it sent.
    let mut callers = Vec::with_capacity(batch.len());
    let mut cmds = Vec::with_capacity(batch.len());
    for call in batch {
        callers.push(Some((call.reply, call.cmds.len())));
        cmds.push(call.cmds);
        watches.extend(call.watch);
    }
    for group in &groups {
        if let [index] = group[..] {
            for cmd in std::mem::take(&mut cmds[index]) {
                pipe.add_command(cmd);
            }
        } else {
            let merged: Vec<&Cmd> = group.iter().map(|&i| &cmds[i][0]).collect();
            pipe.add_command(merge::merge(&merged, keys));
        }
    }
    let mut answers = exchange(&*source, &pipe, &watches).await.into_iter();
    // The calls of refused merged commands, to send again one each.
    let mut again = Vec::new();
    for group in groups {
        let mut take = |index: usize| callers[index].take().expect("each call in one group");
        if let [index] = group[..] {
            let (reply, commands) = take(index);
            // Taken whole before judging, so an error cannot leave this call's replies to the
            // next.
            let mine: Vec<_> = answers.by_ref().take(commands).collect();
            // A caller that gave up (deadline) has dropped its receiver; its answer is discarded.
            let _ = reply.send(mine.into_iter().collect());
            continue;
        }
        let answer = answers.next().expect("one answer per command");
        let mut replies: Box<dyn Iterator<Item = Result<Value, CallError>> + Send> = match answer {
            Ok(value) => match merge::split(value, group.len()) {
                Some(replies) => Box::new(replies.into_iter().map(Ok)),
                None => {
                    again.extend(group);
                    continue;
                }
            },
            Err(e) => Box::new(std::iter::repeat(Err(e))),
        };
        for index in group {
            let reply = replies.next().expect("one reply per merged call");
            let _ = take(index).0.send(reply.map(|value| vec![value]));
        }
    }
    if again.is_empty() {
        return;
    }
    tracing::debug!(
        calls = again.len(),
        "a node refused merged calls; sending them one each"
    );
    let mut pipe = Pipeline::with_capacity(again.len());
    for &index in &again {
        pipe.add_command(std::mem::take(&mut cmds[index]).remove(0));
    }
    let answers = exchange(&*source, &pipe, &watches).await;
    for (index, answer) in again.into_iter().zip(answers) {
        let (reply, _) = callers[index].take().expect("each call answered once");
        let _ = reply.send(answer.map(|value| vec![value]));
    }
}

/// Sends one batch as a pipeline, each call's commands as they are, and hands each caller its
/// replies.
async fn send_as_they_are<C: Connect>(source: Arc<C>, batch: Vec<Call>) {
    let commands = batch.iter().map(|call| call.cmds.len()).sum();
    let mut pipe = Pipeline::with_capacity(commands);
    // Each caller and how many of the pipeline's replies are its.
    let mut replies = Vec::with_capacity(batch.len());
    let mut watches = Vec::new();
    for call in batch {
        replies.push((call.reply, call.cmds.len()));
        for cmd in call.cmds {
            pipe.add_command(cmd);
        }
        watches.extend(call.watch);
    }
    let mut answers = exchange(&*source, &pipe, &watches).await.into_iter();
    for (reply, commands) in replies {
        // Taken whole before judging, so an error cannot leave this call's replies to the next.
        let mine: Vec<_> = answers.by_ref().take(commands).collect();
        // A caller that gave up (deadline) has dropped its receiver; its answer is discarded.
        let _ = reply.send(mine.into_iter().collect());
    }
}

/// Sends `pipe` on a connection from `source`: one answer per command, in order. Each of
/// `watches` learns the server before the call waits on it for a connection.
async fn exchange<C: Connect>(
    source: &C,
    pipe: &Pipeline,
    watches: &[Watch],
) -> Vec<Result<Value, CallError>> {
    for watch in watches {
        watch.waits_on(source.heard());
    }
    let conn = source.connect().await;
    match conn {
        Ok(mut conn) => match send_on(&mut conn, pipe).await {
            Ok(values) => values
                .into_iter()
                .map(|value| {
                    if let Value::ServerError(e) = &value {
                        retire_if_broken(&conn, &RedisError::from(e.clone()));
                    }
                    Ok(value)
                })
                .collect(),
            Err(e) => {
                let e = fail(&conn, e);
                (0..pipe.len())
                    .map(|_| Err(CallError::Lost(e.clone())))
                    .collect()
            }
        },
        Err(e) => (0..pipe.len())
            .map(|_| Err(CallError::NotSent(e.clone())))
            .collect(),
    }
}

/// Counts a call as in flight until it is dropped (answered, or abandoned at its deadline).
struct InFlight<'a> {
    count: &'a AtomicUsize,
    /// No other call was in flight when this one started.
    alone: bool,
}

impl<'a> InFlight<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        let alone = count.fetch_add(1, Ordering::Relaxed) == 0;
        Self { count, alone }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Sends `pipe` on `conn`: its replies, one per command. Commands whose script Redis had forgotten
/// (restart, failover, `SCRIPT FLUSH`) did not run; the scripts are loaded again, all in one
/// pipeline, and only those commands are sent a second time, up to [`NOSCRIPT_ROUNDS`] times
/// (another flush may land between the load and the resend). The one place that recovers from
/// `NOSCRIPT`.
pub(super) async fn send_on(
    conn: &mut Connection,
    pipe: &Pipeline,
) -> redis::RedisResult<Vec<Value>> {
    let mut values = conn.redis.req_packed_commands(pipe, 0, pipe.len()).await?;
    let cmds: Vec<&Cmd> = pipe.cmd_iter().collect();
    for _ in 0..NOSCRIPT_ROUNDS {
        let lost: Vec<usize> = (0..values.len())
            .filter(|&i| is_noscript(&values[i]))
            .collect();
        if lost.is_empty() {
            break;
        }
        tracing::info!("redis lost a script; loading it again");
        let scripts = script::all();
        let mut loads = Pipeline::with_capacity(scripts.len());
        for script in &scripts {
            loads.cmd("SCRIPT").arg("LOAD").arg(script.source.as_str());
        }
        for reply in conn
            .redis
            .req_packed_commands(&loads, 0, scripts.len())
            .await?
        {
            if let Value::ServerError(e) = reply {
                return Err(e.into());
            }
        }
        let mut again = Pipeline::with_capacity(lost.len());
        for &i in &lost {
            again.add_command(cmds[i].clone());
        }
        let resent = conn
            .redis
            .req_packed_commands(&again, 0, lost.len())
            .await?;
        for (i, value) in lost.into_iter().zip(resent) {
            values[i] = value;
        }
    }
    Ok(values)
}

/// Loads and resends after `NOSCRIPT` at most this many times per pipeline.
const NOSCRIPT_ROUNDS: usize = 3;

fn is_noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}
