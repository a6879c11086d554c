//! Namespace weights of the fair lease (deficit round robin, see `drr_pop` in `crate::lua`):
//! kept in Redis so every replica uses the same, read by each replica at most every
//! [`WEIGHTS_REFRESH`] and passed to the lease scripts in ARGV (a script cannot read a key of
//! another slot).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::WqError;
use crate::conn::RESPONSE_TIMEOUT;
use crate::store::Store;

/// HASH namespace → weight, holding only weights other than the default 1.
pub(crate) const WEIGHTS_KEY: &str = "{wq:weights}";
/// How long a replica leases with the weights it read before reading them again: a changed
/// weight takes effect on every replica within this.
pub const WEIGHTS_REFRESH: Duration = Duration::from_secs(5);
/// Largest weight: a namespace gets at most this many leases per turn of the round robin.
pub const MAX_WEIGHT: u32 = 1000;

/// Whether `ns` can be a weighted namespace: a DNS-1123 label, so it cannot break the
/// `ns=w,…` encoding of the scripts' argument.
fn valid_namespace(ns: &str) -> bool {
    !ns.is_empty()
        && ns.len() <= 63
        && ns.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl Store {
    /// Sets the weight of namespace `ns` in the fair lease (1 = the default; a namespace of
    /// weight w gets w leases per turn while it has ready keys). Every replica uses it within
    /// [`WEIGHTS_REFRESH`]; this one at once.
    pub async fn set_namespace_weight(&self, ns: &str, weight: u32) -> Result<(), WqError> {
        if !valid_namespace(ns) {
            return Err(WqError::Config(format!("{ns:?} is not a namespace name")));
        }
        if weight == 0 || weight > MAX_WEIGHT {
            return Err(WqError::Config(format!(
                "weight {weight} for {ns}: 1 to {MAX_WEIGHT} are allowed"
            )));
        }
        let mut cmd = if weight == 1 {
            let mut c = redis::cmd("HDEL");
            c.arg(WEIGHTS_KEY).arg(ns);
            c
        } else {
            let mut c = redis::cmd("HSET");
            c.arg(WEIGHTS_KEY).arg(ns).arg(weight);
            c
        };
        self.command::<i64>("set_namespace_weight", &mut cmd).await?;
        *self.weights.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(())
    }

    /// The namespaces whose weight is not 1, with their weights.
    pub async fn namespace_weights(&self) -> Result<BTreeMap<String, u32>, WqError> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(WEIGHTS_KEY);
        let all: BTreeMap<String, u32> = self.command("namespace_weights", &mut cmd).await?;
        Ok(all
            .into_iter()
            .filter(|(ns, w)| valid_namespace(ns) && (1..=MAX_WEIGHT).contains(w))
            .collect())
    }

    /// The weights as the lease scripts take them (`ns=w,…`), read at most every
    /// [`WEIGHTS_REFRESH`].
    pub(crate) async fn weights_arg(&self) -> Result<String, WqError> {
        if let Some((at, arg)) = &*self.weights.lock().unwrap_or_else(|p| p.into_inner())
            && at.elapsed() < WEIGHTS_REFRESH
        {
            return Ok(arg.clone());
        }
        let arg = self
            .namespace_weights()
            .await?
            .into_iter()
            .map(|(ns, w)| format!("{ns}={w}"))
            .collect::<Vec<_>>()
            .join(",");
        *self.weights.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), arg.clone()));
        Ok(arg)
    }

    /// Runs one plain command within [`RESPONSE_TIMEOUT`].
    pub(crate) async fn command<T: redis::FromRedisValue>(
        &self,
        what: &'static str,
        cmd: &mut redis::Cmd,
    ) -> Result<T, WqError> {
        let mut conn = self.connection();
        match tokio::time::timeout(RESPONSE_TIMEOUT, cmd.query_async::<T>(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(WqError::from(e)).map_err(|e| {
                if e.is_unavailable() { WqError::Unavailable(format!("{what}: {e}")) } else { e }
            }),
            Err(_) => {
                Err(WqError::Unavailable(format!("{what}: no reply in {RESPONSE_TIMEOUT:?}")))
            }
        }
    }
}
