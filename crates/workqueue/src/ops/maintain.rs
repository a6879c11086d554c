//! SWEEP: the upkeep any replica may run (promote due items, reap expired leases), shard by
//! shard, each shard marked in the index afterwards (which also repairs a mark lost to a crash
//! between a script and its MARK).

use redis::Value;

use crate::WqError;
use crate::keys::queue_prelude;
use crate::lua::Lua;
use crate::lua::argv;
use crate::lua::queue_fns;
use crate::reply::{Fields, Reply};
use crate::store::{Store, SweepResult};

/// KEYS: the [`QueueKeys`] of one shard.
/// ARGV[1] -> promote_limit, ARGV[2] -> reap_limit, ARGV[3] -> poison_after, ARGV[4] ->
/// base_ms, ARGV[5] -> max_ms.
/// Reply: [`ShardSweep`] `{promoted, reaped, next_due, now, poisoned, wake_at, woke}`.
const SWEEP: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local promoted, readied = promote(tonumber(ARGV[1]))
local reaped, poisoned = reap(tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
if readied + reaped - poisoned > 0 then wake() end
return {promoted, reaped, next_due(), now, poisoned, wake_at(), woke}
"#
);

static SWEEP_SCRIPT: Lua = Lua::new("sweep", SWEEP);

/// SWEEP's reply: one shard's part of a [`SweepResult`], and its mark.
struct ShardSweep {
    result: SweepResult,
    wake_at: i64,
    woke: bool,
}

impl Reply for ShardSweep {
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError> {
        let mut f = Fields::new(what, v)?;
        let result = SweepResult {
            promoted: f.count("promoted")?,
            reaped: f.count("reaped")?,
            next_due_ms: f.opt("next_due")?,
            now_ms: f.int("now")?,
            poisoned: f.count("poisoned")?,
        };
        Ok(Self { result, wake_at: f.int("wake_at")?, woke: f.flag("woke")? })
    }
}

impl Store {
    /// Promotes due delayed items and reaps expired leases in every shard (each atomic; safe
    /// from any replica), marking each shard in the index.
    pub async fn sweep(&self, queue: &str) -> Result<SweepResult, WqError> {
        let c = self.config();
        let calls = (0..self.layout().shards()).map(|shard| {
            let args =
                argv![c.promote_limit, c.reap_limit, c.poison_after, c.limiter.base, c.limiter.max];
            async move {
                let keys = self.queue_keys(queue, shard).to_vec();
                let r: ShardSweep = self.run(&SWEEP_SCRIPT, &keys, args).await?;
                self.mark(queue, shard, r.wake_at, r.woke).await?;
                Ok::<_, WqError>(r.result)
            }
        });
        let mut out =
            SweepResult { promoted: 0, reaped: 0, poisoned: 0, next_due_ms: None, now_ms: 0 };
        for r in futures::future::join_all(calls).await {
            let r = r?;
            out.promoted += r.promoted;
            out.reaped += r.reaped;
            out.poisoned += r.poisoned;
            out.now_ms = out.now_ms.max(r.now_ms);
            out.next_due_ms = match (out.next_due_ms, r.next_due_ms) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(out)
    }
}
