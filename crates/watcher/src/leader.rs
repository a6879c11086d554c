//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's rules: a candidate
//! takes the Lease when it is free or when its record has not changed for a whole lease
//! duration (measured on the local clock, so clock skew between nodes does not matter); the
//! leader renews every retry period and steps down when it could not renew within the renew
//! deadline, which is shorter than the lease duration, so it stops acting before anyone else
//! may take over. The Lease is released on graceful shutdown so a standby takes over at once.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// How long releasing the Lease at shutdown may take before the process exits anyway.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Lease election settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Lease object name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This process's identity (the pod name).
    pub identity: String,
    /// How long a Lease nobody renews stays with its holder (client-go: 15 s).
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it steps down (client-go: 10 s).
    pub renew_deadline: Duration,
    /// Interval between acquire/renew attempts (client-go: 2 s).
    pub retry_period: Duration,
}

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The settings cannot work: the renew deadline must be shorter than the lease duration and
    /// longer than the retry period.
    #[error(
        "invalid lease timing: need retry period ({retry:?}) < renew deadline ({renew:?}) < lease duration ({lease:?})"
    )]
    InvalidTiming {
        /// Retry period.
        retry: Duration,
        /// Renew deadline.
        renew: Duration,
        /// Lease duration.
        lease: Duration,
    },
}

impl LeaseConfig {
    /// Checks the timing rule client-go enforces.
    pub fn validate(&self) -> Result<(), LeaderError> {
        if self.retry_period < self.renew_deadline && self.renew_deadline < self.lease_duration {
            Ok(())
        } else {
            Err(LeaderError::InvalidTiming {
                retry: self.retry_period,
                renew: self.renew_deadline,
                lease: self.lease_duration,
            })
        }
    }
}

/// The part of a Lease whose change proves its holder is alive.
#[derive(Debug, Clone, PartialEq)]
struct Record {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    acquire_time: Option<MicroTime>,
    transitions: Option<i32>,
    duration_seconds: Option<i32>,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Self {
        Self {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            renew_time: spec.renew_time.clone(),
            acquire_time: spec.acquire_time.clone(),
            transitions: spec.lease_transitions,
            duration_seconds: spec.lease_duration_seconds,
        }
    }
}

/// Runs the election for one identity.
pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    /// Last record seen and when (local clock) it was first seen in that state.
    observed: Option<(Record, Instant)>,
    metrics: Metrics,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

impl LeaderElector {
    /// An elector for `cfg` using `client`.
    pub fn new(client: kube::Client, cfg: LeaseConfig, metrics: Metrics) -> Self {
        let api = Api::namespaced(client, &cfg.namespace);
        Self { api, cfg, observed: None, metrics }
    }

    /// One acquire-or-renew attempt. `Ok(true)` when this identity holds the Lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(jiff::Timestamp::now());
        let me = self.cfg.identity.clone();
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(secs(self.cfg.lease_duration)),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(created.spec.as_ref());
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let record = Record::of(&spec);
        self.observe(Some(&spec));
        let held_by_me = record.holder.as_deref() == Some(me.as_str());
        if let Some(holder) = &record.holder
            && !held_by_me
        {
            let dur = record
                .duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or(self.cfg.lease_duration);
            let seen_at = self.observed.as_ref().map(|(_, t)| *t).unwrap_or_else(Instant::now);
            if seen_at + dur > Instant::now() {
                tracing::trace!(holder, "lease held by another identity");
                return Ok(false);
            }
            tracing::info!(holder, "lease expired; taking it over");
        }
        let mut new = spec.clone();
        new.holder_identity = Some(me);
        new.lease_duration_seconds = Some(secs(self.cfg.lease_duration));
        new.renew_time = Some(now.clone());
        if !held_by_me {
            new.acquire_time = Some(now);
            new.lease_transitions = Some(
                spec.lease_transitions
                    .unwrap_or(0)
                    .saturating_add(i32::from(record.holder.is_some())),
            );
        }
        lease.spec = Some(new);
        // The resourceVersion in metadata makes this a compare-and-swap: a racing candidate
        // gets 409 Conflict.
        match self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await {
            Ok(updated) => {
                self.observe(updated.spec.as_ref());
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn observe(&mut self, spec: Option<&LeaseSpec>) {
        let record = Record::of(&spec.cloned().unwrap_or_default());
        if self.observed.as_ref().is_none_or(|(r, _)| *r != record) {
            self.observed = Some((record, Instant::now()));
        }
    }

    /// Hands the Lease back (holder cleared) if this identity still holds it.
    async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else { return Ok(()) };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return Ok(());
        }
        let now = MicroTime(jiff::Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now.clone());
        spec.acquire_time = Some(now);
        lease.spec = Some(spec);
        self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await?;
        Ok(())
    }

    /// Campaigns, leads and steps down until `stop` is cancelled, publishing whether this
    /// process leads on `leading`. Releases the Lease when stopped while leading.
    pub async fn run(mut self, leading: watch::Sender<bool>, stop: CancellationToken) {
        let retry = self.cfg.retry_period;
        loop {
            // Candidate.
            loop {
                let attempt = tokio::time::timeout(retry, self.try_acquire_or_renew());
                let acquired = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = attempt => r,
                };
                match acquired {
                    Ok(Ok(true)) => break,
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "acquiring the lease failed"),
                    Err(_) => tracing::warn!(timeout = ?retry, "acquiring the lease timed out"),
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(retry) => {}
                }
            }
            let mut last_renew = Instant::now();
            tracing::info!(identity = %self.cfg.identity, lease = %self.cfg.name, "became leader");
            self.metrics.leader.set(1);
            leading.send_replace(true);
            // Leader.
            loop {
                tokio::select! {
                    _ = stop.cancelled() => {
                        leading.send_replace(false);
                        self.metrics.leader.set(0);
                        match tokio::time::timeout(RELEASE_TIMEOUT, self.release()).await {
                            Ok(Ok(())) => tracing::info!("released the lease"),
                            Ok(Err(e)) => tracing::warn!(error = %e, "releasing the lease failed"),
                            Err(_) => tracing::warn!("releasing the lease timed out"),
                        }
                        return;
                    }
                    _ = tokio::time::sleep(retry) => {}
                }
                let started = Instant::now();
                // Never wait past the renew deadline: stepping down in time is what keeps two
                // leaders from acting at once.
                let left = self.cfg.renew_deadline.saturating_sub(last_renew.elapsed());
                match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                    Ok(Ok(true)) => last_renew = started,
                    Ok(Ok(false)) => {
                        tracing::warn!("lost the lease to another identity");
                        break;
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "renewing the lease failed"),
                    Err(_) => tracing::warn!("renewing the lease timed out"),
                }
                if last_renew.elapsed() >= self.cfg.renew_deadline {
                    tracing::warn!(deadline = ?self.cfg.renew_deadline, "could not renew the lease in time");
                    break;
                }
            }
            tracing::warn!("stepped down; campaigning again");
            self.metrics.leader.set(0);
            leading.send_replace(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(retry: u64, renew: u64, lease: u64) -> LeaseConfig {
        LeaseConfig {
            name: "l".into(),
            namespace: "ns".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_secs(retry),
        }
    }

    #[test]
    fn timing_rule() {
        assert!(cfg(2, 10, 15).validate().is_ok());
        assert!(cfg(2, 15, 15).validate().is_err());
        assert!(cfg(10, 10, 15).validate().is_err());
    }

    #[test]
    fn record_ignores_empty_holder() {
        let spec = LeaseSpec { holder_identity: Some(String::new()), ..Default::default() };
        assert_eq!(Record::of(&spec).holder, None);
    }
}
