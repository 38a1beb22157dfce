//! The named limiters' operations on Redis ([`LimiterStore`] for [`RedisStore`]): each one call
//! of `lua/limiter.lua` (or `lua/registry.lua`) through the store's batcher, and its reply read
//! back. Apart from `mod.rs` because they are the native API's, not the Envoy path's.

use super::script::{REGISTRY, REPLY_PER_CHECK, RecordFields, decode, parse_record};
use super::{RedisStore, script, slot};
use crate::store::{
    Acquisition, Call, Lease, LimiterKeys, LimiterRecord, LimiterSet, LimiterStore, RegistryOp,
    RegistryReply, Release, SetMode, StoreError, StoreFuture,
};

impl LimiterStore for RedisStore {
    fn set_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        record: &'a LimiterRecord,
        mode: SetMode,
    ) -> StoreFuture<'a, LimiterSet> {
        self.bounded(call, async move {
            let mode = match mode {
                SetMode::TrySet => "try",
                SetMode::UpdateKeepState => "keep",
                SetMode::UpdateResetState => "reset",
            };
            let (applied, state_reset, fields): (i64, i64, RecordFields) = self
                .limiter_op(keys, "set", |cmd| {
                    cmd.arg(mode)
                        .arg(script::rule_name(&record.rule))
                        .arg(&script::stored_args(&record.rule)[..])
                        .arg(record.capacity)
                        .arg(u8::from(record.per_client))
                        .arg(&record.description[..]);
                })
                .await?;
            let current = parse_record(fields)?
                .ok_or_else(|| StoreError::Protocol("limiter missing after set".into()))?;
            Ok(LimiterSet {
                applied: applied == 1,
                state_reset: state_reset == 1,
                current,
            })
        })
    }

    fn get_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, Option<LimiterRecord>> {
        self.bounded(call, async move {
            let fields: RecordFields = self.limiter_op(keys, "get", |_| {}).await?;
            parse_record(fields)
        })
    }

    fn delete_limiter<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
    ) -> StoreFuture<'a, bool> {
        self.bounded(call, async move {
            let existed: i64 = self.limiter_op(keys, "delete", |_| {}).await?;
            Ok(existed == 1)
        })
    }

    fn acquire<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        permits: u64,
        max_clients: u64,
    ) -> StoreFuture<'a, Acquisition> {
        self.bounded(call, async move {
            let reply: Vec<i64> = self
                .limiter_op(keys, "acquire", |cmd| {
                    cmd.arg(permits).arg(max_clients).arg(&keys.client_id);
                })
                .await?;
            match reply.as_slice() {
                [] => Ok(Acquisition::NoSuchLimiter),
                [-1] => Ok(Acquisition::NeedsClient),
                [-2, capacity] => Ok(Acquisition::TooManyPermits {
                    capacity: u64::try_from(*capacity).unwrap_or(0),
                }),
                [-3, max] => Ok(Acquisition::TooManyClients {
                    max: u64::try_from(*max).unwrap_or(0),
                }),
                [decision @ .., capacity, per_client, lease_at]
                    if decision.len() == REPLY_PER_CHECK =>
                {
                    Ok(Acquisition::Decided {
                        outcome: decode(decision, 1)?[0],
                        capacity: u64::try_from(*capacity).unwrap_or(0),
                        per_client: *per_client == 1,
                        lease: u64::try_from(*lease_at).ok().filter(|&at| at > 0),
                    })
                }
                other => Err(StoreError::Protocol(format!("acquire replied {other:?}"))),
            }
        })
    }

    fn release<'a>(
        &'a self,
        call: Call<'a>,
        keys: &'a LimiterKeys,
        lease: Lease,
    ) -> StoreFuture<'a, Release> {
        self.bounded(call, async move {
            let reply: Vec<i64> = self
                .limiter_op(keys, "release", |cmd| {
                    cmd.arg(lease.expiry).arg(lease.permits);
                })
                .await?;
            let count = |n: i64| u64::try_from(n).unwrap_or(0);
            match reply.as_slice() {
                [] => Ok(Release::NoSuchLimiter),
                [-1] => Ok(Release::NeedsClient),
                [-4] => Ok(Release::NotLeases),
                [given_back, remaining] => Ok(Release::Released {
                    given_back: count(*given_back),
                    remaining: count(*remaining),
                }),
                other => Err(StoreError::Protocol(format!("release replied {other:?}"))),
            }
        })
    }

    fn registry<'a>(
        &'a self,
        call: Call<'a>,
        key: &'a str,
        op: RegistryOp<'a>,
    ) -> StoreFuture<'a, RegistryReply> {
        self.bounded(call, async move {
            let slot = slot::slot(key.as_bytes());
            let args = |cmd: &mut redis::Cmd, pinned: Option<u64>| {
                cmd.arg(1)
                    .arg(key)
                    .arg(pinned.map_or(String::new(), |t| t.to_string()));
            };
            match op {
                RegistryOp::Touch { name, idle_ms, max } => {
                    let registered: i64 = self
                        .eval(slot, &REGISTRY, (0, 0), |cmd, pinned| {
                            args(cmd, pinned);
                            cmd.arg("touch").arg(name).arg(idle_ms).arg(max);
                        })
                        .await?;
                    Ok(RegistryReply::Touched(registered == 1))
                }
                RegistryOp::TakeExpired { at_most } => {
                    let names: Vec<String> = self
                        .eval(slot, &REGISTRY, (0, 0), |cmd, pinned| {
                            args(cmd, pinned);
                            cmd.arg("expired").arg(at_most);
                        })
                        .await?;
                    Ok(RegistryReply::Expired(names))
                }
                RegistryOp::Remove { name } => {
                    let _: i64 = self
                        .eval(slot, &REGISTRY, (0, 0), |cmd, pinned| {
                            args(cmd, pinned);
                            cmd.arg("remove").arg(name);
                        })
                        .await?;
                    Ok(RegistryReply::Removed)
                }
            }
        })
    }
}
