//! DONE: finishing leases, several in one script call.

use std::time::Duration;

use redis::Value;

use crate::WqError;
use crate::keys::queue_prelude;
use crate::lua::Arg;
use crate::lua::Lua;
use crate::lua::queue_fns;
use crate::reply::Fields;
use crate::store::{Done, DoneResult, LeaseOutcome, MAX_DONE_BATCH, Store};

/// KEYS: the [`QueueKeys`] of one shard (every Done's item is of that shard).
/// ARGV[1] -> base_ms, ARGV[2] -> max_ms, then per Done: item, lease_id, outcome (1 forget,
/// 2 rate limited, 3 requeue after), after_ms, error (the sync's, truncated, for the history).
/// Writes the item's last Done into the shard's last-sync hash (one HSET per batch) and, off
/// the happy path only, an entry to its history (see `hist` in `queue_fns!`).
/// Reply: `{now, mark_at, woke, {work_ms, ready_at (-1 = not requeued), delay_used (-1 = none)}…}` with one
/// triple per Done, work_ms -1 for a stale lease id (that Done changed nothing).
///
/// Several Dones share one script call (the service batches concurrent calls): the call's own
/// cost, not the per-item commands, dominates Redis CPU per item. Items are handled in order; a
/// second Done of one lease in the same batch is stale, as it would be one call later.
const DONE: &str = concat!(
    queue_prelude!(),
    queue_fns!(),
    r#"
local base, max = tonumber(ARGV[1]), tonumber(ARGV[2])
local items = {}
for i = 3, #ARGV, 5 do items[#items + 1] = ARGV[i] end
local recs = redis.call('HMGET', LEASE, unpack(items))
local any_delayed = redis.call('ZCARD', DELAYED) > 0
local rows, finished, gone, last = {}, {}, {}, {}
-- The last-Done entry is written for every Done, so it is built from strings as read: the
-- time once per call, the start as the lease record has it, each worker's length once.
local head, wklen = 'd|' .. now_s .. '|', {}
for j, item in ipairs(items) do
  local a = 3 + 5 * (j - 1)
  local id, outcome = ARGV[a + 1], tonumber(ARGV[a + 2])
  -- As text: only the start is used as a number (the work time); the counts are compared
  -- with '0' and the dirty time with '-1' (Lua's number parsing costs per field).
  local lid, started_s, req, ex, dt, wk
  if recs[j] and not finished[item] then
    lid, started_s, req, ex, dt, wk = unpack_lease_text(recs[j])
  end
  if lid ~= id then
    redis.call('HINCRBY', STATS, 'stale_total', 1)
    rows[#rows + 1] = {-1, -1, -1}
  else
    finished[item] = true
    gone[#gone + 1] = item
    -- A Done ends the run of lease expiries (poison detection). The record says whether there
    -- is anything to delete, which saves a command on the common path.
    if ex ~= '0' and redis.call('HDEL', FAILURES, xfield(item)) == 1 then
      redis.call('HINCRBY', STATS, 'expiring', -1)
    end
    local delay = -1
    if outcome == 2 then
      delay = backoff(item, base, max)
    else
      -- Forget (also for requeue-after, a success). Only the holder changes the count while
      -- the key is leased, so the count read at lease time tells whether there is one.
      if req ~= '0' then redis.call('HDEL', FAILURES, item) end
      if outcome == 3 then delay = tonumber(ARGV[a + 3]) end
    end
    local ready_at = -1
    local dirty = dt ~= '-1'
    if dirty or delay == 0 then
      ready_add(item, dirty and tonumber(dt) or now)
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
    -- Gone from the queue: so is its priority.
    if ready_at < 0 then forget_prio(item) end
    rows[#rows + 1] = {now - tonumber(started_s), ready_at, delay}
    local wl = wklen[wk]
    if not wl then
      wl = #wk .. '|'
      wklen[wk] = wl
    end
    local delay_s = '-1|'
    if delay >= 0 then delay_s = delay .. '|' end
    local entry = head .. started_s .. '|' .. ARGV[a + 2] .. '|' .. delay_s .. wl .. wk .. ARGV[a + 4]
    last[#last + 1] = item
    last[#last + 1] = entry
    -- Happy: a success after a success. An error, a requeue-after, or the first success after
    -- errors or expiries is history.
    if outcome ~= 1 or req ~= '0' or ex ~= '0' then hist(item, entry) end
  end
end
if #gone > 0 then
  redis.call('ZREM', LEASES, unpack(gone))
  redis.call('HDEL', LEASE, unpack(gone))
  local lk = last_key_now()
  redis.call('HSET', lk, unpack(last))
  -- Two generations: a generation's hash outlives its last write by one more.
  redis.call('PEXPIRE', lk, 2 * LAST_GEN_MS)
end
flush_index()
local out = {now, mark_at, woke}
for _, r in ipairs(rows) do out[#out + 1] = r end
return out
"#
);

static DONE_SCRIPT: Lua = Lua::new("done", DONE);

/// Most bytes of a sync's error kept in its history entry: enough for a Kubernetes API error's
/// message, while 50 entries of a failing Job stay a few KiB.
pub const HISTORY_ERROR_MAX: usize = 256;

/// `error` cut to [`HISTORY_ERROR_MAX`] bytes at a character boundary.
fn truncate_error(error: &str) -> &str {
    if error.len() <= HISTORY_ERROR_MAX {
        return error;
    }
    let mut end = HISTORY_ERROR_MAX;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    &error[..end]
}

/// DONE's reply: one result per Done, `None` for a stale lease id; and the shard's mark.
type DoneReply = (Vec<Option<DoneResult>>, i64, bool);

fn parse_done(v: &Value, dones: usize) -> Result<DoneReply, WqError> {
    let mut f = Fields::new("done", v)?;
    let now_ms = f.int("now")?;
    let (mark_at, woke) = super::shards::read_mark(&mut f)?;
    let rows = f.rest("done item")?;
    if rows.len() != dones {
        return Err(WqError::Protocol(format!("done: {} results for {dones} Dones", rows.len())));
    }
    let results = rows
        .into_iter()
        .map(|mut r| {
            let work_ms = r.int("work_ms")?;
            if work_ms < 0 {
                return Ok(None);
            }
            Ok(Some(DoneResult {
                work_ms,
                ready_at_ms: r.opt("ready_at")?,
                now_ms,
                retry_delay_ms: r.opt("delay_used")?,
            }))
        })
        .collect::<Result<_, WqError>>()?;
    Ok((results, mark_at, woke))
}

impl Store {
    /// Finishes a lease; `None` when `lease_id` is stale (nothing changed).
    pub async fn done(
        &self,
        queue: &str,
        key: &str,
        lease_id: &str,
        outcome: LeaseOutcome,
    ) -> Result<Option<DoneResult>, WqError> {
        let done = Done {
            key: key.to_string(),
            lease_id: lease_id.to_string(),
            outcome,
            error: String::new(),
        };
        let mut r = self.done_many(queue, std::slice::from_ref(&done)).await?;
        Ok(r.pop().flatten())
    }

    /// Finishes several leases of `queue` in one script call, in order; one result per Done
    /// (`None` = stale id, nothing changed). At most [`MAX_DONE_BATCH`] at a time.
    pub async fn done_many(
        &self,
        queue: &str,
        dones: &[Done],
    ) -> Result<Vec<Option<DoneResult>>, WqError> {
        if dones.is_empty() {
            return Ok(Vec::new());
        }
        if dones.len() > MAX_DONE_BATCH {
            return Err(WqError::Config(format!(
                "{} Dones in one call; the limit is {MAX_DONE_BATCH}",
                dones.len()
            )));
        }
        // One script per shard touched, run concurrently; results back in the Dones' order.
        let limiter = &self.config().limiter;
        let mut by_shard: std::collections::BTreeMap<u32, (Vec<Vec<u8>>, Vec<usize>)> =
            Default::default();
        for (at, d) in dones.iter().enumerate() {
            let (args, order) = by_shard
                .entry(self.layout().shard_of(&d.key))
                .or_insert_with(|| (vec![limiter.base.arg(), limiter.max.arg()], Vec::new()));
            let (code, after) = match d.outcome {
                LeaseOutcome::Forget => (1, Duration::ZERO),
                LeaseOutcome::RateLimited => (2, Duration::ZERO),
                LeaseOutcome::RequeueAfter(t) => (3, t),
            };
            args.push(d.key.arg());
            args.push(d.lease_id.arg());
            args.push(code.arg());
            args.push(after.arg());
            args.push(truncate_error(&d.error).arg());
            order.push(at);
        }
        let calls = by_shard.into_iter().map(|(shard, (args, order))| async move {
            let mut keys = self.queue_keys(queue, shard).to_vec();
            // On a single server the script marks the index itself (see `flush_index`).
            if !self.target().is_cluster() {
                keys.extend(crate::keys::IndexKeys::new(queue).to_vec());
            }
            let v: Value = self.run(&DONE_SCRIPT, &keys, args).await?;
            let (results, at, woke) = parse_done(&v, order.len())?;
            self.mark(queue, shard, at, woke).await?;
            Ok::<_, WqError>((results, order))
        });
        let mut out = vec![None; dones.len()];
        for r in futures::future::join_all(calls).await {
            let (results, order) = r?;
            for (at, res) in order.into_iter().zip(results) {
                out[at] = res;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_cut_at_a_character_boundary() {
        assert_eq!(truncate_error("short"), "short");
        let long = "é".repeat(HISTORY_ERROR_MAX);
        let cut = truncate_error(&long);
        assert!(cut.len() <= HISTORY_ERROR_MAX && cut.len() >= HISTORY_ERROR_MAX - 1);
        assert!(long.starts_with(cut));
    }

    #[test]
    fn a_done_reply_of_the_wrong_length_is_refused_not_misread() {
        let row = |w, r, d| Value::Array(vec![Value::Int(w), Value::Int(r), Value::Int(d)]);
        let head = [Value::Int(100), Value::Int(-1), Value::Int(0)];
        let v = Value::Array([&head[..], &[row(5, 100, 0), row(-1, -1, -1)]].concat());
        let r = parse_done(&v, 2).unwrap().0;
        assert_eq!(r[0].unwrap().ready_at_ms, Some(100));
        assert_eq!(r[1], None);
        assert!(parse_done(&v, 3).unwrap_err().to_string().contains("2 results for 3 Dones"));
        let short = Value::Array([&head[..], &[Value::Array(vec![Value::Int(5)])]].concat());
        assert!(parse_done(&short, 1).unwrap_err().to_string().contains("ready_at"));
    }
}
