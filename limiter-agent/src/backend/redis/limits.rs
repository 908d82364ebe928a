//! Bucket state in the fleet's Redis (`proxy.store = "redis"`): limits that hold
//! across every agent sharing the server.
//!
//! Each step of the [`MemoryStore::apply`](limiter_core::limits::MemoryStore::apply)
//! contract (check every bucket, then charge) is one script call, so one atomic round
//! trip: the script (`apply.lua` after one
//! file per algorithm, loaded once and called by its SHA, reloaded when the server
//! answers NOSCRIPT) runs the same arithmetic as the in-memory algorithms, which stay
//! the reference. Differences, all deliberate:
//!
//! - Time is the server's (`TIME`), so hosts with skewed clocks agree; it has
//!   microsecond resolution, which every configurable window (whole milliseconds)
//!   divides.
//! - A bucket's key expires when the bucket is back to full (after a refund, when it
//!   would have been without it), as a missing bucket is full: Redis holds only live
//!   state, and `max_tracked_keys` does not apply.
//! - Lua counts in doubles, so the config refuses a redis-stored limit whose
//!   `limit × window` or `capacity × window` would pass 2^53 units
//!   (`LimitSpec::check_exact_in_doubles`); below that the arithmetic is exact.
//!
//! - A calendar window (`window = "month"`) is found among the boundaries the agent
//!   works out in its zone around its own clock (the script has no tz database); its
//!   state's window is its start, in µs.
//! - A refund is a second script (`refund.lua`, after the same parts), one round trip
//!   for all of a request's buckets, with the time each charge counted at from the
//!   step's reply (the server's clock again); a post-paid charge is a third
//!   (`debit.lua`).
//! - The sliding window log is a sorted set, so that a step costs O(log limit), not a
//!   read of the whole log (see `sliding_window_log.lua`).
//!
//! Keys are `{prefix}limit:{policy identity}:{bucket key}`, `{prefix}log:…` for the
//! sliding window log: its lists of older versions, under `limit:`, are never read
//! as sorted sets (a script error), and expire by themselves within their window.

use std::time::Duration;

use limiter_core::{
    Algorithm,
    limits::{Bucket, Charge, Debit, Outcome, Outcomes, Quota, Refund},
};
use redis::{Script, ScriptInvocation};

use crate::fleet::{Fleet, FleetError};

/// Shared helpers and one part per algorithm, `$step` after them: a script.
macro_rules! script {
    ($step:literal) => {
        concat!(
            include_str!("prelude.lua"),
            include_str!("gcra.lua"),
            include_str!("fixed_window.lua"),
            include_str!("sliding_window_counter.lua"),
            include_str!("sliding_window_log.lua"),
            include_str!($step),
        )
    };
}

/// Numbers per bucket in the step's reply.
const REPLY_FIELDS: usize = 9;

/// Whose clock a step is measured with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSource {
    /// The Redis server's: what a fleet uses.
    Server,
    /// The `now` given to [`RedisStore::apply`], truncated to the microsecond: for
    /// tests that replay a schedule against both stores.
    Caller,
}

/// Buckets in Redis.
pub struct RedisStore {
    fleet: Fleet,
    script: Script,
    refund: Script,
    debit: Script,
    time: TimeSource,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("fleet", &self.fleet).field("time", &self.time).finish_non_exhaustive()
    }
}

impl RedisStore {
    #[must_use]
    pub fn new(fleet: Fleet, time: TimeSource) -> Self {
        Self {
            fleet,
            script: Script::new(script!("apply.lua")),
            refund: Script::new(script!("refund.lua")),
            debit: Script::new(script!("debit.lua")),
            time,
        }
    }

    /// [`MemoryStore::apply`](limiter_core::limits::MemoryStore::apply) in one round
    /// trip; `now` is used only with [`TimeSource::Caller`].
    pub async fn apply(&self, buckets: &[Bucket<'_>], now: Duration, charge: Charge) -> Result<Outcomes, FleetError> {
        if buckets.is_empty() {
            return Ok(Outcomes::new());
        }
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(match charge {
            Charge::AllOrNothing => "all",
            Charge::EachAdmitting => "each",
            Charge::Nothing => "none",
        });
        invocation.arg(self.time_arg(now));
        for bucket in buckets {
            self.bucket_args(&mut invocation, bucket, now);
        }
        let reply: Vec<i64> =
            self.fleet.call(|mut connection| async move { invocation.invoke_async(&mut connection).await }).await?;
        if reply.len() != buckets.len() * REPLY_FIELDS {
            return Err(FleetError::Reply(format!("{} numbers for {} buckets", reply.len(), buckets.len())));
        }
        Ok(reply.chunks_exact(REPLY_FIELDS).map(outcome).collect())
    }

    /// [`MemoryStore::refund`](limiter_core::limits::MemoryStore::refund) in one round
    /// trip; `now` is used only with [`TimeSource::Caller`]. A bucket's key that expired
    /// meanwhile (it was full) has nothing to give back.
    pub async fn refund(&self, refunds: &[Refund<'_>], now: Duration) -> Result<(), FleetError> {
        let each = refunds.iter().map(|refund| (&refund.bucket, refund.charged_at.as_micros().to_string()));
        let _buckets: Option<i64> = self.each_bucket(&self.refund, each, now).await?;
        Ok(())
    }

    /// [`MemoryStore::debit`](limiter_core::limits::MemoryStore::debit) in one round
    /// trip; `now` is used only with [`TimeSource::Caller`].
    pub async fn debit(&self, debits: &[Debit<'_>], now: Duration) -> Result<Vec<Option<Quota>>, FleetError> {
        let each = debits.iter().map(|debit| (&debit.bucket, debit.units.to_string()));
        let reply: Vec<i64> = self.each_bucket(&self.debit, each, now).await?.unwrap_or_default();
        if reply.len() != debits.len() * 2 {
            return Err(FleetError::Reply(format!("{} numbers for {} debits", reply.len(), debits.len())));
        }
        let number = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(reply
            .chunks_exact(2)
            .map(|q| Some(Quota { remaining: number(q[0]), reset_after: Duration::from_nanos(number(q[1])) }))
            .collect())
    }

    /// Calls `script` on each bucket with the argument beside it, in one round trip,
    /// and returns its reply; `None` for no bucket, without a call.
    async fn each_bucket<'b, T: redis::FromRedisValue>(
        &self,
        script: &Script,
        buckets: impl ExactSizeIterator<Item = (&'b Bucket<'b>, String)>,
        now: Duration,
    ) -> Result<Option<T>, FleetError> {
        if buckets.len() == 0 {
            return Ok(None);
        }
        let mut invocation = script.prepare_invoke();
        invocation.arg(self.time_arg(now));
        for (bucket, argument) in buckets {
            self.bucket_args(&mut invocation, bucket, now);
            invocation.arg(argument);
        }
        let reply: T =
            self.fleet.call(|mut connection| async move { invocation.invoke_async(&mut connection).await }).await?;
        Ok(Some(reply))
    }

    /// The time argument of a script: empty for the server's clock.
    fn time_arg(&self, now: Duration) -> String {
        match self.time {
            TimeSource::Server => String::new(),
            TimeSource::Caller => now.as_micros().to_string(),
        }
    }

    /// A bucket's key, and its spec's arguments; a calendar window's boundaries are
    /// those around `now`, this agent's time (the script finds the server's among them).
    fn bucket_args(&self, invocation: &mut ScriptInvocation<'_>, bucket: &Bucket<'_>, now: Duration) {
        let spec = bucket.spec;
        invocation.key(self.fleet.key(&format!("{}:{}:{}", kind(spec.algorithm), bucket.policy, bucket.key)));
        let shaper = spec.algorithm == Algorithm::LeakyBucket && spec.queue.is_some();
        invocation
            .arg(spec.algorithm.name())
            .arg(spec.limit.get())
            .arg(spec.window_micros())
            .arg(spec.capacity().get())
            .arg(u8::from(shaper))
            .arg(spec.calendar.as_ref().map_or_else(String::new, |calendar| {
                calendar.around(now).map(|bound| bound.as_micros().to_string()).join(" ")
            }))
            .arg(spec.cost.upfront())
            .arg(spec.cost.needed());
    }
}

/// The kind of key a bucket of `algorithm` is.
fn kind(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::SlidingWindowLog => "log",
        _ => "limit",
    }
}

/// One bucket's part of the reply.
fn outcome(fields: &[i64]) -> Outcome {
    let number = |i: usize| fields.get(i).map_or(0, |&v| u64::try_from(v).unwrap_or(0));
    let nanos = |i: usize| Duration::from_nanos(number(i));
    Outcome {
        admitted: number(0) == 1,
        before: Quota { remaining: number(1), reset_after: nanos(2) },
        after: Quota { remaining: number(3), reset_after: nanos(4) },
        retry_after: nanos(5),
        used: number(6),
        wait: nanos(7),
        charged_at: fields.get(8).and_then(|&us| u64::try_from(us).ok()).map(Duration::from_micros),
    }
}
