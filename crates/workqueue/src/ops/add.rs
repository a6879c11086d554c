//! ADD: enqueue a batch, applying each Job item's view writes and observations first, in the
//! same script.

use std::time::Duration;

use redis::Value;

use crate::keys::{ExpKeys, QueueKeys, queue_prelude};
use crate::lua::Arg;
use crate::lua::Lua;
use crate::lua::{observe_fn, queue_fns};
use crate::reply::Fields;
use crate::store::{AddOutcome, Enqueue, Leased, Store, push_observations};
use crate::view::{ViewKeys, ViewOp, push_view_ops, view_run_key, view_session_key};
use crate::{Observation, WqError};

/// KEYS: the [`QueueKeys`] of one shard; then, with has_view, KEYS[7] the shard's view session
/// and KEYS[8] its view run; then, in entry order, the five [`ExpKeys`] of each entry with n_obs > 0 or n_view > 0,
/// followed by the four [`ViewKeys`] of each with n_view > 0.
/// ARGV[1] -> gc_ms, ARGV[2] -> has_view (0/1), ARGV[3] -> weights (`ns=w,…`, for the
/// hand-off's leases), ARGV[4] -> n_takers, then per taker (a
/// waiting lessee of the calling replica): worker, n, lease_ms, views (0/1); then n_records and
/// that many record names; then per entry: item, delay_ms, observe_only (0/1), n_obs, n_view,
/// session, priority (`head start ms|priority`, `0|0` to forget a stored one, empty: none sent,
/// the stored one stays; see [`crate::ops::priority`]), then n_obs × (kind, job_uid, pod_uid)
/// and n_view × (kind, name, object, resource_version).
/// Reply: [`AddReply`] `{added, accepted_now, now, observed, view_lost, mark_at, woke, {lease
/// item…} per taker}` (view_lost 1 when view writes found no current session: the writer must begin a new
/// one; a lease item as LEASE returns it, and for a taker that asked for views, when the item
/// is an entry of this Add with view writes, its view as GET_VIEW returns it with the records
/// named).
///
/// View writes are applied before the observations of their item, and both before its enqueue,
/// in the same script: a worker that leases the key and sees an observation also sees the pod
/// it was made from, and no crash can apply one without the other. A hand-off carries the view
/// read in the same script too, so the lessee needs no GET_VIEW.
const ADD: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
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

-- Most pods a hand-off's view may hold (`HANDOFF_VIEW_MAX_PODS` in the Rust).
local HANDOFF_VIEW_MAX_PODS = 16
local gc_ms = ARGV[1]
local added, accepted, readied, observed, k = 0, 0, 0, 0, 7
-- The current view session, read the first time an entry carries view writes (INFO costs).
local has_view, session_read, current_session, view_lost = ARGV[2] == '1', false, false, 0
local function session()
  if not session_read then
    current_session, session_read = view_current(KEYS[7], KEYS[8]), true
  end
  return current_session
end
if has_view then k = 9 end
local now_items, seen, now_hs = {}, {}, {}
load_weights(ARGV[3])
local takers = tonumber(ARGV[4])
local rec_at = 6 + 4 * takers
local nrec = tonumber(ARGV[rec_at - 1])
-- item -> KEYS index of its ExpKeys (its ViewKeys follow), for the views of hand-offs.
local view_keys = {}
-- The watcher's pod-event batch delay (`kjob_core::SYNC_JOB_BATCH_PERIOD`) in ms.
local BATCH_MS = 1000
local i = rec_at + nrec
while i <= #ARGV do
  local item, delay, only = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local nobs, nview, writer = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), ARGV[i + 5]
  local prio = ARGV[i + 6]
  local obs_at, view_at = i + 7, i + 7 + 3 * nobs
  local ek, vk = k, k + 5
  if nobs > 0 or nview > 0 then k = k + 5 end
  if nview > 0 then
    k = k + 4
    view_keys[item] = ek
    if session_accepts(session(), writer) then
      apply_view(KEYS[vk], KEYS[vk + 1], KEYS[vk + 2], KEYS[vk + 3], STATS, gc_ms, writer, ARGV,
        view_at, nview)
    elseif not current_session then
      -- No session at all: this Redis lost it (restarted from an older state). The writer
      -- must begin a new one.
      view_lost = 1
    end
  end
  if nobs > 0 then
    local e = KEYS
    observed = observed + observe(e[ek], e[ek + 1], e[ek + 2], e[ek + 4], gc_ms, ARGV, obs_at, nobs)
  end
  if only == '0' then
    -- Before the enqueue: a delayed item is scored with it when it is promoted.
    local hs = set_prio(item, prio)
    if delay > 0 then
      local changed = add_after(item, delay)
      added = added + changed
      -- A pod event's batch delay is the happy path: only a longer delay that moved the due
      -- time (a pod-failure backoff, a deadline) goes into the history.
      if changed == 1 and delay > BATCH_MS then hist(item, 'e|' .. now .. '|' .. delay .. '|' .. nobs) end
    elseif not seen[item] then
      seen[item] = true
      now_items[#now_items + 1] = item
      now_hs[item] = hs
    else
      now_hs[item] = hs
    end
  end
  i = i + 7 + 3 * nobs + 4 * nview
end
-- Immediate adds of the whole batch: one HMGET finds the leased ones (they become dirty), one
-- ZADD NX enqueues the rest; per-item commands would cost Redis more than the script itself.
if #now_items > 0 then
  local recs = chunked('HMGET', LEASE, now_items, 1000)
  local per_ns, namespaces = {}, {}
  for j, item in ipairs(now_items) do
    if recs[j] then
      local a = add_now(item, now)
      added, accepted = added + a, accepted + a
    else
      local ns = ns_of(item)
      local z = per_ns[ns]
      if not z then
        z = {}
        per_ns[ns] = z
        namespaces[#namespaces + 1] = ns
      end
      local hs = now_hs[item]
      z[#z + 1] = hs == 0 and now_s or now - hs
      z[#z + 1] = item
    end
  end
  -- A namespace joins the round robin when its set was empty, that is when it is not in the
  -- list (it is there exactly while its set is not empty). A short list is read whole, once;
  -- a long one is asked about per namespace (ZCARD after the ZADD). Nothing above writes the
  -- list, so its length is still the prelude's.
  local listed, joining = false, {}
  local len = ready_len0
  if len <= 2 * #namespaces then
    listed = {}
    if len > 0 then
      for _, ns in ipairs(redis.call('LRANGE', RR, 0, -1)) do listed[ns] = true end
    end
  end
  for _, ns in ipairs(namespaces) do
    local z, k, n = per_ns[ns], rkey(ns), 0
    for s = 1, #z, 2000 do
      n = n + redis.call('ZADD', k, 'NX', unpack(z, s, math.min(s + 1999, #z)))
    end
    if n > 0 then
      local was_empty
      if listed then was_empty = not listed[ns] else was_empty = redis.call('ZCARD', k) == n end
      if was_empty then joining[#joining + 1] = ns end
    end
    added, accepted, readied = added + n, accepted + n, readied + n
  end
  if #joining > 0 then redis.call('RPUSH', RR, unpack(joining)) end
end
-- Hand-off: the replica's own waiting lessees, in the order they began waiting, lease what
-- became ready in this same script (no wake-up, no second script). Only what they leave is
-- announced to other replicas' waiters through the wake marker.
local handed, given = 0, {}
for w = 1, takers do
  local got = {}
  if readied > 0 and handed < readied then
    local a = 5 + 4 * (w - 1)
    handed = handed + grant(ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), got)
    if ARGV[a + 3] == '1' then
      for _, g in ipairs(got) do
        local e = view_keys[g[1]]
        -- A large view is left to GET_VIEW, which reads its pods outside Lua.
        if e and redis.call('HLEN', KEYS[e + 6]) <= HANDOFF_VIEW_MAX_PODS then
          g[#g + 1] = read_view(session(), KEYS[e + 5], KEYS[e + 6], KEYS[e + 7], KEYS[e],
            KEYS[e + 2], KEYS[e + 3], now, ARGV, rec_at, nrec, true)
        end
      end
    end
  end
  given[#given + 1] = got
end
if readied > 0 and (handed == 0 or any_ready()) then wake() end
flush_index()
local out = {added, accepted, now, observed, view_lost, mark_at, woke}
for _, got in ipairs(given) do out[#out + 1] = got end
return out
"#
);

static ADD_SCRIPT: Lua = Lua::new("add", ADD);

/// Most pods the view of a hand-off may hold for ADD to read it (a Job's first sync: one pod or
/// none). A larger view is left out of the hand-off, and the queue service reads it with
/// GET_VIEW, whose pods do not pass through Lua (see [`Store::run_then_read`]).
pub const HANDOFF_VIEW_MAX_PODS: usize = 16;

/// A waiting lessee an Add may lease to directly (see [`crate::Waker`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taker {
    /// Its worker id.
    pub worker: String,
    /// Most items it takes.
    pub n: u32,
    /// Its lease duration.
    pub lease: Duration,
    /// On the job queue: the records its server reads with each leased key's view (the view
    /// comes with a hand-off); `None`: no views.
    pub view_records: Option<Vec<String>>,
}

/// ADD's reply.
pub(crate) struct AddReply {
    /// What the Add did.
    pub outcome: AddOutcome,
    /// Redis time of the script.
    pub now_ms: i64,
    /// What each taker was leased, in the takers' order.
    pub handed: Vec<Vec<Leased>>,
    /// For the shard's index (see `queue_fns!`).
    mark_at: i64,
    woke: bool,
}

impl AddReply {
    /// Reads ADD's reply for `takers`, the views of hand-offs with the `records` asked.
    fn parse(store: &Store, v: &Value, takers: usize, records: &[String]) -> Result<Self, WqError> {
        let mut f = Fields::new("add", v)?;
        let added = f.count("added")?;
        let accepted_now = f.count("accepted_now")?;
        let now_ms = f.int("now")?;
        let observed = f.count("observed")?;
        let view_lost = f.flag("view_lost")?;
        let (mark_at, woke) = super::shards::read_mark(&mut f)?;
        let handed_item = |mut f: Fields<'_>| {
            let mut leased = Leased::parse(&mut f)?;
            if f.remaining() > 0 {
                leased.view = Some(store.handoff_view_reply(f.array("view")?, records)?);
            }
            Ok(leased)
        };
        let handed = f
            .rest("handed")?
            .into_iter()
            .map(|t| t.rest("lease item")?.into_iter().map(handed_item).collect())
            .collect::<Result<Vec<Vec<Leased>>, WqError>>()?;
        if handed.len() != takers {
            return Err(WqError::Protocol(format!(
                "add: hand-offs for {} takers, {takers} asked",
                handed.len()
            )));
        }
        let outcome = AddOutcome { added, accepted_now, delayed: 0, observed, view_lost };
        Ok(Self { outcome, now_ms, handed, mark_at, woke })
    }
}

impl Store {
    /// Adds a batch to `queue`: immediate items join the ready set (or mark a leased item
    /// dirty), delayed items keep their earliest due time. On the `job` queue each item's
    /// observations are applied in the same script as its enqueue (atomically, before it); on
    /// another queue they are applied first by a separate script on the job queue's slot.
    pub async fn add(&self, queue: &str, items: &[Enqueue]) -> Result<AddOutcome, WqError> {
        Ok(self.add_handing(queue, items, &[]).await?.outcome)
    }

    /// [`Store::add`], then leases what became ready to `takers` in the same script. Items are
    /// grouped by shard, one script per shard touched (run concurrently); the takers go to the
    /// shard with the most immediate items, the others wake waiters through the index.
    pub(crate) async fn add_handing(
        &self,
        queue: &str,
        items: &[Enqueue],
        takers: &[Taker],
    ) -> Result<AddReply, WqError> {
        let nothing = |observed| AddReply {
            outcome: AddOutcome { observed, ..AddOutcome::default() },
            now_ms: 0,
            handed: vec![Vec::new(); takers.len()],
            mark_at: -1,
            woke: false,
        };
        if items.is_empty() {
            return Ok(nothing(0));
        }
        let mut observed = 0;
        let same_slot = queue == kjob_core::JOB_QUEUE;
        if !same_slot {
            for it in items.iter().filter(|it| !it.observations.is_empty()) {
                observed += self.observe(&it.key, &it.observations).await?;
            }
        }
        let mut groups: std::collections::BTreeMap<u32, Vec<&Enqueue>> = Default::default();
        for it in items {
            let has_state = same_slot && (!it.observations.is_empty() || !it.view.is_empty());
            if it.observe_only && !has_state {
                continue;
            }
            groups.entry(self.layout().shard_of(&it.key)).or_default().push(it);
        }
        if groups.is_empty() {
            return Ok(nothing(observed));
        }
        let immediate = |g: &[&Enqueue]| {
            g.iter().filter(|e| !e.observe_only && crate::store::ms(e.delay) == 0).count()
        };
        let taker_shard = groups.iter().max_by_key(|(_, g)| immediate(g)).map(|(s, _)| *s);
        let calls = groups.into_iter().map(|(shard, group)| {
            let t: &[Taker] = if Some(shard) == taker_shard { takers } else { &[] };
            async move {
                let r = self.add_shard(queue, shard, &group, t).await?;
                self.mark(queue, shard, r.mark_at, r.woke).await?;
                Ok::<_, WqError>((shard, r))
            }
        });
        let mut out = nothing(observed);
        for r in futures::future::join_all(calls).await {
            let (shard, r) = r?;
            let o = &mut out.outcome;
            o.added += r.outcome.added;
            o.accepted_now += r.outcome.accepted_now;
            o.delayed += r.outcome.delayed;
            o.observed += r.outcome.observed;
            o.view_lost |= r.outcome.view_lost;
            out.now_ms = out.now_ms.max(r.now_ms);
            if Some(shard) == taker_shard {
                out.handed = r.handed;
            }
        }
        Ok(out)
    }

    /// ADD on shard `shard` of `queue` for `items` (all of that shard).
    async fn add_shard(
        &self,
        queue: &str,
        shard: u32,
        items: &[&Enqueue],
        takers: &[Taker],
    ) -> Result<AddReply, WqError> {
        let same_slot = queue == kjob_core::JOB_QUEUE;
        let tag = self.layout().tag(queue, shard);
        let mut keys = QueueKeys::new(&tag).to_vec();
        let mut args = Vec::with_capacity(2 + items.len() * 6);
        args.push(self.config().idle_gc.arg());
        // The view session keys carry the shard's tag of the job queue, so only that queue's
        // script may name them (one slot per script on a Cluster); view writes go to the job
        // queue only.
        if same_slot {
            args.push(b"1".to_vec());
            keys.push(view_session_key(&tag));
            keys.push(view_run_key(&tag));
        } else {
            args.push(b"0".to_vec());
        }
        args.push(self.weights_arg().await?.into_bytes());
        args.push(takers.len().arg());
        // One list of records per script: takers that asked for another list (none do: every
        // worker asks for the same) read their views themselves.
        let records: &[String] = match takers.iter().find_map(|t| t.view_records.as_ref()) {
            Some(r) if same_slot => r,
            _ => &[],
        };
        for t in takers {
            let views = same_slot && t.view_records.as_deref() == Some(records);
            args.push(t.worker.arg());
            args.push(t.n.arg());
            args.push(t.lease.arg());
            args.push(if views { b"1".to_vec() } else { b"0".to_vec() });
        }
        args.push(records.len().arg());
        args.extend(records.iter().map(Arg::arg));
        let mut delayed = 0;
        for it in items {
            let obs: &[Observation] = if same_slot { &it.observations } else { &[] };
            let view: &[ViewOp] = if same_slot { &it.view } else { &[] };
            if crate::store::ms(it.delay) > 0 && !it.observe_only {
                delayed += 1;
            }
            args.push(it.key.clone().into_bytes());
            args.push(it.delay.arg());
            args.push(if it.observe_only { b"1".to_vec() } else { b"0".to_vec() });
            args.push(obs.len().arg());
            args.push(view.len().arg());
            args.push(it.session.clone().into_bytes());
            args.push(crate::ops::priority::arg(it.priority, self.config().priority_aging));
            // An entry with view writes names its expectation keys too: a hand-off of its
            // item reads the view with the expectations.
            if !obs.is_empty() || !view.is_empty() {
                keys.extend(ExpKeys::new(&tag, &it.key).to_vec());
                push_observations(&mut args, obs);
            }
            if !view.is_empty() {
                keys.extend(ViewKeys::new(&tag, &it.key).to_vec());
                push_view_ops(&mut args, view);
            }
        }
        // On a single server the script marks the index itself (see `flush_index`).
        if !self.target().is_cluster() {
            keys.extend(crate::keys::IndexKeys::new(queue).to_vec());
        }
        let v: Value = self.run(&ADD_SCRIPT, &keys, args).await?;
        let mut r = AddReply::parse(self, &v, takers.len(), records)?;
        r.outcome.delayed = delayed;
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_knows_the_watchers_batch_delay() {
        let ms = kjob_core::SYNC_JOB_BATCH_PERIOD.as_millis();
        assert!(ADD.contains(&format!("local BATCH_MS = {ms}\n")), "ADD's BATCH_MS is {ms}");
    }

    #[test]
    fn the_script_uses_the_handoff_view_limit() {
        let line = format!("local HANDOFF_VIEW_MAX_PODS = {HANDOFF_VIEW_MAX_PODS}\n");
        assert!(ADD.contains(&line), "ADD defines {line:?}");
    }
}
