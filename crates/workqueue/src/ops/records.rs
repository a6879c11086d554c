//! Per-Job records: small named blobs a worker keeps beside the expectations (the backoff
//! record), each with an optional expiry checked on read.

use std::time::Duration;

use crate::WqError;
use crate::keys::exp_prelude;
use crate::lua::Lua;
use crate::lua::argv;
use crate::store::Store;

/// KEYS: the [`ExpKeys`](crate::keys::ExpKeys).
/// ARGV[1] -> name.
/// Reply: the value, or nil when absent or expired (expired records are removed on read).
const GET: &str = concat!(
    exp_prelude!(),
    r#"
local v = redis.call('HGET', REC, ARGV[1])
if not v then return false end
local sep = string.find(v, '|', 1, true)
local expiry = tonumber(string.sub(v, 1, sep - 1))
if expiry > 0 and expiry <= now then
  redis.call('HDEL', REC, ARGV[1])
  return false
end
return string.sub(v, sep + 1)
"#
);

static GET_SCRIPT: Lua = Lua::new("get_record", GET);

impl Store {
    /// Reads record `name` of Job `key` (`None` if absent or expired).
    pub async fn get_record(&self, key: &str, name: &str) -> Result<Option<Vec<u8>>, WqError> {
        let keys = self.exp_keys(key).to_vec();
        let args = argv![name];
        self.run(&GET_SCRIPT, &keys, args).await
    }
}

/// Most records one Job keeps. kjob keeps one (the backoff record), and a view read returns at
/// most 16; without a cap one caller could store any number of 64 KiB records under one Job.
pub const MAX_RECORDS_PER_JOB: usize = 16;

/// KEYS: the [`ExpKeys`](crate::keys::ExpKeys).
/// ARGV[1] -> name, ARGV[2] -> ttl_ms (0 = none), ARGV[3] -> gc_ms, ARGV[4] -> value,
/// ARGV[5] -> most records of one Job.
/// Reply: 1, or 0 (nothing written) when the name is new and the Job has the most records.
const PUT: &str = concat!(
    exp_prelude!(),
    r#"
if not redis.call('HGET', REC, ARGV[1]) and redis.call('HLEN', REC) >= tonumber(ARGV[5]) then
  return 0
end
local ttl = tonumber(ARGV[2])
local expiry = 0
if ttl > 0 then expiry = now + ttl end
redis.call('HSET', REC, ARGV[1], expiry .. '|' .. ARGV[4])
redis.call('PEXPIRE', REC, ARGV[3])
return 1
"#
);

static PUT_SCRIPT: Lua = Lua::new("put_record", PUT);

impl Store {
    /// Writes record `name` of Job `key`, expiring after `ttl` if given; `false` (nothing
    /// written) when `name` is new and the Job already has [`MAX_RECORDS_PER_JOB`] records.
    pub async fn put_record(
        &self,
        key: &str,
        name: &str,
        value: &[u8],
        ttl: Option<Duration>,
    ) -> Result<bool, WqError> {
        let ttl = ttl.unwrap_or(Duration::ZERO);
        let args = argv![name, ttl, self.config().idle_gc, value, MAX_RECORDS_PER_JOB];
        let keys = self.exp_keys(key).to_vec();
        let stored: i64 = self.run(&PUT_SCRIPT, &keys, args).await?;
        Ok(stored == 1)
    }
}

/// KEYS: the [`ExpKeys`](crate::keys::ExpKeys).
/// ARGV[1] -> name.
/// Reply: 1 if the record existed, else 0.
const DELETE: &str = concat!(
    exp_prelude!(),
    r#"
return redis.call('HDEL', REC, ARGV[1])
"#
);

static DELETE_SCRIPT: Lua = Lua::new("delete_record", DELETE);

impl Store {
    /// Removes record `name` of Job `key`; whether it existed.
    pub async fn delete_record(&self, key: &str, name: &str) -> Result<bool, WqError> {
        let keys = self.exp_keys(key).to_vec();
        self.run(&DELETE_SCRIPT, &keys, argv![name]).await
    }
}
