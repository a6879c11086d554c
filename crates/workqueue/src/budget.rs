//! The workers' one API budget (`kjob-worker --api-qps-total/--api-burst-total`): a token bucket
//! in Redis shared by every worker, split fairly across the namespaces that ask for tokens, and
//! slowed down by the 429s kube-apiserver answers.
//!
//! Two keys outside the shards, under their own tag (one Cluster slot, so one script):
//! `{wq:budget}:bucket` and `{wq:budget}:ns` (see docs/decisions/redis-key-layout.md). Workers
//! take tokens in batches through kjob-queue, so these keys see one script per batch, not one
//! per API request.
//!
//! **Fairness.** Every namespace that asked within [`ACTIVE_WINDOW`] is *active*; with `N`
//! active namespaces and the bucket refilling at `rate`, each one's *claim* grows by `rate/N`
//! per second (up to `burst/N`), and the tokens claimed by others are never handed out. So while
//! the budget binds, each active namespace can take at least `rate/N` tokens per second
//! whatever the others ask for (one namespace's big Job cannot take the whole budget), and
//! tokens nobody claims go to whoever asks first (nothing is held back from a namespace when the
//! others are idle). The guarantee holds while `N ≤ burst` (a claim must reach one token);
//! beyond it, the tokens still never exceed the bucket.
//!
//! **429s.** A worker reports how many 429s it got since its last call. The rate then halves
//! (at most once per [`DECREASE_GAP`], so the reports of many workers about one overload count
//! once), never below [`FLOOR_SHARE`] of the configured QPS, and recovers linearly: back to
//! the configured QPS within [`RECOVERY`] without 429s ([`aimd_rate`]).

use std::time::Duration;

use redis::Value;

use crate::lua::{Arg, Lua};
use crate::{Store, WqError};

/// HASH: `tokens`, `ts` (ms of the last refill), `rate` (the current QPS after slowdowns),
/// `down` (ms of the last slowdown), `qps` and `burst` (the configured totals last seen).
pub(crate) const BUCKET_KEY: &str = "{wq:budget}:bucket";
/// HASH: namespace → `claim|last ask ms` of every active namespace.
pub(crate) const NAMESPACES_KEY: &str = "{wq:budget}:ns";
/// How long a namespace stays active after it last asked: a worker whose namespace waits for
/// tokens asks again within [`MAX_WAIT`], so only a namespace without pending requests drops
/// out, and its claim goes back to the others within this.
pub const ACTIVE_WINDOW: Duration = Duration::from_secs(2);
/// The longest wait the bucket tells a caller before it asks again (it may ask sooner).
pub const MAX_WAIT: Duration = Duration::from_secs(1);
/// Multiplicative decrease on a 429: the rate is multiplied by this.
pub const DECREASE_FACTOR: f64 = 0.5;
/// At most one decrease per this gap: the 429s of one overload reach the bucket from many
/// workers within about one retry hint (kube-apiserver's is 1 s), and count once.
pub const DECREASE_GAP: Duration = Duration::from_secs(1);
/// Lowest rate, as a share of the configured QPS: the controller keeps making progress.
pub const FLOOR_SHARE: f64 = 0.1;
/// Additive increase: without 429s the rate climbs by the configured QPS per this period (from
/// the floor back to full in 90 % of it).
pub const RECOVERY: Duration = Duration::from_secs(30);
/// Most tokens one call may ask for: far above a worker's batch (8), and a bound on what one
/// caller can take at once.
pub const MAX_TAKE: u32 = 100;
/// How long the budget's keys outlive the last call (the budget switched off leaves nothing).
const IDLE_TTL: Duration = Duration::from_secs(3600);

/// The rate after `dt` more time and, if `throttled`, a 429 report, as the TAKE script computes
/// it: linear recovery towards `qps` at `qps` per [`RECOVERY`], then (when a decrease is due)
/// `max(qps · FLOOR_SHARE, rate · DECREASE_FACTOR)`.
pub fn aimd_rate(rate: f64, qps: f64, dt: Duration, decrease: bool) -> f64 {
    let recovered = (rate + qps * dt.as_secs_f64() / RECOVERY.as_secs_f64()).min(qps);
    if decrease { (recovered * DECREASE_FACTOR).max(qps * FLOOR_SHARE) } else { recovered }
}

/// A request for tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenAsk<'a> {
    /// The namespace the requests are for (`""` for cluster-scoped ones).
    pub namespace: &'a str,
    /// Tokens wanted (1 to [`MAX_TAKE`]).
    pub want: u32,
    /// The configured total rate (requests per second).
    pub qps: f64,
    /// The configured total burst.
    pub burst: u32,
    /// 429s the caller got since its last ask.
    pub throttled: u32,
}

/// What the bucket gave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenGrant {
    /// Tokens granted (0 to `want`).
    pub granted: u32,
    /// When fewer than wanted: how long to wait before asking again.
    pub wait: Duration,
    /// The current rate (QPS) after slowdowns and recovery.
    pub rate: f64,
    /// Namespaces sharing the budget now.
    pub active_namespaces: u32,
    /// Whether this call's 429 report lowered the rate.
    pub slowed: bool,
}

/// KEYS[1] -> `{wq:budget}:bucket` (HASH tokens, ts, rate, down, qps, burst)
/// KEYS[2] -> `{wq:budget}:ns` (HASH namespace -> `claim|last ask ms`)
/// ARGV[1] -> namespace, ARGV[2] -> tokens wanted, ARGV[3] -> configured qps (milli-QPS),
/// ARGV[4] -> configured burst, ARGV[5] -> 429s reported, ARGV[6] -> active window ms,
/// ARGV[7] -> max wait ms, ARGV[8] -> decrease gap ms, ARGV[9] -> recovery ms,
/// ARGV[10] -> floor (per mille of qps), ARGV[11] -> decrease factor (per mille),
/// ARGV[12] -> idle ttl ms.
/// Returns `{granted, wait ms, rate milli-QPS, active namespaces, slowed 0/1}`.
///
/// Refill at the rate in force since the last call, AIMD (see [`aimd_rate`]), then the claims:
/// each active namespace's claim grows by its 1/N of the refill (up to burst/N); the caller may
/// take up to `max(its claim, tokens − the others' claims)`, never more than the bucket holds.
const TAKE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ns, want = ARGV[1], tonumber(ARGV[2])
local qps, burst, throttled = tonumber(ARGV[3]) / 1000, tonumber(ARGV[4]), tonumber(ARGV[5])
local window, max_wait, gap = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local recovery, floor_share = tonumber(ARGV[9]), tonumber(ARGV[10]) / 1000
local factor, ttl = tonumber(ARGV[11]) / 1000, ARGV[12]
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'rate', 'down')
local tokens, ts, rate, down = tonumber(b[1]), tonumber(b[2]), tonumber(b[3]), tonumber(b[4])
if tokens == nil or ts == nil or rate == nil then
  tokens, ts, rate, down = burst, now, qps, 0
end
down = down or 0
if rate > qps then rate = qps end
if tokens > burst then tokens = burst end
local dt = math.max(0, now - ts)
local refill = rate * dt / 1000
tokens = math.min(burst, tokens + refill)
rate = math.min(qps, rate + qps * dt / recovery)
local slowed = 0
if throttled > 0 and now - down >= gap then
  rate = math.max(qps * floor_share, rate * factor)
  down = now
  slowed = 1
end
-- the active namespaces and their claims
local raw = redis.call('HGETALL', KEYS[2])
local names, claims, asked = {}, {}, {}
local gone = {}
for i = 1, #raw, 2 do
  local name, v = raw[i], raw[i + 1]
  local sep = string.find(v, '|', 1, true)
  local c, last = tonumber(string.sub(v, 1, sep - 1)), tonumber(string.sub(v, sep + 1))
  if name == ns or now - last <= window then
    names[#names + 1] = name
    claims[name], asked[name] = c, last
  else
    gone[#gone + 1] = name
  end
end
if claims[ns] == nil then
  names[#names + 1] = ns
  claims[ns] = 0
end
asked[ns] = now
local n = #names
local cap = burst / n
local others = 0
for _, name in ipairs(names) do
  local c = math.min(cap, claims[name] + refill / n)
  claims[name] = c
  if name ~= ns then others = others + c end
end
local mine = claims[ns]
local avail = math.min(tokens, math.max(mine, tokens - others))
local granted = math.max(0, math.min(want, math.floor(avail + 1e-9)))
tokens = tokens - granted
claims[ns] = math.max(0, mine - granted)
local wait = 0
if granted < want then
  -- the caller's claim reaches one more token within n / rate seconds
  local short = math.max(0, 1 - (avail - granted))
  wait = math.min(max_wait, math.max(1, math.ceil(1000 * short * n / rate)))
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', now,
  'rate', string.format('%.17g', rate), 'down', down, 'qps', string.format('%.17g', qps),
  'burst', burst)
local fields = {}
for _, name in ipairs(names) do
  fields[#fields + 1] = name
  fields[#fields + 1] = string.format('%.17g', claims[name]) .. '|' .. asked[name]
end
-- in slices: Lua's unpack takes a few thousand values at most
for i = 1, #fields, 1000 do
  redis.call('HSET', KEYS[2], unpack(fields, i, math.min(#fields, i + 999)))
end
for i = 1, #gone, 1000 do
  redis.call('HDEL', KEYS[2], unpack(gone, i, math.min(#gone, i + 999)))
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return {granted, wait, math.floor(rate * 1000), n, slowed}
"#;

static TAKE_SCRIPT: Lua = Lua::new("take_api_tokens", TAKE);

fn int(v: &Value) -> Result<i64, WqError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(WqError::Protocol(format!("take_api_tokens: {other:?}"))),
    }
}

impl Store {
    /// Takes up to `ask.want` tokens of the shared API budget for `ask.namespace`, reporting
    /// `ask.throttled` 429s (one script on `{wq:budget}`).
    pub async fn take_api_tokens(&self, ask: &TokenAsk<'_>) -> Result<TokenGrant, WqError> {
        let keys = [BUCKET_KEY.to_string(), NAMESPACES_KEY.to_string()];
        let milli_qps = (ask.qps * 1000.0).round().max(1.0) as u64;
        let args = vec![
            ask.namespace.arg(),
            ask.want.clamp(1, MAX_TAKE).arg(),
            milli_qps.arg(),
            ask.burst.max(1).arg(),
            ask.throttled.arg(),
            ACTIVE_WINDOW.arg(),
            MAX_WAIT.arg(),
            DECREASE_GAP.arg(),
            RECOVERY.arg(),
            ((FLOOR_SHARE * 1000.0) as u32).arg(),
            ((DECREASE_FACTOR * 1000.0) as u32).arg(),
            IDLE_TTL.arg(),
        ];
        let v: Value = self.run(&TAKE_SCRIPT, &keys, args).await?;
        let Value::Array(parts) = &v else {
            return Err(WqError::Protocol(format!("take_api_tokens: {v:?}")));
        };
        let [granted, wait, rate, n, slowed] = parts.as_slice() else {
            return Err(WqError::Protocol(format!("take_api_tokens: {v:?}")));
        };
        Ok(TokenGrant {
            granted: u32::try_from(int(granted)?).unwrap_or(0),
            wait: Duration::from_millis(u64::try_from(int(wait)?).unwrap_or(0)),
            rate: int(rate)? as f64 / 1000.0,
            active_namespaces: u32::try_from(int(n)?).unwrap_or(0),
            slowed: int(slowed)? != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aimd_halves_with_a_floor_and_recovers_linearly() {
        let s = Duration::from_secs;
        assert_eq!(aimd_rate(100.0, 100.0, s(0), true), 50.0);
        assert_eq!(aimd_rate(50.0, 100.0, s(0), true), 25.0);
        assert_eq!(aimd_rate(12.0, 100.0, s(0), true), 10.0, "floor");
        assert_eq!(aimd_rate(10.0, 100.0, s(0), true), 10.0);
        assert_eq!(aimd_rate(10.0, 100.0, s(3), false), 20.0, "+qps per RECOVERY");
        assert_eq!(aimd_rate(10.0, 100.0, s(27), false), 100.0);
        assert_eq!(aimd_rate(95.0, 100.0, s(60), false), 100.0, "never above the qps");
    }
}
