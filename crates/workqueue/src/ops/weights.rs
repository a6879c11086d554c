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
pub const MAX_WEIGHT: u32 = kjob_core::MAX_QUEUE_WEIGHT;
/// Most namespaces weighted other than 1 at once: the lease scripts get the whole set in one
/// argument (about 70 bytes a namespace, so at most ~700 KB), and a cluster has far fewer
/// tenants than this.
pub const MAX_WEIGHTED_NAMESPACES: usize = 10_000;

/// Whether `ns` can be a weighted namespace: a DNS-1123 label, so it cannot break the
/// `ns=w,…` encoding of the scripts' argument.
fn valid_namespace(ns: &str) -> bool {
    !ns.is_empty()
        && ns.len() <= 63
        && ns.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Refuses a namespace name or weight the scripts cannot take.
fn check_weight(ns: &str, weight: u32) -> Result<(), WqError> {
    if !valid_namespace(ns) {
        return Err(WqError::Config(format!("{ns:?} is not a namespace name")));
    }
    if weight == 0 || weight > MAX_WEIGHT {
        return Err(WqError::Config(format!(
            "weight {weight} for {ns}: 1 to {MAX_WEIGHT} are allowed"
        )));
    }
    Ok(())
}

impl Store {
    /// Sets the weight of namespace `ns` in the fair lease (1 = the default; a namespace of
    /// weight w gets w leases per turn while it has ready keys). Every replica uses it within
    /// [`WEIGHTS_REFRESH`]; this one at once.
    pub async fn set_namespace_weight(&self, ns: &str, weight: u32) -> Result<(), WqError> {
        check_weight(ns, weight)?;
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

    /// Replaces every weight at once: the namespaces of `weights` get theirs, every other
    /// namespace weight 1 (entries of weight 1 are dropped, as they are the default). Atomic:
    /// a replica reading the weights sees the old set or the new one. Returns how many
    /// namespaces are weighted other than 1 now.
    pub async fn replace_namespace_weights(
        &self,
        weights: &BTreeMap<String, u32>,
    ) -> Result<u32, WqError> {
        if weights.len() > MAX_WEIGHTED_NAMESPACES {
            return Err(WqError::Config(format!(
                "{} weighted namespaces: at most {MAX_WEIGHTED_NAMESPACES} are allowed",
                weights.len()
            )));
        }
        for (ns, &w) in weights {
            check_weight(ns, w)?;
        }
        let set: Vec<(&str, u32)> =
            weights.iter().filter(|(_, w)| **w != 1).map(|(ns, w)| (ns.as_str(), *w)).collect();
        let mut pipe = redis::pipe();
        pipe.atomic().del(WEIGHTS_KEY).ignore();
        if !set.is_empty() {
            pipe.hset_multiple(WEIGHTS_KEY, &set).ignore();
        }
        let mut conn = self.connection();
        match tokio::time::timeout(RESPONSE_TIMEOUT, pipe.query_async::<()>(&mut conn)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let e = WqError::from(e);
                return Err(if e.is_unavailable() {
                    WqError::Unavailable(format!("replace_namespace_weights: {e}"))
                } else {
                    e
                });
            }
            Err(_) => {
                return Err(WqError::Unavailable(format!(
                    "replace_namespace_weights: no reply in {RESPONSE_TIMEOUT:?}"
                )));
            }
        }
        *self.weights.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(set.len() as u32)
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
    /// [`WEIGHTS_REFRESH`]; under [`crate::LeaseOrder::Fifo`] prefixed with `!fifo,` (the lease
    /// scripts' `load_weights` reads the order from it).
    pub(crate) async fn weights_arg(&self) -> Result<String, WqError> {
        let arg = self.weights_only_arg().await?;
        Ok(match self.config().lease_order {
            crate::LeaseOrder::Fair => arg,
            crate::LeaseOrder::Fifo => format!("!fifo,{arg}"),
        })
    }

    async fn weights_only_arg(&self) -> Result<String, WqError> {
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
