//! The Lua scripts: one per operation, each atomic across every kjob-queue replica.
//!
//! Every queue script gets the same eleven keys (all under the queue's hash tag, so they live in
//! one Cluster slot):
//! 1 ready ZSET (item → ready time), 2 delayed ZSET (item → due time, written with `ZADD LT`),
//! 3 leases ZSET (item → deadline), 4 dirty SET (leased items added again), 5 addedAt HASH
//! (item → first add time, for queue latency), 6 owner HASH (item → lease id), 7 holder HASH
//! (item → worker id), 8 started ZSET (item → lease start), 9 failures HASH (item → count),
//! 10 stats HASH (sequences and counters), 11 wake LIST (at most one marker).
//!
//! Time always comes from Redis `TIME`, so every replica shares one clock.

/// Shared prelude: `now` in ms, the key names, and the helpers used by several scripts.
macro_rules! prelude {
    () => {
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local READY, DELAYED, LEASES, DIRTY, ADDED = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local OWNER, HOLDER, STARTED, FAILURES = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local STATS, WAKE = KEYS[10], KEYS[11]

-- A durable wake marker: blocked replicas BLPOP it; at most one element.
local function wake()
  if redis.call('LLEN', WAKE) == 0 then redis.call('RPUSH', WAKE, '1') end
end

-- client-go Add at time `at`: a leased item becomes dirty, any other joins ready unless there.
-- Returns 1 when the add was accepted (not a duplicate).
local function add_now(item, at)
  if redis.call('ZSCORE', LEASES, item) then
    if redis.call('SADD', DIRTY, item) == 1 then
      redis.call('HSETNX', ADDED, item, at)
      return 1
    end
    return 0
  end
  if redis.call('ZADD', READY, 'NX', at, item) == 1 then
    redis.call('HSETNX', ADDED, item, at)
    return 1
  end
  return 0
end

-- Moves due delayed items through the Add path. Bounded: a script blocks the whole server.
local function promote(limit)
  local due = redis.call('ZRANGE', DELAYED, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
  local accepted = 0
  for i = 1, #due, 2 do
    redis.call('ZREM', DELAYED, due[i])
    accepted = accepted + add_now(due[i], tonumber(due[i + 1]))
  end
  return accepted
end

-- Puts items whose lease deadline passed back into ready (dirty or not: they need a run).
local function reap(limit)
  local expired = redis.call('ZRANGE', LEASES, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  for _, item in ipairs(expired) do
    redis.call('ZREM', LEASES, item)
    redis.call('HDEL', OWNER, item)
    redis.call('HDEL', HOLDER, item)
    redis.call('ZREM', STARTED, item)
    redis.call('SREM', DIRTY, item)
    redis.call('HSETNX', ADDED, item, now)
    redis.call('ZADD', READY, 'NX', now, item)
  end
  if #expired > 0 then redis.call('HINCRBY', STATS, 'lease_expired_total', #expired) end
  return #expired
end

local function next_due()
  local head = redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')
  if #head == 0 then return -1 end
  return tonumber(head[2])
end

-- AddAfter with delay > 0: earliest wins. Wakes waiters when the head of delayed moved earlier,
-- because their sleep was computed from the old head.
local function add_after(item, delay)
  local due = now + delay
  local head = next_due()
  local changed = redis.call('ZADD', DELAYED, 'LT', 'CH', due, item)
  if changed == 1 and (head < 0 or due < head) then wake() end
  return changed
end
"#
    };
}

/// ARGV: (item, delay_ms)… → `{added, accepted_now, now}`.
pub(crate) const ADD: &str = concat!(
    prelude!(),
    r#"
local added, accepted = 0, 0
for i = 1, #ARGV, 2 do
  local item, delay = ARGV[i], tonumber(ARGV[i + 1])
  if delay <= 0 then
    local a = add_now(item, now)
    added = added + a
    accepted = accepted + a
  else
    added = added + add_after(item, delay)
  end
end
if redis.call('ZCARD', READY) > 0 and accepted > 0 then wake() end
return {added, accepted, now}
"#
);

/// ARGV: worker, n, lease_ms, promote_limit, reap_limit →
/// `{now, next_due, promoted, reaped, {item, lease_id, requeues, deadline, added_at}…}`.
pub(crate) const LEASE: &str = concat!(
    prelude!(),
    r#"
local worker, n, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local promoted = promote(tonumber(ARGV[4]))
local reaped = reap(tonumber(ARGV[5]))
local popped = redis.call('ZPOPMIN', READY, n)
local out = {now, next_due(), promoted, reaped}
for i = 1, #popped, 2 do
  local item = popped[i]
  local seq = redis.call('HINCRBY', STATS, 'lease_seq', 1)
  -- The time part keeps ids unique even if Redis lost the sequence (restart without AOF).
  local id = seq .. '-' .. now
  local deadline = now + lease_ms
  redis.call('ZADD', LEASES, deadline, item)
  redis.call('HSET', OWNER, item, id)
  redis.call('HSET', HOLDER, item, worker)
  redis.call('ZADD', STARTED, now, item)
  redis.call('SREM', DIRTY, item)
  local added = redis.call('HGET', ADDED, item) or popped[i + 1]
  redis.call('HDEL', ADDED, item)
  local req = redis.call('HGET', FAILURES, item) or 0
  table.insert(out, {item, id, tonumber(req), deadline, tonumber(added)})
end
-- Chain the wake-up so another replica's waiters take what is left.
if redis.call('ZCARD', READY) > 0 then wake() end
return out
"#
);

/// ARGV: item, lease_id, lease_ms → new deadline, or -1 for a stale id.
pub(crate) const RENEW: &str = concat!(
    prelude!(),
    r#"
if redis.call('HGET', OWNER, ARGV[1]) ~= ARGV[2] then
  redis.call('HINCRBY', STATS, 'stale_total', 1)
  return -1
end
local deadline = now + tonumber(ARGV[3])
redis.call('ZADD', LEASES, 'XX', deadline, ARGV[1])
return deadline
"#
);

/// ARGV: item, lease_id, outcome (1 forget, 2 rate limited, 3 requeue after), after_ms,
/// base_ms, max_ms → `{work_ms, ready_at (-1 = not requeued), now, delay_used}` or `{-1}` if stale.
pub(crate) const DONE: &str = concat!(
    prelude!(),
    r#"
local item, id, outcome = ARGV[1], ARGV[2], tonumber(ARGV[3])
if redis.call('HGET', OWNER, item) ~= id then
  redis.call('HINCRBY', STATS, 'stale_total', 1)
  return {-1}
end
local started = tonumber(redis.call('ZSCORE', STARTED, item) or now)
redis.call('ZREM', LEASES, item)
redis.call('HDEL', OWNER, item)
redis.call('HDEL', HOLDER, item)
redis.call('ZREM', STARTED, item)
local delay = -1
if outcome == 1 then
  redis.call('HDEL', FAILURES, item)
elseif outcome == 2 then
  -- client-go ItemExponentialFailureRateLimiter: base * 2^(failures before this one), capped.
  local n = redis.call('HINCRBY', FAILURES, item, 1)
  delay = math.min(tonumber(ARGV[5]) * 2 ^ (n - 1), tonumber(ARGV[6]))
elseif outcome == 3 then
  redis.call('HDEL', FAILURES, item)
  delay = tonumber(ARGV[4])
end
local ready_at = -1
local dirty = redis.call('SREM', DIRTY, item) == 1
if dirty or delay == 0 then
  if redis.call('ZADD', READY, 'NX', now, item) == 1 then redis.call('HSETNX', ADDED, item, now) end
  ready_at = now
  wake()
end
if delay > 0 then add_after(item, delay) end
-- A pending AddAfter (ours or an earlier one) also brings the item back.
if ready_at < 0 then ready_at = tonumber(redis.call('ZSCORE', DELAYED, item) or -1) end
return {now - started, ready_at, now, delay}
"#
);

/// ARGV: promote_limit, reap_limit → `{promoted, reaped, next_due, now}`.
pub(crate) const SWEEP: &str = concat!(
    prelude!(),
    r#"
local promoted = promote(tonumber(ARGV[1]))
local reaped = reap(tonumber(ARGV[2]))
if promoted + reaped > 0 then wake() end
return {promoted, reaped, next_due(), now}
"#
);

/// ARGV: max_started (how many lease starts to sum) →
/// `{now, ready, delayed, leased, dirty, oldest_ready, failing, unfinished_ms, oldest_started}`.
pub(crate) const STATS: &str = concat!(
    prelude!(),
    r#"
local oldest = redis.call('ZRANGE', READY, 0, 0, 'WITHSCORES')
local oldest_ready = -1
if #oldest > 0 then oldest_ready = tonumber(oldest[2]) end
local starts = redis.call('ZRANGE', STARTED, 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
local unfinished, oldest_started = 0, -1
for i = 2, #starts, 2 do
  local s = tonumber(starts[i])
  unfinished = unfinished + (now - s)
  if oldest_started < 0 then oldest_started = s end
end
return {now, redis.call('ZCARD', READY), redis.call('ZCARD', DELAYED), redis.call('ZCARD', LEASES),
  redis.call('SCARD', DIRTY), oldest_ready, redis.call('HLEN', FAILURES), unfinished, oldest_started}
"#
);

/// ARGV: items… → per item `{ready, delayed, deadline, dirty, failures, holder}` (-1 / '' = none).
pub(crate) const INSPECT: &str = concat!(
    prelude!(),
    r#"
local out = {}
for _, item in ipairs(ARGV) do
  table.insert(out, {
    tonumber(redis.call('ZSCORE', READY, item) or -1),
    tonumber(redis.call('ZSCORE', DELAYED, item) or -1),
    tonumber(redis.call('ZSCORE', LEASES, item) or -1),
    redis.call('SISMEMBER', DIRTY, item),
    tonumber(redis.call('HGET', FAILURES, item) or 0),
    redis.call('HGET', HOLDER, item) or '',
  })
end
return out
"#
);

/// Re-pushes the wake marker (a replica popped it but its waiters had already gone).
pub(crate) const REWAKE: &str = r#"
if redis.call('ZCARD', KEYS[1]) > 0 and redis.call('LLEN', KEYS[2]) == 0 then
  redis.call('RPUSH', KEYS[2], '1')
end
return 0
"#;

// ---------------------------------------------------------------- expectations
//
// Per Job key K (own hash tag `{exp:K}`): `{exp:K}` HASH uid/add/del/ts, `{exp:K}:seen` SET of
// observed "kind:podUID" (makes a re-sent observation idempotent), `{exp:K}:fin` HASH
// podUID → jobUID (finalizer removals in flight), `{exp:K}:rec` HASH name → "expiry|bytes".

macro_rules! exp_prelude {
    () => {
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local EXP, SEEN, FIN, REC = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
"#
    };
}

/// ARGV: uid, add, del, gc_ms. Replaces the record and stamps the time.
pub(crate) const EXP_SET: &str = concat!(
    exp_prelude!(),
    r#"
redis.call('DEL', EXP, SEEN)
redis.call('HSET', EXP, 'uid', ARGV[1], 'add', ARGV[2], 'del', ARGV[3], 'ts', now)
redis.call('PEXPIRE', EXP, ARGV[4])
return 1
"#
);

/// ARGV: uid, add_delta, del_delta (already negated). Only an existing record of that UID.
pub(crate) const EXP_LOWER: &str = concat!(
    exp_prelude!(),
    r#"
if redis.call('EXISTS', EXP) == 0 then return 0 end
if ARGV[1] ~= '' and redis.call('HGET', EXP, 'uid') ~= ARGV[1] then return 0 end
redis.call('HINCRBY', EXP, 'add', ARGV[2])
redis.call('HINCRBY', EXP, 'del', ARGV[3])
return 1
"#
);

/// → `{exists, uid, add, del, ts, now, {podUID, jobUID}…}`.
pub(crate) const EXP_GET: &str = concat!(
    exp_prelude!(),
    r#"
local fin = redis.call('HGETALL', FIN)
if redis.call('EXISTS', EXP) == 0 then return {0, '', 0, 0, 0, now, fin} end
local r = redis.call('HMGET', EXP, 'uid', 'add', 'del', 'ts')
return {1, r[1] or '', tonumber(r[2] or 0), tonumber(r[3] or 0), tonumber(r[4] or 0), now, fin}
"#
);

/// ARGV: gc_ms, then (kind, job_uid, pod_uid)… with kind 1 creation, 2 deletion, 3 finalizer
/// removal → number of observations that changed something.
pub(crate) const EXP_OBSERVE: &str = concat!(
    exp_prelude!(),
    r#"
local changed = 0
for i = 2, #ARGV, 3 do
  local kind, juid, puid = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2]
  if kind == 3 then
    changed = changed + redis.call('HDEL', FIN, puid)
  elseif redis.call('EXISTS', EXP) == 1 and (juid == '' or redis.call('HGET', EXP, 'uid') == juid) then
    local fresh = true
    if puid ~= '' then
      fresh = redis.call('SADD', SEEN, kind .. ':' .. puid) == 1
      redis.call('PEXPIRE', SEEN, ARGV[1])
    end
    if fresh then
      redis.call('HINCRBY', EXP, kind == 1 and 'add' or 'del', -1)
      changed = changed + 1
    end
  end
end
return changed
"#
);

/// Deletes everything kept for the Job key.
pub(crate) const EXP_DELETE: &str = concat!(
    exp_prelude!(),
    r#"
return redis.call('DEL', EXP, SEEN, FIN, REC)
"#
);

/// ARGV: gc_ms, job_uid, pod_uids…
pub(crate) const EXP_FIN_ADD: &str = concat!(
    exp_prelude!(),
    r#"
for i = 3, #ARGV do redis.call('HSET', FIN, ARGV[i], ARGV[2]) end
redis.call('PEXPIRE', FIN, ARGV[1])
return #ARGV - 2
"#
);

/// ARGV: name → value or nil (expired records are removed on read).
pub(crate) const REC_GET: &str = concat!(
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

/// ARGV: name, ttl_ms (0 = none), gc_ms, value.
pub(crate) const REC_PUT: &str = concat!(
    exp_prelude!(),
    r#"
local ttl = tonumber(ARGV[2])
local expiry = 0
if ttl > 0 then expiry = now + ttl end
redis.call('HSET', REC, ARGV[1], expiry .. '|' .. ARGV[4])
redis.call('PEXPIRE', REC, ARGV[3])
return 1
"#
);
