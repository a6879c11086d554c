//! The one edge between kjob's queue vocabulary ([`kjob_core::queue`]) and its wire form: the
//! watcher and the client encode with these, the queue service decodes with them.

use std::time::Duration;

use kjob_core::{LeaseOutcome, Observation, ObservationKind};

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
}
