//! The one edge between kjob's queue vocabulary ([`kjob_core::queue`]) and its wire form: the
//! watcher and the client encode with these, the queue service decodes with them.

use std::time::Duration;

use kjob_core::events::{GateEvent, Gated};
use kjob_core::queue::{AddAnswer, AddItem};
use kjob_core::{
    CachedView, Done, DoneAnswer, FinalizerRemovals, JobExpectations, JobView, LeaseOutcome,
    Leased, Observation, ObservationKind, SetExpectations, ViewOp, ViewRecord, ViewWriteBack,
};

use crate::v1;

/// A duration on the wire: whole milliseconds, saturating.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<ObservationKind> for v1::ObservationKind {
    fn from(k: ObservationKind) -> Self {
        match k {
            ObservationKind::Creation => v1::ObservationKind::Creation,
            ObservationKind::Deletion => v1::ObservationKind::Deletion,
            ObservationKind::FinalizerRemoval => v1::ObservationKind::FinalizerRemoval,
        }
    }
}

impl From<&Observation> for v1::Observation {
    fn from(o: &Observation) -> Self {
        v1::Observation {
            kind: v1::ObservationKind::from(o.kind) as i32,
            job_uid: o.job_uid.clone(),
            pod_uid: o.pod_uid.clone(),
        }
    }
}

impl TryFrom<&v1::Observation> for Observation {
    /// What is wrong with the wire form.
    type Error = String;

    /// Decodes the kind; the UIDs are taken as they are (the server checks them).
    fn try_from(o: &v1::Observation) -> Result<Self, String> {
        let kind = match v1::ObservationKind::try_from(o.kind) {
            Ok(v1::ObservationKind::Creation) => ObservationKind::Creation,
            Ok(v1::ObservationKind::Deletion) => ObservationKind::Deletion,
            Ok(v1::ObservationKind::FinalizerRemoval) => ObservationKind::FinalizerRemoval,
            _ => {
                return Err(format!(
                    "observation kind {} is not one of CREATION, DELETION, FINALIZER_REMOVAL",
                    o.kind
                ));
            }
        };
        Ok(Observation::new(kind, o.job_uid.clone(), o.pod_uid.clone()))
    }
}

/// A lease outcome as a Done request carries it: the outcome and `requeue_after_ms`.
pub fn outcome_to_wire(o: LeaseOutcome) -> (v1::DoneOutcome, u64) {
    match o {
        LeaseOutcome::Forget => (v1::DoneOutcome::Forget, 0),
        LeaseOutcome::RateLimited => (v1::DoneOutcome::RateLimited, 0),
        LeaseOutcome::RequeueAfter(d) => (v1::DoneOutcome::RequeueAfter, millis(d)),
    }
}

/// Decodes the outcome fields of a Done request.
pub fn outcome_from_wire(outcome: i32, requeue_after_ms: u64) -> Result<LeaseOutcome, String> {
    match v1::DoneOutcome::try_from(outcome) {
        Ok(v1::DoneOutcome::Forget) => Ok(LeaseOutcome::Forget),
        Ok(v1::DoneOutcome::RateLimited) => Ok(LeaseOutcome::RateLimited),
        Ok(v1::DoneOutcome::RequeueAfter) => {
            Ok(LeaseOutcome::RequeueAfter(Duration::from_millis(requeue_after_ms)))
        }
        _ => Err(format!("outcome {outcome} is not one of FORGET, RATE_LIMITED, REQUEUE_AFTER")),
    }
}

impl From<v1::GetExpectationsResponse> for JobExpectations {
    fn from(r: v1::GetExpectationsResponse) -> Self {
        let v1::GetExpectationsResponse { satisfied, exists, add, del, age_ms, finalizer_removals } =
            r;
        Self { satisfied, exists, add, del, age_ms, finalizer_removals }
    }
}

impl From<JobExpectations> for v1::GetExpectationsResponse {
    fn from(e: JobExpectations) -> Self {
        let JobExpectations { satisfied, exists, add, del, age_ms, finalizer_removals } = e;
        Self { satisfied, exists, add, del, age_ms, finalizer_removals }
    }
}

impl From<v1::GetJobViewResponse> for JobView {
    fn from(v: v1::GetJobViewResponse) -> Self {
        Self {
            trusted: v.trusted,
            job: v.job,
            pods: v.pods,
            orphans_seen: v.orphans_seen,
            orphans_handled: v.orphans_handled,
            expectations: v.expectations.map(JobExpectations::from),
            job_uid: v.job_uid,
            records: v
                .records
                .into_iter()
                .map(|r| ViewRecord { name: r.name, value: r.value })
                .collect(),
            next_page: v.next_page,
            version: v.version,
            pod_count: v.pod_count,
            moved: v.moved,
            epoch: v.epoch,
            pod_names: v.pod_names,
            delta: v.delta,
            removed: v.removed,
            delta_base: v.delta_base,
        }
    }
}

impl From<&CachedView> for v1::CachedView {
    fn from(c: &CachedView) -> Self {
        Self { key: c.key.clone(), version: c.version, epoch: c.epoch.clone() }
    }
}

impl From<v1::LeasedItem> for Leased {
    /// The `done_*` capability fields are left out: every kjob-queue of this release sets them.
    fn from(i: v1::LeasedItem) -> Self {
        Self {
            key: i.key,
            lease_id: i.lease_id,
            requeues: i.requeues,
            deadline_unix_ms: i.deadline_unix_ms,
            enqueued_unix_ms: i.enqueued_unix_ms,
            lease_expiries: i.lease_expiries,
            view: i.view.map(JobView::from),
        }
    }
}

impl From<ViewWriteBack> for v1::PutJobViewRequest {
    fn from(w: ViewWriteBack) -> Self {
        let ViewWriteBack { key, job_uid, job, resource_version } = w;
        Self { key, job_uid, job, resource_version, orphans_handled: 0 }
    }
}

impl From<SetExpectations> for v1::SetExpectationsRequest {
    fn from(e: SetExpectations) -> Self {
        let SetExpectations { key, job_uid, add, del, created_pod_uids } = e;
        Self { key, job_uid, add, del, created_pod_uids }
    }
}

impl From<FinalizerRemovals> for v1::ExpectFinalizerRemovalsRequest {
    fn from(r: FinalizerRemovals) -> Self {
        let FinalizerRemovals { key, job_uid, pod_uids } = r;
        Self { key, job_uid, pod_uids }
    }
}

impl From<Done> for v1::DoneRequest {
    fn from(d: Done) -> Self {
        let (outcome, requeue_after_ms) = outcome_to_wire(d.outcome);
        Self {
            queue: d.queue,
            key: d.key,
            lease_id: d.lease_id,
            outcome: outcome as i32,
            requeue_after_ms,
            view_write_back: d.view_write_back.map(Into::into),
            expectations: d.expectations.map(Into::into),
            finalizer_removals: d.finalizer_removals.map(Into::into),
            error: d.error,
        }
    }
}

impl From<v1::DoneResponse> for DoneAnswer {
    fn from(r: v1::DoneResponse) -> Self {
        Self { requeued: r.requeued, ready_unix_ms: r.ready_unix_ms }
    }
}

impl From<GateEvent> for v1::GateEvent {
    fn from(e: GateEvent) -> Self {
        let GateEvent { object_key, spam_key, aggregate_key, event_key, message } = e;
        Self { object_key, spam_key, aggregate_key, event_key, message }
    }
}

impl From<v1::GatedEvent> for Gated {
    fn from(g: v1::GatedEvent) -> Self {
        let v1::GatedEvent { dropped, aggregated, key, message } = g;
        Self { dropped, aggregated, key, message }
    }
}

impl From<&ViewOp<Vec<u8>>> for v1::CacheOp {
    fn from(w: &ViewOp<Vec<u8>>) -> Self {
        use v1::CacheOpKind as K;
        let none = String::new;
        let (kind, name, object, rv) = match w {
            ViewOp::Job { uid, object, resource_version } => {
                (K::Job, uid.clone(), object.clone(), resource_version.clone())
            }
            ViewOp::DeleteJob => (K::DeleteJob, none(), Vec::new(), none()),
            ViewOp::Pod { name, object } => (K::Pod, name.clone(), object.clone(), none()),
            ViewOp::DeletePod { name } => (K::DeletePod, name.clone(), Vec::new(), none()),
            ViewOp::Reset { uid } => (K::Reset, uid.clone(), Vec::new(), none()),
            ViewOp::Trust => (K::Trust, none(), Vec::new(), none()),
            ViewOp::Orphans => (K::Orphans, none(), Vec::new(), none()),
        };
        v1::CacheOp { kind: kind as i32, name, object, resource_version: rv }
    }
}

impl From<&AddItem> for v1::AddItem {
    fn from(i: &AddItem) -> Self {
        v1::AddItem {
            queue: i.queue.clone(),
            key: i.key.clone(),
            delay_ms: millis(i.delay),
            observations: i.observations.iter().map(v1::Observation::from).collect(),
            observe_only: i.observe_only,
            cache: i.cache.iter().map(v1::CacheOp::from).collect(),
            cache_session: i.cache_session.clone(),
            priority: i.priority,
        }
    }
}

impl From<v1::AddResponse> for AddAnswer {
    fn from(r: v1::AddResponse) -> Self {
        Self { added: r.added, view_session_lost: r.view_session_lost }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_round_trip() {
        for kind in [
            ObservationKind::Creation,
            ObservationKind::Deletion,
            ObservationKind::FinalizerRemoval,
        ] {
            let o = Observation::new(kind, "j", "p");
            let wire = v1::Observation::from(&o);
            assert_eq!(Observation::try_from(&wire), Ok(o));
        }
        let bad = v1::Observation { kind: 0, ..Default::default() };
        assert!(Observation::try_from(&bad).unwrap_err().contains("CREATION"));
    }

    #[test]
    fn outcomes_round_trip() {
        for o in [
            LeaseOutcome::Forget,
            LeaseOutcome::RateLimited,
            LeaseOutcome::RequeueAfter(Duration::from_millis(1500)),
        ] {
            let (outcome, ms) = outcome_to_wire(o);
            assert_eq!(outcome_from_wire(outcome as i32, ms), Ok(o));
        }
        assert_eq!(outcome_to_wire(LeaseOutcome::Forget), (v1::DoneOutcome::Forget, 0));
        assert_eq!(
            outcome_to_wire(LeaseOutcome::RequeueAfter(Duration::from_millis(1500))),
            (v1::DoneOutcome::RequeueAfter, 1500)
        );
        assert!(outcome_from_wire(0, 0).is_err());
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }

    #[test]
    fn dones_and_adds_encode_every_field() {
        let done = Done {
            view_write_back: Some(ViewWriteBack { key: "ns/a".into(), ..Default::default() }),
            expectations: Some(SetExpectations { add: 2, ..Default::default() }),
            finalizer_removals: Some(FinalizerRemovals {
                pod_uids: vec!["p".into()],
                ..Default::default()
            }),
            ..Done::new("job", "ns/a", "1-1", LeaseOutcome::RequeueAfter(Duration::from_secs(2)))
        };
        let wire = v1::DoneRequest::from(done);
        assert_eq!(
            (wire.queue.as_str(), wire.key.as_str(), wire.lease_id.as_str()),
            ("job", "ns/a", "1-1")
        );
        assert_eq!(
            (wire.outcome, wire.requeue_after_ms),
            (v1::DoneOutcome::RequeueAfter as i32, 2000)
        );
        assert_eq!(wire.view_write_back.map(|w| w.key), Some("ns/a".into()));
        assert_eq!(wire.expectations.map(|e| e.add), Some(2));
        assert_eq!(wire.finalizer_removals.map(|r| r.pod_uids), Some(vec!["p".to_string()]));
        let item = AddItem {
            queue: "job".into(),
            key: "ns/a".into(),
            delay: Duration::from_millis(1500),
            observations: vec![Observation::new(ObservationKind::Creation, "j", "p")],
            observe_only: true,
            cache: vec![ViewOp::Pod { name: "p".into(), object: b"{}".to_vec() }, ViewOp::Trust],
            cache_session: "s".into(),
            priority: Some(-3),
        };
        let wire = v1::AddItem::from(&item);
        assert_eq!(wire.priority, Some(-3));
        assert_eq!(
            (wire.delay_ms, wire.observe_only, wire.cache_session.as_str()),
            (1500, true, "s")
        );
        assert_eq!(wire.observations[0].kind, v1::ObservationKind::Creation as i32);
        assert_eq!(wire.cache[0].kind, v1::CacheOpKind::Pod as i32);
        assert_eq!(
            (wire.cache[0].name.as_str(), wire.cache[0].object.as_slice()),
            ("p", &b"{}"[..])
        );
        assert_eq!(wire.cache[1].kind, v1::CacheOpKind::Trust as i32);
    }
}
