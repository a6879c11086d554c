//! Lua shared by several scripts: the queue's data model helpers and the observation of
//! expectations. Each script itself lives beside the Rust that calls it (`crate::ops`), with a
//! `KEYS` / `ARGV` header; what is here is vocabulary, written once.
//!
//! Time always comes from Redis `TIME` (once per script, see the preludes in [`crate::keys`]),
//! so every replica shares one clock. Commands are batched where Redis allows (one `ZADD` /
//! `HSET` / `HMGET` for a whole lease batch), because the per-command cost dominates the CPU
//! Redis spends per item.

use std::sync::OnceLock;

use redis::Script;

/// One script and the name its errors carry, compiled (hashed) once, on first use; run it with
/// [`Store::run`](crate::store::Store::run).
pub(crate) struct Lua {
    name: &'static str,
    src: &'static str,
    script: OnceLock<Script>,
}

impl Lua {
    /// The script `src`, called `name` in errors.
    pub(crate) const fn new(name: &'static str, src: &'static str) -> Self {
        Self { name, src, script: OnceLock::new() }
    }

    /// The name its errors carry.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn script(&self) -> &Script {
        self.script.get_or_init(|| Script::new(self.src))
    }
}

/// A value as one script argument (an `ARGV` entry): text and bytes as they are, numbers in
/// decimal, durations in whole milliseconds. Every script call builds its arguments through
/// this, so a value has one encoding whichever script it goes to.
pub(crate) trait Arg {
    /// The argument's bytes.
    fn arg(self) -> Vec<u8>;
}

impl<T: AsRef<[u8]> + ?Sized> Arg for &T {
    fn arg(self) -> Vec<u8> {
        self.as_ref().to_vec()
    }
}

impl Arg for std::time::Duration {
    fn arg(self) -> Vec<u8> {
        crate::store::ms(self).arg()
    }
}

macro_rules! decimal_args {
    ($($t:ty),*) => {
        $(impl Arg for $t {
            fn arg(self) -> Vec<u8> {
                self.to_string().into_bytes()
            }
        })*
    };
}
decimal_args!(u8, u32, u64, usize, i32, i64);

/// `argv![a, b, …]`: the script arguments `vec![a.arg(), b.arg(), …]`.
macro_rules! argv {
    ($($a:expr),* $(,)?) => {
        vec![$($crate::lua::Arg::arg($a)),*]
    };
}
pub(crate) use argv;

/// Helpers over the [`QueueKeys`](crate::keys::QueueKeys) (after `queue_prelude!`): `mark`,
/// `wake`, `unpack_lease`, `xfield`, `add_now`, `next_due`, `wake_at`, `add_after`, `backoff`,
/// `promote`, `reap`, `grant`.
macro_rules! queue_fns {
    () => {
        r#"
-- What the caller must tell the queue's index (`crate::keys::IndexKeys`, another slot) after
-- the script: `mark_at`, the earliest time this shard may have work that the script created (a
-- ready item, a due time, a lease deadline), -1 for none; `woke`, 1 when items became ready, so
-- waiting lessees of every replica are woken. Scripts return both.
-- Ready items are kept per namespace (`T:ready:<ns>`, by ready time) with `T:rr`, the list of
-- namespaces that have some, in round-robin order, and `T:drr`, their deficits: leases take
-- from namespaces in deficit round robin (`grant`). A namespace is in `T:rr` exactly while its
-- set is non-empty. `weights` (namespace -> weight, default 1) come from the caller, parsed by
-- `load_weights`.
-- Within a namespace the order is the score: the ready time (then the key, as a ZSET orders
-- equal scores), less the item's priority head start (below), so with equal priorities it is
-- upstream's order exactly.
local SHARD = string.sub(READY, 1, #READY - #':ready')
local RR, DRR = SHARD .. ':rr', SHARD .. ':drr'
local weights = {}
-- `LeaseOrder::Fifo` (the weights argument then begins `!fifo,`): leases take the oldest ready
-- item of the shard whichever its namespace, as upstream's FIFO workqueue does (`fifo_pop`).
local lease_fifo = false
local function load_weights(s)
  s = s or ''
  if string.sub(s, 1, 6) == '!fifo,' then lease_fifo, s = true, string.sub(s, 7) end
  for ns, w in string.gmatch(s, '([^=,]+)=(%d+)') do weights[ns] = tonumber(w) end
end
local function ns_of(item) return string.match(item, '^([^/]*)/') or '' end
local function rkey(ns) return READY .. ':' .. ns end
local function any_ready() return redis.call('LLEN', RR) > 0 end
-- ZADD NX of `item` at `at` into its namespace's set; 1 when added.
-- Priority (`crate::ops::priority`): `T:prio` holds item -> `hs|priority` for items whose
-- priority is not 0, `hs` the head start in ms its ready score gets (the ready time minus hs:
-- a higher priority goes first among keys that became ready within hs of each other, and no key
-- is passed by one that became ready more than the aging cap after it). A shard where nobody set
-- a priority has no `T:prio`: one EXISTS per script, at the first need, and no per-item command.
local PRIO = SHARD .. ':prio'
local prio_known, prio_any = false, false
local function has_prio()
  if not prio_known then prio_any, prio_known = redis.call('EXISTS', PRIO) == 1, true end
  return prio_any
end
local function hs_of(v) return v and tonumber(string.match(v, '^(%d+)|')) or 0 end
local function head_start(item)
  if not has_prio() then return 0 end
  return hs_of(redis.call('HGET', PRIO, item))
end
-- Records an Add's priority of `item` (`v` = `hs|priority`; `0|0` forgets it; '' = none sent,
-- the stored one stays). Returns the head start it gets.
local function set_prio(item, v)
  if v == '' then return head_start(item) end
  local hs = hs_of(v)
  if v == '0|0' then
    if has_prio() then redis.call('HDEL', PRIO, item) end
  else
    redis.call('HSET', PRIO, item, v)
    prio_any, prio_known = true, true
  end
  return hs
end
-- The item left the queue (a Done that does not bring it back): its priority goes with it;
-- the watcher sends it again with the next enqueue.
local function forget_prio(item)
  if has_prio() then redis.call('HDEL', PRIO, item) end
end
-- ZADD NX of `item`, ready at `at`, into its namespace's set (scored `at` minus its head
-- start); 1 when added.
local function ready_add(item, at)
  local ns = ns_of(item)
  local k = rkey(ns)
  if redis.call('ZADD', k, 'NX', at - head_start(item), item) == 0 then return 0 end
  if redis.call('ZCARD', k) == 1 then redis.call('RPUSH', RR, ns) end
  return 1
end
-- The ready time of a ready item (its score plus its head start), nil when not ready.
local function ready_score(item)
  local s = redis.call('ZSCORE', rkey(ns_of(item)), item)
  if not s then return nil end
  return tonumber(s) + head_start(item)
end

-- A shard that had ready items when the script began is in the index already (its first ready
-- item's MARK, or the sweep after a lost one, put it there) and its waiters were woken then: no
-- MARK needed, which spares a round trip on every Add to a busy shard. Lease deadlines are not
-- marked either: a lease's SETTLE records them, and the sweep reaps every shard.
-- `T:rr`'s length as the script began (`ready_len0`): ADD reuses it instead of asking again.
local ready_len0 = redis.call('LLEN', RR)
local had_ready = ready_len0 > 0
local mark_at, woke = -1, 0
local function mark(at)
  if mark_at < 0 or at < mark_at then mark_at = at end
end
local function wake()
  if had_ready then return end
  woke = 1
  mark(now)
end
-- On a single server (no slots to respect) the caller may name the queue's index keys
-- (`crate::keys::IndexKeys`: shards, versions, wake) as the last three KEYS; `flush_index()`
-- then does MARK's work in this script and clears `mark_at`/`woke`, so the caller has no MARK
-- to send: one round trip per Add or Done, as unsharded. They are recognised by name (the wake
-- list of this shard's queue), which no other key of a shard script can have.
local function flush_index()
  local queue, shard = string.match(SHARD, '^{wq:(.+):(%d+)%.%d+}$')
  local n = #KEYS
  if mark_at < 0 or not queue or n < 3 or KEYS[n] ~= '{wq:' .. queue .. '}:wake' then return end
  redis.call('HINCRBY', KEYS[n - 1], shard, 1)
  redis.call('ZADD', KEYS[n - 2], 'LT', mark_at, shard)
  if woke == 1 and redis.call('LLEN', KEYS[n]) == 0 then redis.call('RPUSH', KEYS[n], '1') end
  mark_at, woke = -1, 0
end

-- Lease record: id|start|requeues|expiries|dirtyAt|worker (dirtyAt -1 = not dirty; the worker
-- id goes last because it is free-form). The start comes back as read too, for writers that
-- copy it into a record (formatting a number in Lua costs more than the rest of a field).
-- `unpack_lease_text` gives the fields as the text the record holds, for writers that only
-- compare or copy them; `unpack_lease` the numeric ones as numbers.
local function unpack_lease_text(v)
  return string.match(v, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
end

local function unpack_lease(v)
  local id, st, rq, ex, dt, wk = unpack_lease_text(v)
  return id, tonumber(st), tonumber(rq), tonumber(ex), tonumber(dt), wk, st
end

local function xfield(item) return '!x|' .. item end

-- The Job's bounded history (`crate::keys::hist_key`), for explain: only what is off the happy
-- path is written (a delay longer than the pod-event batch, an error, a requeue-after, a
-- recovery after an error, a lease expiry), so an add, a lease and a successful Done write
-- nothing. Entries, newest last: `e|at|delay_ms|observations` (a delayed Add),
-- `d|at|lease_start|outcome|delay_ms|len(worker)|worker error` (a Done: outcome 1 forget,
-- 2 rate limited after an error, 3 requeue after; delay -1 = none) and
-- `x|at|lease_start|expiries|poisoned|worker` (a lease that expired without a Done).
-- Newest entries kept (`HISTORY_MAX_ENTRIES` in the Rust).
local HIST_MAX = 50
-- Idle life of a history (`HISTORY_TTL`): a week after its last entry.
local HIST_TTL_MS = 604800000
local function hist(item, entry)
  local key = SHARD .. ':hist:' .. item
  if redis.call('RPUSH', key, entry) > HIST_MAX then redis.call('LTRIM', key, -HIST_MAX, -1) end
  redis.call('PEXPIRE', key, HIST_TTL_MS)
end
-- The generation of the last-Done hash (`crate::keys::last_sync_key`) at `now`; one generation
-- lasts `LAST_SYNC_GENERATION` (a day).
local LAST_GEN_MS = 86400000
local function last_key(generation) return SHARD .. ':last:' .. generation end
local function last_key_now()
  local generation = math.floor(now / LAST_GEN_MS)
  return last_key(generation), generation
end

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
  if ready_add(item, at) == 1 then return 1, 1 end
  return 0, 0
end

local function next_due()
  local head = redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')
  if #head == 0 then return -1 end
  return tonumber(head[2])
end

-- The earliest time this shard has work without anyone adding: now when items are ready, else
-- the first due time or lease deadline; -1 for none (the shard leaves the index).
local function wake_at()
  if any_ready() then return now end
  local at = next_due()
  local head = redis.call('ZRANGE', LEASES, 0, 0, 'WITHSCORES')
  if #head > 0 and (at < 0 or tonumber(head[2]) < at) then at = tonumber(head[2]) end
  return at
end

-- AddAfter with delay > 0: earliest wins. Marks the due time, so the shard's index entry (and
-- the waiters' sleep, computed from it) moves earlier when needed.
local function add_after(item, delay)
  local due = now + delay
  local changed = redis.call('ZADD', DELAYED, 'LT', 'CH', due, item)
  if changed == 1 then mark(due) end
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
    local dt, st, wk = -1, -1, ''
    if recs[i] then
      local _, s, _, _, d, w = unpack_lease(recs[i])
      dt, st, wk = d, s, w
    end
    local x = redis.call('HINCRBY', FAILURES, xfield(item), 1)
    if x == 1 then redis.call('HINCRBY', STATS, 'expiring', 1) end
    local poison_now = poison > 0 and x >= poison
    hist(item, 'x|' .. now .. '|' .. st .. '|' .. x .. '|' .. (poison_now and 1 or 0) .. '|' .. wk)
    if poison_now then
      poisoned = poisoned + 1
      add_after(item, backoff(item, base, max))
    else
      if dt < 0 then dt = now end
      ready_add(item, dt)
    end
  end
  redis.call('ZREM', LEASES, unpack(expired))
  redis.call('HDEL', LEASE, unpack(expired))
  redis.call('HINCRBY', STATS, 'lease_expired_total', #expired)
  if poisoned > 0 then redis.call('HINCRBY', STATS, 'poisoned_total', poisoned) end
  return #expired, poisoned
end

-- Takes up to `n` ready items in deficit round robin over the namespaces of `T:rr`: the head
-- namespace's deficit grows by its weight when spent (below 1), it gives that many of its oldest
-- items, then goes to the tail; a namespace whose set empties leaves the list and its deficit
-- is forgotten. A lease that ends mid-turn leaves the head where it is, with what is left of its
-- deficit, so the next lease goes on from there. A namespace alone is served in one pop.
-- The list's head (at most `n` entries: each visit takes an item or drops an entry), the
-- deficits (only unfinished turns keep one) and each visited set's size are read once and
-- written back once, so a batch costs about two commands per item (a ZCARD per namespace
-- visited, a ZPOPMIN per visit) whatever the number of namespaces.
-- Returns `{item, score, …}` as ZPOPMIN does.
local function drr_pop(n)
  if n <= 0 then return {} end
  -- The first two entries tell "none", "one namespace" and "several" in one command.
  local first = redis.call('LRANGE', RR, 0, 1)
  if #first == 0 then return {} end
  if #first == 1 then
    local ns = first[1]
    local k = rkey(ns)
    local popped = redis.call('ZPOPMIN', k, n)
    -- Fewer than asked: the set is empty now, no need to ask.
    if #popped < 2 * n or redis.call('EXISTS', k) == 0 then
      redis.call('DEL', RR)
      redis.call('HDEL', DRR, ns)
    end
    return popped
  end
  local len = redis.call('LLEN', RR)
  local whole = len <= n
  local q = redis.call('LRANGE', RR, 0, whole and -1 or n - 1)
  local deficit, size, rotated = {}, {}, {}
  local held = redis.call('HGETALL', DRR)
  for i = 1, #held, 2 do deficit[held[i]] = tonumber(held[i + 1]) end
  local popped, need, head = {}, n, 1
  while need > 0 and head <= #q do
    local ns = q[head]
    local k = rkey(ns)
    if not size[ns] then size[ns] = redis.call('ZCARD', k) end
    local d = deficit[ns] or 0
    if d < 1 then d = d + (weights[ns] or 1) end
    local take = math.min(math.floor(d), need, size[ns])
    if take > 0 then
      local got = redis.call('ZPOPMIN', k, take)
      for i = 1, #got do popped[#popped + 1] = got[i] end
    end
    size[ns], need, d = size[ns] - take, need - take, d - take
    if size[ns] <= 0 then
      deficit[ns], head = nil, head + 1
    elseif d < 1 then
      deficit[ns], head = d, head + 1
      -- With the whole list at hand the turn can come round again in this same call.
      if whole then q[#q + 1] = ns else rotated[#rotated + 1] = ns end
    else
      deficit[ns] = d
    end
  end
  if whole then
    redis.call('DEL', RR)
    local rest = {}
    for i = head, #q do rest[#rest + 1] = q[i] end
    if #rest > 0 then redis.call('RPUSH', RR, unpack(rest)) end
  else
    if head > 1 then redis.call('LTRIM', RR, head - 1, -1) end
    if #rotated > 0 then redis.call('RPUSH', RR, unpack(rotated)) end
  end
  if #held > 0 or next(deficit) then
    redis.call('DEL', DRR)
    local h = {}
    for ns, d in pairs(deficit) do
      if d > 0 then
        h[#h + 1] = ns
        h[#h + 1] = d
      end
    end
    if #h > 0 then redis.call('HSET', DRR, unpack(h)) end
  end
  return popped
end

-- Takes up to `n` ready items oldest first over every namespace of the shard (score, then key),
-- fairness off: one ZRANGE per namespace with work, then a ZPOPMIN and a ZRANGE per item, so it
-- costs O(namespaces) per call (a comparison and diagnosis mode, not for thousands of them). A
-- namespace whose set empties leaves `T:rr` (and its deficit goes), as under `drr_pop`.
-- Returns `{item, score, …}` as ZPOPMIN does.
local function fifo_pop(n)
  local heads, listed, emptied = {}, redis.call('LRANGE', RR, 0, -1), false
  for _, ns in ipairs(listed) do
    local h = redis.call('ZRANGE', rkey(ns), 0, 0, 'WITHSCORES')
    if #h > 0 then heads[ns] = {h[1], tonumber(h[2])} end
  end
  local popped = {}
  while #popped < 2 * n do
    local best_ns, best = nil, nil
    for ns, h in pairs(heads) do
      if not best or h[2] < best[2] or (h[2] == best[2] and h[1] < best[1]) then
        best_ns, best = ns, h
      end
    end
    if not best_ns then break end
    local k = rkey(best_ns)
    local got = redis.call('ZPOPMIN', k, 1)
    popped[#popped + 1], popped[#popped + 2] = got[1], got[2]
    local h = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
    if #h > 0 then
      heads[best_ns] = {h[1], tonumber(h[2])}
    else
      heads[best_ns], emptied = nil, true
      redis.call('HDEL', DRR, best_ns)
    end
  end
  -- The list again without the namespaces that emptied, in its order (kjob's ACL user has no
  -- LREM, and a script that fails midway keeps what it did before: only allowed commands here).
  if emptied then
    local keep = {}
    for _, ns in ipairs(listed) do
      if heads[ns] then keep[#keep + 1] = ns end
    end
    redis.call('DEL', RR)
    if #keep > 0 then redis.call('RPUSH', RR, unpack(keep)) end
  end
  return popped
end

-- Leases up to `n` ready items (`drr_pop`, or `fifo_pop`) to `worker` for `lease_ms`, appending
-- `{item, lease_id, requeues, deadline, added_at, expiries}` of each to `out`; returns how many. One
-- sequence bump, one HMGET, one ZADD and one HSET for the whole batch. Numbers go out as the
-- text Redis gave (the counts, the ready time) or as text made once per call (the time, the
-- deadline): only each lease id's sequence number is formatted per item.
local function grant(worker, n, lease_ms, out)
  local popped
  if lease_fifo then popped = fifo_pop(n) else popped = drr_pop(n) end
  local count = #popped / 2
  if count == 0 then return 0 end
  local last = redis.call('HINCRBY', STATS, 'lease_seq', count)
  -- Each item's failures and lease expiries. Both are rare: a shard without any (the common
  -- case) reads none, for one HLEN.
  local fail = {}
  if redis.call('HLEN', FAILURES) > 0 then
    local fields = {}
    for i = 1, count do
      local item = popped[2 * i - 1]
      fields[2 * i - 1] = item
      fields[2 * i] = xfield(item)
    end
    fail = redis.call('HMGET', FAILURES, unpack(fields))
  end
  -- The scores are ready times less head starts: add them back, so `added` is the ready time.
  local hs = false
  if has_prio() then
    local items = {}
    for i = 1, count do items[i] = popped[2 * i - 1] end
    hs = redis.call('HMGET', PRIO, unpack(items))
  end
  local deadline = string.format('%d', now + lease_ms)
  local mid, tail = '-' .. now_s .. '|' .. now_s .. '|', '|-1|' .. worker
  local first = last - count
  local zargs, hargs = {}, {}
  for i = 1, count do
    local item, added = popped[2 * i - 1], popped[2 * i]
    -- The time part keeps ids unique even if Redis lost the sequence (restart without AOF).
    local seq = string.format('%d', first + i)
    local req, ex = fail[2 * i - 1] or '0', fail[2 * i] or '0'
    zargs[2 * i - 1], zargs[2 * i] = deadline, item
    hargs[2 * i - 1] = item
    hargs[2 * i] = seq .. mid .. req .. '|' .. ex .. tail
    if hs and hs[i] then added = tonumber(added) + hs_of(hs[i]) end
    out[#out + 1] = {item, seq .. '-' .. now_s, req, deadline, added, ex}
  end
  redis.call('ZADD', LEASES, unpack(zargs))
  redis.call('HSET', LEASE, unpack(hargs))
  return count
end
"#
    };
}
pub(crate) use queue_fns;

/// `observe(EXP, SEEN, FIN, gc_ms, obs, first, count)`: applies observations to one Job's
/// [`ExpKeys`](crate::keys::ExpKeys) (shared by ADD and OBSERVE).
macro_rules! observe_fn {
    () => {
        r#"
-- kind 1 creation, 2 deletion (lower the counters of a record of that Job UID, once per pod),
-- 3 finalizer removal (drop the pod from the in-flight set). Returns observations that changed
-- something. A pod's creation is remembered even with no record of its Job: a sync that
-- created pods raises its record afterwards (SET_CREATED) and must not expect those seen.
-- Likewise a removal of a pod not in the in-flight set goes into FINSEEN: a sync expects its
-- removals with its Done, after them (EXPECT_FIN_DONE), and must not expect those seen.
local function observe(EXP, SEEN, FIN, FINSEEN, gc_ms, obs, first, count)
  local changed = 0
  for i = first, first + 3 * (count - 1), 3 do
    local kind, juid, puid = tonumber(obs[i]), obs[i + 1], obs[i + 2]
    if kind == 3 then
      local n = redis.call('HDEL', FIN, puid)
      if n == 0 and puid ~= '' then
        redis.call('SADD', FINSEEN, puid)
        redis.call('PEXPIRE', FINSEEN, gc_ms)
      end
      changed = changed + n
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
    elseif kind == 1 and puid ~= '' then
      redis.call('SADD', SEEN, '1:' .. puid)
      redis.call('PEXPIRE', SEEN, gc_ms)
    end
  end
  return changed
end
"#
    };
}
pub(crate) use observe_fn;

/// The script's codes of the observation kinds (see `observe_fn!`).
pub(crate) fn observation_code(kind: crate::ObservationKind) -> u8 {
    match kind {
        crate::ObservationKind::Creation => 1,
        crate::ObservationKind::Deletion => 2,
        crate::ObservationKind::FinalizerRemoval => 3,
    }
}
