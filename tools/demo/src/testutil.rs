//! Job builders for the unit tests.

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobSpec, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::expect::EXPECT_ANNOTATION;

/// A Job created at a fixed instant with the given counts and expectation annotation.
pub fn job(name: &str, completions: Option<i32>, parallelism: Option<i32>, expect: &str) -> Job {
    Job {
        metadata: ObjectMeta {
            name: Some(name.into()),
            creation_timestamp: Some(Time(jiff::Timestamp::from_second(1_800_000_000).unwrap())),
            annotations: Some([(EXPECT_ANNOTATION.to_string(), expect.to_string())].into()),
            ..Default::default()
        },
        spec: Some(JobSpec { completions, parallelism, ..Default::default() }),
        status: None,
    }
}

/// A Job whose status carries `(type, status, reason)` conditions and no annotations.
pub fn job_with_conditions(conds: &[(&str, &str, &str)]) -> Job {
    let mut j = job("j", Some(1), Some(1), "Complete");
    j.metadata.annotations = None;
    j.status = Some(JobStatus {
        conditions: Some(
            conds
                .iter()
                .map(|(t, s, r)| JobCondition {
                    type_: t.to_string(),
                    status: s.to_string(),
                    reason: Some(r.to_string()),
                    ..Default::default()
                })
                .collect(),
        ),
        ..Default::default()
    });
    j
}
