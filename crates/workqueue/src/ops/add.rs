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

/// KEYS: the [`QueueKeys`]; then, with has_view, KEYS[8] the view session and KEYS[9] the view
/// run; then, in entry order, the four [`ExpKeys`] of each entry with n_obs > 0 and the three
/// [`ViewKeys`] of each with n_view > 0.
/// ARGV[1] -> gc_ms, ARGV[2] -> has_view (0/1), ARGV[3] -> n_takers, then per taker (a
/// waiting lessee of the calling replica): worker, n, lease_ms; then per entry: item,
/// delay_ms, observe_only (0/1), n_obs, n_view, session, then n_obs × (kind, job_uid, pod_uid)
/// and n_view × (kind, name, object, resource_version).
/// Reply: [`AddReply`] `{added, accepted_now, now, observed, view_lost, {lease item…} per
/// taker}` (view_lost 1 when view writes found no current session: the writer must begin a new
/// one; a lease item as LEASE returns it).
///
/// View writes are applied before the observations of their item, and both before its enqueue,
/// in the same script: a worker that leases the key and sees an observation also sees the pod
/// it was made from, and no crash can apply one without the other.
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

local gc_ms = ARGV[1]
local added, accepted, readied, observed, k = 0, 0, 0, 0, 8
-- The current view session, read the first time an entry carries view writes (INFO costs).
local has_view, session_read, current_session, view_lost = ARGV[2] == '1', false, false, 0
if has_view then k = 10 end
local now_items, seen = {}, {}
local takers = tonumber(ARGV[3])
local i = 4 + 3 * takers
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
-- Hand-off: the replica's own waiting lessees, in the order they began waiting, lease what
-- became ready in this same script (no wake-up, no second script). Only what they leave is
-- announced to other replicas' waiters through the wake marker.
local out, handed = {added, accepted, now, observed, view_lost}, 0
for w = 1, takers do
  local got = {}
  if readied > 0 and handed < readied then
    local a = 4 + 3 * (w - 1)
    handed = handed + grant(ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), got)
  end
  out[#out + 1] = got
end
if readied > 0 and (handed == 0 or redis.call('ZCARD', READY) > 0) then wake() end
return out
"#
);

static ADD_SCRIPT: Lua = Lua::new("add", ADD);

/// A waiting lessee an Add may lease to directly (see [`crate::Waker`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taker {
    /// Its worker id.
    pub worker: String,
    /// Most items it takes.
    pub n: u32,
    /// Its lease duration.
    pub lease: Duration,
}

/// ADD's reply.
pub(crate) struct AddReply {
    /// What the Add did.
    pub outcome: AddOutcome,
    /// Redis time of the script.
    pub now_ms: i64,
    /// What each taker was leased, in the takers' order.
    pub handed: Vec<Vec<Leased>>,
}

impl AddReply {
    fn parse(v: &Value, takers: usize) -> Result<Self, WqError> {
        let mut f = Fields::new("add", v)?;
        let added = f.count("added")?;
        let accepted_now = f.count("accepted_now")?;
        let now_ms = f.int("now")?;
        let observed = f.count("observed")?;
        let view_lost = f.flag("view_lost")?;
        let handed = f
            .rest("handed")?
            .into_iter()
            .map(|t| t.rest("lease item")?.into_iter().map(Leased::parse).collect())
            .collect::<Result<Vec<Vec<Leased>>, WqError>>()?;
        if handed.len() != takers {
            return Err(WqError::Protocol(format!(
                "add: hand-offs for {} takers, {takers} asked",
                handed.len()
            )));
        }
        let outcome = AddOutcome { added, accepted_now, delayed: 0, observed, view_lost };
        Ok(Self { outcome, now_ms, handed })
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

    /// [`Store::add`], then leases what became ready to `takers` in the same script.
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
        let mut keys = QueueKeys::new(queue).to_vec();
        let mut args = Vec::with_capacity(2 + items.len() * 6);
        args.push(self.config().idle_gc.arg());
        // The view session key carries the job queue's hash tag, so only that queue's script
        // may name it (one slot per script on a Cluster); view writes go to the job queue only.
        if same_slot {
            args.push(b"1".to_vec());
            keys.push(view_session_key());
            keys.push(view_run_key());
        } else {
            args.push(b"0".to_vec());
        }
        args.push(takers.len().arg());
        for t in takers {
            args.push(t.worker.arg());
            args.push(t.n.arg());
            args.push(t.lease.arg());
        }
        let mut delayed = 0;
        let mut entries = 0;
        for it in items {
            let obs: &[Observation] = if same_slot { &it.observations } else { &[] };
            let view: &[ViewOp] = if same_slot { &it.view } else { &[] };
            if it.observe_only && obs.is_empty() && view.is_empty() {
                continue;
            }
            entries += 1;
            if crate::store::ms(it.delay) > 0 && !it.observe_only {
                delayed += 1;
            }
            args.push(it.key.clone().into_bytes());
            args.push(it.delay.arg());
            args.push(if it.observe_only { b"1".to_vec() } else { b"0".to_vec() });
            args.push(obs.len().arg());
            args.push(view.len().arg());
            args.push(it.session.clone().into_bytes());
            if !obs.is_empty() {
                keys.extend(ExpKeys::new(&it.key).to_vec());
                push_observations(&mut args, obs);
            }
            if !view.is_empty() {
                keys.extend(ViewKeys::new(&it.key).to_vec());
                push_view_ops(&mut args, view);
            }
        }
        if entries == 0 {
            return Ok(nothing(observed));
        }
        let v: Value = self.run(&ADD_SCRIPT, &keys, args).await?;
        let mut r = AddReply::parse(&v, takers.len())?;
        r.outcome.delayed = delayed;
        r.outcome.observed += observed;
        Ok(r)
    }
}
