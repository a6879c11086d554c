//! The shared part of client-go's event correlator (`tools/record/events_cache.go`): the
//! aggregator (`EventAggregator`: similar events combined) and the spam filter
//! (`EventSourceObjectSpamFilter`: a token bucket per source and object), kept in Redis per
//! involved object so that every worker sees one bucket and one aggregation record per Job.
//! Counting repeats (`eventLogger`) stays with the writers: it is the API server's count.

use std::time::Duration;

use kjob_core::events::{AGGREGATE_INTERVAL, AGGREGATE_MAX_EVENTS, SPAM_BURST, SPAM_REFILL_PERIOD};
use redis::Value;

use crate::lua::Arg;
use crate::lua::Lua;
use crate::{Store, WqError};

/// The correlator's parameters; [`Default`] is client-go's. Tests shorten the periods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventGateConfig {
    /// Events an object may have at once (the bucket's size).
    pub burst: u32,
    /// Time to regain one event's allowance.
    pub refill_interval: Duration,
    /// Similar events (distinct messages) seen before they are combined.
    pub aggregate_max_events: u32,
    /// Quiet time after which an object's similar events start over.
    pub aggregate_interval: Duration,
}

impl Default for EventGateConfig {
    fn default() -> Self {
        Self {
            burst: SPAM_BURST,
            refill_interval: SPAM_REFILL_PERIOD,
            aggregate_max_events: AGGREGATE_MAX_EVENTS,
            aggregate_interval: AGGREGATE_INTERVAL,
        }
    }
}

impl EventGateConfig {
    /// How long an object's state must be kept: after this long untouched its bucket is full
    /// again and its aggregation records are stale, which is what no state means.
    pub fn state_ttl(&self) -> Duration {
        self.aggregate_interval
            .max(self.refill_interval.saturating_mul(self.burst))
            .saturating_add(Duration::from_secs(1))
    }
}

pub use kjob_core::events::{GateEvent, Gated};

/// The hash holding the correlator state of involved object `object_key`, under the tag of its
/// shard of the `job` queue like every per-Job record.
pub(crate) fn event_state_key(layout: &crate::Layout, object_key: &str) -> String {
    format!("{}:ev:{object_key}", layout.job_tag(object_key))
}

/// KEYS[i] -> `<shard tag>:ev:<object key>`: hash of one object's state, fields
///            `a:<aggregate key>` -> `<last ms>|<json array of messages>` (aggregation record)
///            `b:<spam key>`      -> `<tokens>|<last refill ms>` (token bucket)
/// ARGV[1] -> burst, ARGV[2] -> refill interval ms (one token), ARGV[3] -> aggregate max events,
/// ARGV[4] -> aggregate interval ms, ARGV[5] -> state ttl ms (PEXPIRE of each touched hash),
/// then per event: key index (into KEYS), spam key, aggregate key, message.
/// Returns per event `{allowed, aggregated}` (0/1 each). Time is Redis `TIME`.
///
/// As client-go's `EventCorrelate`: the aggregation record is updated first (also for an
/// event the filter then drops), then the object's bucket refills continuously up to the burst
/// and gives one token if it has one.
const GATE_EVENTS: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local burst, refill = tonumber(ARGV[1]), tonumber(ARGV[2])
local max_events, interval, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local out, touched = {}, {}
for i = 6, #ARGV, 4 do
  local key = KEYS[tonumber(ARGV[i])]
  local spam, agg, msg = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  -- EventAggregate
  local afield = 'a:' .. agg
  local last, msgs = nil, {}
  local raw = redis.call('HGET', key, afield)
  if raw then
    local sep = string.find(raw, '|', 1, true)
    last = tonumber(string.sub(raw, 1, sep - 1))
    msgs = cjson.decode(string.sub(raw, sep + 1))
  end
  if last == nil or now - last > interval then msgs = {} end
  local seen = false
  for _, m in ipairs(msgs) do
    if m == msg then seen = true break end
  end
  if not seen then msgs[#msgs + 1] = msg end
  local aggregated = 0
  if #msgs >= max_events then
    aggregated = 1
    -- do not grow the set beyond the threshold (client-go pops any one: the oldest here)
    table.remove(msgs, 1)
  end
  local enc = '[]'
  if #msgs > 0 then enc = cjson.encode(msgs) end
  redis.call('HSET', key, afield, now .. '|' .. enc)
  -- EventSourceObjectSpamFilter
  local bfield = 'b:' .. spam
  local tokens, at = burst, now
  local b = redis.call('HGET', key, bfield)
  if b then
    local sep = string.find(b, '|', 1, true)
    tokens = tonumber(string.sub(b, 1, sep - 1))
    at = tonumber(string.sub(b, sep + 1))
  end
  if now > at then
    tokens = math.min(burst, tokens + (now - at) / refill)
    at = now
  end
  local allowed = 0
  if tokens >= 1 then
    tokens = tokens - 1
    allowed = 1
  end
  redis.call('HSET', key, bfield, string.format('%.17g', tokens) .. '|' .. at)
  touched[key] = true
  out[#out + 1] = {allowed, aggregated}
end
for k in pairs(touched) do redis.call('PEXPIRE', k, ttl) end
return out
"#;

static GATE_EVENTS_SCRIPT: Lua = Lua::new("gate_events", GATE_EVENTS);

fn ms(d: Duration) -> Vec<u8> {
    d.as_millis().max(1).to_string().into_bytes()
}

fn protocol(v: &Value) -> WqError {
    WqError::Protocol(format!("gate_events: {v:?}"))
}

fn flag(v: &Value) -> Result<bool, WqError> {
    match v {
        Value::Int(i) => Ok(*i != 0),
        other => Err(protocol(other)),
    }
}

impl Store {
    /// Passes `events` (in the order they were recorded) through the shared aggregator and
    /// spam filter, in one script: one answer per event, in order.
    pub async fn gate_events(
        &self,
        events: &[GateEvent],
        config: &EventGateConfig,
    ) -> Result<Vec<Gated>, WqError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // One script per shard touched, each with its events in their order; run concurrently.
        // Per shard: its keys, its script's arguments, and the events' places in `events`.
        type Call = (Vec<String>, Vec<Vec<u8>>, Vec<usize>);
        let mut by_shard: std::collections::BTreeMap<u32, Call> = Default::default();
        for (at, ev) in events.iter().enumerate() {
            let (keys, args, order) =
                by_shard.entry(self.layout().shard_of(&ev.object_key)).or_insert_with(|| {
                    let args = vec![
                        config.burst.arg(),
                        ms(config.refill_interval),
                        config.aggregate_max_events.arg(),
                        ms(config.aggregate_interval),
                        ms(config.state_ttl()),
                    ];
                    (Vec::new(), args, Vec::new())
                });
            let key = event_state_key(self.layout(), &ev.object_key);
            let index = match keys.iter().position(|k| *k == key) {
                Some(i) => i + 1,
                None => {
                    keys.push(key);
                    keys.len()
                }
            };
            args.push(index.arg());
            args.push(ev.spam_key.arg());
            args.push(ev.aggregate_key.arg());
            args.push(ev.message.arg());
            order.push(at);
        }
        let calls = by_shard.into_values().map(|(keys, args, order)| async move {
            let v: Value = self.run(&GATE_EVENTS_SCRIPT, &keys, args).await?;
            Ok::<_, WqError>((v, order))
        });
        let mut out: Vec<Option<Gated>> = vec![None; events.len()];
        for r in futures::future::join_all(calls).await {
            let (v, order) = r?;
            let Value::Array(answers) = &v else { return Err(protocol(&v)) };
            if answers.len() != order.len() {
                return Err(protocol(&v));
            }
            for (at, a) in order.into_iter().zip(answers) {
                let ev = &events[at];
                out[at] = Some(match a {
                    Value::Array(pair) if pair.len() == 2 => {
                        Gated::of(ev, flag(&pair[1])?, !flag(&pair[0])?)
                    }
                    other => return Err(protocol(other)),
                });
            }
        }
        out.into_iter()
            .map(|g| {
                g.ok_or_else(|| WqError::Protocol("gate_events: an event got no answer".into()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev() -> GateEvent {
        GateEvent {
            object_key: "ns/pi".into(),
            spam_key: "s".into(),
            aggregate_key: "agg".into(),
            event_key: "evt".into(),
            message: "Created pod: pi-1".into(),
        }
    }

    #[test]
    fn the_aggregated_form_is_the_aggregate_key_and_the_combined_message() {
        let g = Gated::of(&ev(), true, false);
        assert_eq!(g.key, "agg");
        assert_eq!(g.message, "(combined from similar events): Created pod: pi-1");
        let g = Gated::of(&ev(), false, true);
        assert_eq!(
            (g.key.as_str(), g.message.as_str(), g.dropped),
            ("evt", "Created pod: pi-1", true)
        );
    }

    #[test]
    fn state_outlives_both_the_refill_of_a_full_burst_and_the_aggregation_interval() {
        let c = EventGateConfig::default();
        assert_eq!(c.state_ttl(), Duration::from_secs(25 * 300 + 1));
        let short = EventGateConfig { refill_interval: Duration::from_millis(10), ..c };
        assert_eq!(short.state_ttl(), Duration::from_secs(601));
        let l = crate::Layout::default();
        assert_eq!(event_state_key(&l, "ns/pi"), format!("{}:ev:ns/pi", l.job_tag("ns/pi")));
    }
}
