//! SWEEP and REWAKE: the upkeep any replica may run (promote due items, reap expired leases,
//! hand a wake marker on).

use redis::Value;

use crate::WqError;
use crate::keys::{QueueKeys, queue_prelude};
use crate::lua::Lua;
use crate::lua::argv;
use crate::lua::queue_fns;
use crate::reply::{Fields, Reply};
use crate::store::{Store, SweepResult};

/// KEYS: the [`QueueKeys`].
/// ARGV[1] -> promote_limit, ARGV[2] -> reap_limit, ARGV[3] -> poison_after, ARGV[4] ->
/// base_ms, ARGV[5] -> max_ms.
/// Reply: [`SweepResult`] `{promoted, reaped, next_due, now, poisoned}`.
const SWEEP: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local promoted, readied = promote(tonumber(ARGV[1]))
local reaped, poisoned = reap(tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
if readied + reaped - poisoned > 0 then wake() end
return {promoted, reaped, next_due(), now, poisoned}
"#
);

static SWEEP_SCRIPT: Lua = Lua::new("sweep", SWEEP);

impl Reply for SweepResult {
    fn read(what: &'static str, v: &Value) -> Result<Self, WqError> {
        let mut f = Fields::new(what, v)?;
        Ok(Self {
            promoted: f.count("promoted")?,
            reaped: f.count("reaped")?,
            next_due_ms: f.opt("next_due")?,
            now_ms: f.int("now")?,
            poisoned: f.count("poisoned")?,
        })
    }
}

impl Store {
    /// Promotes due delayed items and reaps expired leases (atomic; safe from any replica).
    pub async fn sweep(&self, queue: &str) -> Result<SweepResult, WqError> {
        let c = self.config();
        let args =
            argv![c.promote_limit, c.reap_limit, c.poison_after, c.limiter.base, c.limiter.max];
        self.run(&SWEEP_SCRIPT, &QueueKeys::new(queue).to_vec(), args).await
    }
}

/// KEYS[1] -> the queue's ready ZSET, KEYS[2] -> its wake LIST (of the [`QueueKeys`]).
/// Reply: 0. Re-pushes the wake marker when items are ready and none is there (a replica popped
/// it but its waiters had already gone).
const REWAKE: &str = r#"
if redis.call('ZCARD', KEYS[1]) > 0 and redis.call('LLEN', KEYS[2]) == 0 then
  redis.call('RPUSH', KEYS[2], '1')
end
return 0
"#;

static REWAKE_SCRIPT: Lua = Lua::new("rewake", REWAKE);

impl Store {
    /// Re-pushes the wake marker of `queue` if items are ready.
    pub async fn rewake(&self, queue: &str) -> Result<(), WqError> {
        let QueueKeys { ready, wake, .. } = QueueKeys::new(queue);
        self.run(&REWAKE_SCRIPT, &[ready, wake], Vec::new()).await
    }
}
