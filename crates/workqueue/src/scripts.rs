//! The Lua scripts: one per operation, each atomic across every kjob-queue replica.
//!
//! Every queue script gets the same seven keys (all under the queue's hash tag, so they live in
//! one Cluster slot):
//! 1 ready ZSET (item → first add time; FIFO), 2 delayed ZSET (item → due time, written with
//! `ZADD LT`), 3 leases ZSET (item → deadline), 4 lease HASH (item → `id|start|requeues|expiries|
//! dirtyAt|worker`, one field per leased item so a lease costs one HSET), 5 failures HASH
//! (item → rate-limited failures, and `!x|item` → lease expiries without a Done), 6 stats HASH
//! (sequences and counters), 7 wake LIST (at most one marker).
//!
//! ADD additionally gets, per item carrying observations, the four expectation keys of its Job
//! (see [`EXP_KEYS`](crate::store)); they carry the `job` queue's hash tag, which is what lets the
//! observation and the enqueue run in one script on a Cluster.
//!
//! Time always comes from Redis `TIME` (once per script), so every replica shares one clock.
//! Commands are batched where Redis allows (one `ZADD`/`HSET`/`HMGET` for a whole lease batch),
//! because the per-command cost dominates the CPU Redis spends per item.

/// Shared prelude: `now` in ms, the key names, and the helpers used by several scripts.
macro_rules! prelude {
    () => {
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local READY, DELAYED, LEASES, LEASE, FAILURES, STATS, WAKE =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]

-- A durable wake marker: blocked replicas BLPOP it; at most one element. While nobody waits the
-- marker stays, so this costs one LLEN.
local function wake()
  if redis.call('LLEN', WAKE) == 0 then redis.call('RPUSH', WAKE, '1') end
end

-- Lease record: id|start|requeues|expiries|dirtyAt|worker (dirtyAt -1 = not dirty; the worker
-- id goes last because it is free-form).
local function unpack_lease(v)
  local id, st, rq, ex, dt, wk = string.match(v, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  return id, tonumber(st), tonumber(rq), tonumber(ex), tonumber(dt), wk
end

local function xfield(item) return '!x|' .. item end

-- client-go Add at time `at`: a leased item becomes dirty (its record keeps the first add time),
-- any other joins ready unless there. Returns accepted (0/1), readied (0/1).
local function add_now(item, at)
  local v = redis.call('HGET', LEASE, item)
  if v then
    local id, st, rq, ex, dt, wk = unpack_lease(v)
    if dt >= 0 then return 0, 0 end
    redis.call('HSET', LEASE, item, id .. '|' .. st .. '|' .. rq .. '|' .. ex .. '|' .. at .. '|' .. wk)
    return 1, 0
  end
  if redis.call('ZADD', READY, 'NX', at, item) == 1 then return 1, 1 end
  return 0, 0
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
  local changed = redis.call('ZADD', DELAYED, 'LT', 'CH', due, item)
  if changed == 1 then
    local head = redis.call('ZRANGE', DELAYED, 0, 0)
    if head[1] == item then wake() end
  end
  return changed
end

-- client-go ItemExponentialFailureRateLimiter: base * 2^(failures before this one), capped.
local function backoff(item, base, max)
  local n = redis.call('HINCRBY', FAILURES, item, 1)
  return math.min(base * 2 ^ (n - 1), max)
end

-- Moves due delayed items through the Add path. Bounded: a script blocks the whole server.
-- Returns accepted adds (client-go counts an AddAfter's add when it fires) and items readied.
local function promote(limit)
  local due = redis.call('ZRANGE', DELAYED, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
  if #due == 0 then return 0, 0 end
  local accepted, readied, members = 0, 0, {}
  for i = 1, #due, 2 do
    members[#members + 1] = due[i]
    local a, r = add_now(due[i], tonumber(due[i + 1]))
    accepted, readied = accepted + a, readied + r
  end
  redis.call('ZREM', DELAYED, unpack(members))
  return accepted, readied
end

-- Puts items whose lease deadline passed back into ready (dirty or not: they need a run). An
-- item whose leases expired `poison` times in a row without a Done is requeued through the
-- rate limiter instead, so a key that crashes its workers cannot monopolise them.
-- Returns reaped, poisoned.
local function reap(limit, poison, base, max)
  local expired = redis.call('ZRANGE', LEASES, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  if #expired == 0 then return 0, 0 end
  local poisoned = 0
  local recs = redis.call('HMGET', LEASE, unpack(expired))
  for i, item in ipairs(expired) do
    local dt = -1
    if recs[i] then
      local _, _, _, _, d = unpack_lease(recs[i])
      dt = d
    end
    local x = redis.call('HINCRBY', FAILURES, xfield(item), 1)
    if x == 1 then redis.call('HINCRBY', STATS, 'expiring', 1) end
    if poison > 0 and x >= poison then
      poisoned = poisoned + 1
      add_after(item, backoff(item, base, max))
    else
      if dt < 0 then dt = now end
      redis.call('ZADD', READY, 'NX', dt, item)
    end
  end
  redis.call('ZREM', LEASES, unpack(expired))
  redis.call('HDEL', LEASE, unpack(expired))
  redis.call('HINCRBY', STATS, 'lease_expired_total', #expired)
  if poisoned > 0 then redis.call('HINCRBY', STATS, 'poisoned_total', poisoned) end
  return #expired, poisoned
end
"#
    };
}

/// Applies observations to one Job's expectation keys (shared by ADD and EXP_OBSERVE).
macro_rules! observe_fn {
    () => {
        r#"
-- kind 1 creation, 2 deletion (lower the counters of a record of that Job UID, once per pod),
-- 3 finalizer removal (drop the pod from the in-flight set). Returns observations that changed
-- something.
local function observe(EXP, SEEN, FIN, gc_ms, obs, first, count)
  local changed = 0
  for i = first, first + 3 * (count - 1), 3 do
    local kind, juid, puid = tonumber(obs[i]), obs[i + 1], obs[i + 2]
    if kind == 3 then
      changed = changed + redis.call('HDEL', FIN, puid)
    elseif redis.call('EXISTS', EXP) == 1 and (juid == '' or redis.call('HGET', EXP, 'uid') == juid) then
      local fresh = true
      if puid ~= '' then
        fresh = redis.call('SADD', SEEN, kind .. ':' .. puid) == 1
        redis.call('PEXPIRE', SEEN, gc_ms)
      end
      if fresh then
        redis.call('HINCRBY', EXP, kind == 1 and 'add' or 'del', -1)
        changed = changed + 1
      end
    end
  end
  return changed
end
"#
    };
}

/// ARGV: gc_ms, has_view (0/1: KEYS[8] and KEYS[9] are the view session and run keys), then
/// per entry: item,
/// delay_ms, observe_only (0/1), n_obs, n_view, session, then n_obs × (kind, job_uid, pod_uid)
/// and n_view × (kind, name, object, resource_version). After KEYS[9] (or 7), each entry with
/// n_obs > 0 has its four expectation keys and each with n_view > 0 its three view keys, in
/// entry order. → `{added, accepted_now, now, observed, view_lost}` (view_lost 1 when view
/// writes found no current session: the writer must begin a new one).
///
/// View writes are applied before the observations of their item, and both before its enqueue,
/// in the same script: a worker that leases the key and sees an observation also sees the pod
/// it was made from, and no crash can apply one without the other.
pub(crate) const ADD: &str = concat!(
    prelude!(),
    observe_fn!(),
    crate::view::apply_view_fn!(),
    r#"
-- Runs a multi-member command in chunks (a Lua call takes at most a few thousand arguments).
-- Returns the concatenated array replies and the sum of integer replies.
local function chunked(cmd, key, args, per)
  local out, total = {}, 0
  for s = 1, #args, per do
    local r = redis.call(cmd, key, unpack(args, s, math.min(s + per - 1, #args)))
    if type(r) == 'table' then
      for i = 1, #r do out[#out + 1] = r[i] end
    else
      total = total + r
    end
  end
  return out, total
end

local gc_ms = ARGV[1]
local added, accepted, readied, observed, k = 0, 0, 0, 0, 8
-- The current view session, read the first time an entry carries view writes (INFO costs).
local has_view, session_read, current_session, view_lost = ARGV[2] == '1', false, false, 0
if has_view then k = 10 end
local now_items, seen = {}, {}
local i = 3
while i <= #ARGV do
  local item, delay, only = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local nobs, nview, session = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), ARGV[i + 5]
  local obs_at, view_at = i + 6, i + 6 + 3 * nobs
  if nview > 0 then
    local ek = k
    if nobs > 0 then ek = k + 4 end
    if not session_read then
      current_session, session_read = view_current(KEYS[8], KEYS[9]), true
    end
    if session_accepts(current_session, session) then
      apply_view(KEYS[ek], KEYS[ek + 1], KEYS[ek + 2], gc_ms, session, ARGV, view_at, nview)
    elseif not current_session then
      -- No session at all: this Redis lost it (restarted from an older state). The writer
      -- must begin a new one.
      view_lost = 1
    end
  end
  if nobs > 0 then
    observed = observed + observe(KEYS[k], KEYS[k + 1], KEYS[k + 2], gc_ms, ARGV, obs_at, nobs)
    k = k + 4
  end
  if nview > 0 then k = k + 3 end
  if only == '0' then
    if delay > 0 then
      added = added + add_after(item, delay)
    elseif not seen[item] then
      seen[item] = true
      now_items[#now_items + 1] = item
    end
  end
  i = i + 6 + 3 * nobs + 4 * nview
end
-- Immediate adds of the whole batch: one HMGET finds the leased ones (they become dirty), one
-- ZADD NX enqueues the rest; per-item commands would cost Redis more than the script itself.
if #now_items > 0 then
  local recs = chunked('HMGET', LEASE, now_items, 1000)
  local zargs = {}
  for j, item in ipairs(now_items) do
    if recs[j] then
      local a = add_now(item, now)
      added, accepted = added + a, accepted + a
    else
      zargs[#zargs + 1] = now
      zargs[#zargs + 1] = item
    end
  end
  if #zargs > 0 then
    local n = 0
    for s = 1, #zargs, 2000 do
      n = n + redis.call('ZADD', READY, 'NX', unpack(zargs, s, math.min(s + 1999, #zargs)))
    end
    added, accepted, readied = added + n, accepted + n, readied + n
  end
end
if readied > 0 then wake() end
return {added, accepted, now, observed, view_lost}
"#
);

/// ARGV: worker, n, lease_ms, promote_limit, reap_limit, poison_after, base_ms, max_ms →
/// `{now, next_due, promoted, reaped, poisoned, {item, lease_id, requeues, deadline, added_at}…}`.
pub(crate) const LEASE: &str = concat!(
    prelude!(),
    r#"
local worker, n, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local promoted = promote(tonumber(ARGV[4]))
local reaped, poisoned = reap(tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]))
local popped = redis.call('ZPOPMIN', READY, n)
local out = {now, next_due(), promoted, reaped, poisoned}
local count = #popped / 2
if count > 0 then
  -- One sequence bump, one HMGET, one ZADD and one HSET for the whole batch.
  local last = redis.call('HINCRBY', STATS, 'lease_seq', count)
  local fields = {}
  for i = 1, count do
    local item = popped[2 * i - 1]
    fields[2 * i - 1] = item
    fields[2 * i] = xfield(item)
  end
  local fail = redis.call('HMGET', FAILURES, unpack(fields))
  local deadline = now + lease_ms
  local zargs, hargs = {}, {}
  for i = 1, count do
    local item, added = popped[2 * i - 1], popped[2 * i]
    -- The time part keeps ids unique even if Redis lost the sequence (restart without AOF).
    local id = (last - count + i) .. '-' .. now
    local req, ex = tonumber(fail[2 * i - 1] or 0), tonumber(fail[2 * i] or 0)
    zargs[2 * i - 1], zargs[2 * i] = deadline, item
    hargs[2 * i - 1] = item
    hargs[2 * i] = id .. '|' .. now .. '|' .. req .. '|' .. ex .. '|-1|' .. worker
    out[#out + 1] = {item, id, req, deadline, tonumber(added)}
  end
  redis.call('ZADD', LEASES, unpack(zargs))
  redis.call('HSET', LEASE, unpack(hargs))
end
-- Chain the wake-up so another replica's waiters take what is left.
if count > 0 and redis.call('ZCARD', READY) > 0 then wake() end
return out
"#
);

/// ARGV: item, lease_id, lease_ms → new deadline, or -1 for a stale id.
pub(crate) const RENEW: &str = concat!(
    prelude!(),
    r#"
local v = redis.call('HGET', LEASE, ARGV[1])
if not v or unpack_lease(v) ~= ARGV[2] then
  redis.call('HINCRBY', STATS, 'stale_total', 1)
  return -1
end
local deadline = now + tonumber(ARGV[3])
redis.call('ZADD', LEASES, 'XX', deadline, ARGV[1])
return deadline
"#
);

/// ARGV: base_ms, max_ms, then per Done: item, lease_id, outcome (1 forget, 2 rate limited,
/// 3 requeue after), after_ms → `{now, {work_ms, ready_at (-1 = not requeued), delay_used}…}`
/// with work_ms -1 for a stale lease id (that Done changed nothing).
///
/// Several Dones share one script call (the service batches concurrent calls): the call's own
/// cost, not the per-item commands, dominates Redis CPU per item. Items are handled in order; a
/// second Done of one lease in the same batch is stale, as it would be one call later.
pub(crate) const DONE: &str = concat!(
    prelude!(),
    r#"
local base, max = tonumber(ARGV[1]), tonumber(ARGV[2])
local items = {}
for i = 3, #ARGV, 4 do items[#items + 1] = ARGV[i] end
local recs = redis.call('HMGET', LEASE, unpack(items))
local any_delayed = redis.call('ZCARD', DELAYED) > 0
local out, finished, gone = {now}, {}, {}
for j, item in ipairs(items) do
  local a = 3 + 4 * (j - 1)
  local id, outcome = ARGV[a + 1], tonumber(ARGV[a + 2])
  local lid, started, req, ex, dt
  if recs[j] and not finished[item] then lid, started, req, ex, dt = unpack_lease(recs[j]) end
  if lid ~= id then
    redis.call('HINCRBY', STATS, 'stale_total', 1)
    out[#out + 1] = {-1, -1, -1}
  else
    finished[item] = true
    gone[#gone + 1] = item
    -- A Done ends the run of lease expiries (poison detection). The record says whether there
    -- is anything to delete, which saves a command on the common path.
    if ex > 0 and redis.call('HDEL', FAILURES, xfield(item)) == 1 then
      redis.call('HINCRBY', STATS, 'expiring', -1)
    end
    local delay = -1
    if outcome == 2 then
      delay = backoff(item, base, max)
    else
      -- Forget (also for requeue-after, a success). Only the holder changes the count while
      -- the key is leased, so the count read at lease time tells whether there is one.
      if req > 0 then redis.call('HDEL', FAILURES, item) end
      if outcome == 3 then delay = tonumber(ARGV[a + 3]) end
    end
    local ready_at = -1
    if dt >= 0 or delay == 0 then
      if dt < 0 then dt = now end
      redis.call('ZADD', READY, 'NX', dt, item)
      ready_at = now
      wake()
    end
    if delay > 0 then
      add_after(item, delay)
      any_delayed = true
    end
    -- A pending AddAfter (ours or an earlier one) also brings the item back.
    if ready_at < 0 and any_delayed then
      ready_at = tonumber(redis.call('ZSCORE', DELAYED, item) or -1)
    end
    out[#out + 1] = {now - started, ready_at, delay}
  end
end
if #gone > 0 then
  redis.call('ZREM', LEASES, unpack(gone))
  redis.call('HDEL', LEASE, unpack(gone))
end
return out
"#
);

/// ARGV: promote_limit, reap_limit, poison_after, base_ms, max_ms →
/// `{promoted, reaped, next_due, now, poisoned}`.
pub(crate) const SWEEP: &str = concat!(
    prelude!(),
    r#"
local promoted, readied = promote(tonumber(ARGV[1]))
local reaped, poisoned = reap(tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
if readied + reaped - poisoned > 0 then wake() end
return {promoted, reaped, next_due(), now, poisoned}
"#
);

/// ARGV: max_leases (how many lease records to read) →
/// `{now, ready, delayed, leased, dirty, oldest_ready, failing, unfinished_ms, oldest_started}`.
pub(crate) const STATS: &str = concat!(
    prelude!(),
    r#"
local oldest = redis.call('ZRANGE', READY, 0, 0, 'WITHSCORES')
local oldest_ready = -1
if #oldest > 0 then oldest_ready = tonumber(oldest[2]) end
local leased = redis.call('ZCARD', LEASES)
local recs
if leased <= tonumber(ARGV[1]) then
  recs = redis.call('HVALS', LEASE)
else
  -- A pathological backlog of leases: sample one page rather than block the server.
  local page = redis.call('HSCAN', LEASE, 0, 'COUNT', ARGV[1])[2]
  recs = {}
  for i = 2, #page, 2 do recs[#recs + 1] = page[i] end
end
local unfinished, oldest_started, dirty = 0, -1, 0
for _, v in ipairs(recs) do
  local _, s, _, _, dt = unpack_lease(v)
  unfinished = unfinished + (now - s)
  if oldest_started < 0 or s < oldest_started then oldest_started = s end
  if dt >= 0 then dirty = dirty + 1 end
end
local expiring = tonumber(redis.call('HGET', STATS, 'expiring') or 0)
return {now, redis.call('ZCARD', READY), redis.call('ZCARD', DELAYED), leased,
  dirty, oldest_ready, redis.call('HLEN', FAILURES) - expiring, unfinished, oldest_started}
"#
);

/// ARGV: items… → per item `{ready, delayed, deadline, dirty, failures, holder, expiries}`
/// (-1 / '' = none).
pub(crate) const INSPECT: &str = concat!(
    prelude!(),
    r#"
local out = {}
for _, item in ipairs(ARGV) do
  local v = redis.call('HGET', LEASE, item)
  local dirty, holder = 0, ''
  if v then
    local _, _, _, _, dt, wk = unpack_lease(v)
    if dt >= 0 then dirty = 1 end
    holder = wk
  end
  table.insert(out, {
    tonumber(redis.call('ZSCORE', READY, item) or -1),
    tonumber(redis.call('ZSCORE', DELAYED, item) or -1),
    tonumber(redis.call('ZSCORE', LEASES, item) or -1),
    dirty,
    tonumber(redis.call('HGET', FAILURES, item) or 0),
    holder,
    tonumber(redis.call('HGET', FAILURES, xfield(item)) or 0),
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
// Per Job key K (under the `job` queue's hash tag T): `T:exp:K` HASH uid/add/del/ts,
// `T:exp:K:seen` SET of observed "kind:podUID" (makes a re-sent observation idempotent),
// `T:exp:K:fin` HASH podUID → jobUID (finalizer removals in flight), `T:exp:K:rec` HASH
// name → "expiry|bytes".

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
    observe_fn!(),
    r#"
return observe(EXP, SEEN, FIN, ARGV[1], ARGV, 2, (#ARGV - 1) / 3)
"#
);

/// Deletes everything kept for the Job key: KEYS are its four expectation keys and its three
/// view keys.
pub(crate) const EXP_DELETE: &str = r#"
return redis.call('DEL', unpack(KEYS))
"#;

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

/// ARGV: name → 1 if the record existed, else 0.
pub(crate) const REC_DEL: &str = concat!(
    exp_prelude!(),
    r#"
return redis.call('HDEL', REC, ARGV[1])
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
