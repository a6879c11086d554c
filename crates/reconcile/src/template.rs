//! The Pod the controller creates for a Job (and an index), with upstream parity: `manageJob`'s
//! template preparation, `indexed_job_utils.go` (index annotation/label, hostname, env var,
//! generateName, failure-count annotations) and `controller.GetPodFromTemplate`.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec, PodTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kjob_core::{
    JOB_COMPLETION_INDEX_ANNOTATION, JOB_COMPLETION_INDEX_ENV, JOB_INDEX_FAILURE_COUNT_ANNOTATION,
    JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION, JOB_TRACKING_FINALIZER,
};

use crate::indexes::new_index_failure_counts;
use crate::job::{POD_REPLACEMENT_POLICY_FAILED, has_backoff_limit_per_index, is_indexed};

/// Longest generateName prefix the API server keeps whole (upstream `names.MaxGeneratedNameLength`:
/// 63 minus the 5 random characters).
pub const MAX_GENERATED_NAME_LENGTH: usize = 58;

/// `reason` label of `job_controller_job_pods_creation_total`: first pods of a Job.
pub const POD_CREATE_NEW: &str = "new";
/// `reason` label: replacing pods under podReplacementPolicy TerminatingOrFailed.
pub const POD_RECREATE_TERMINATING_OR_FAILED: &str = "recreate_terminating_or_failed";
/// `reason` label: replacing pods under podReplacementPolicy Failed.
pub const POD_RECREATE_FAILED: &str = "recreate_failed";

/// The controller ownerReference of pods created for `job` (upstream `metav1.NewControllerRef`
/// with kind batch/v1 Job).
pub fn controller_ref(job: &Job) -> OwnerReference {
    OwnerReference {
        api_version: "batch/v1".to_string(),
        kind: "Job".to_string(),
        name: job.metadata.name.clone().unwrap_or_default(),
        uid: job.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The Job's pod template prepared once per sync: a copy with the tracking finalizer and, for
/// Indexed Jobs, the `JOB_COMPLETION_INDEX` env var on every init and regular container that
/// lacks it, read from the index label (upstream `manageJob` before the create loop).
pub fn base_pod_template(job: &Job) -> PodTemplateSpec {
    let mut template = job.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
    if is_indexed(job) {
        let spec = template.spec.get_or_insert_with(PodSpec::default);
        for c in spec.init_containers.iter_mut().flatten() {
            add_completion_index_env(c);
        }
        for c in spec.containers.iter_mut() {
            add_completion_index_env(c);
        }
    }
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == JOB_TRACKING_FINALIZER) {
        finalizers.push(JOB_TRACKING_FINALIZER.to_string());
    }
    template
}

fn add_completion_index_env(c: &mut Container) {
    let env = c.env.get_or_insert_with(Vec::new);
    if env.iter().any(|e| e.name == JOB_COMPLETION_INDEX_ENV) {
        return;
    }
    env.push(EnvVar {
        name: JOB_COMPLETION_INDEX_ENV.to_string(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: format!("metadata.labels['{JOB_COMPLETION_INDEX_ANNOTATION}']"),
            }),
            ..Default::default()
        }),
    });
}

/// The Pod to POST for `job`: labels, annotations and finalizers from `template` (see
/// [`base_pod_template`]), the controller ownerReference, the Job's namespace and generateName.
/// With an `index`: index annotation and label, hostname `<job>-<index>`, generateName
/// `<job>-<index>-`, and with backoffLimitPerIndex the failure-count annotations carried over
/// from `replaced` (the index's last failed pod). `spec.subdomain` is kept from the template
/// unchanged, as upstream (users point it at a headless Service for stable DNS names).
pub fn pod_from_template(
    job: &Job,
    template: &PodTemplateSpec,
    index: Option<i32>,
    replaced: Option<&Pod>,
) -> Pod {
    let job_name = job.metadata.name.as_deref().unwrap_or("");
    let tmeta = template.metadata.clone().unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    let mut annotations = tmeta.annotations.unwrap_or_default();
    let mut spec = template.spec.clone().unwrap_or_default();
    let generate_name = match index {
        Some(ix) => {
            annotations.insert(JOB_COMPLETION_INDEX_ANNOTATION.to_string(), ix.to_string());
            labels.insert(JOB_COMPLETION_INDEX_ANNOTATION.to_string(), ix.to_string());
            spec.hostname = Some(format!("{job_name}-{ix}"));
            if has_backoff_limit_per_index(job) {
                add_index_failure_count_annotations(&mut annotations, job, replaced);
            }
            generate_name_with_index(job_name, ix)
        }
        None => pods_prefix(job_name),
    };
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(generate_name),
            namespace: job.metadata.namespace.clone(),
            labels: (!labels.is_empty()).then_some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            finalizers: tmeta.finalizers.filter(|f| !f.is_empty()),
            owner_references: Some(vec![controller_ref(job)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Convenience: [`pod_from_template`] over a fresh [`base_pod_template`]; when creating many pods
/// in one sync, build the base once instead.
pub fn new_pod(job: &Job, index: Option<i32>, replaced: Option<&Pod>) -> Pod {
    pod_from_template(job, &base_pod_template(job), index, replaced)
}

/// Sets `job-index-failure-count` (always) and `job-index-ignored-failure-count` (only when
/// non-zero) for the pod replacing `replaced` (upstream `addIndexFailureCountAnnotation`).
fn add_index_failure_count_annotations(
    annotations: &mut BTreeMap<String, String>,
    job: &Job,
    replaced: Option<&Pod>,
) {
    let (failures, ignored) = new_index_failure_counts(job, replaced);
    annotations.insert(JOB_INDEX_FAILURE_COUNT_ANNOTATION.to_string(), failures.to_string());
    if ignored > 0 {
        annotations
            .insert(JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION.to_string(), ignored.to_string());
    } else {
        // A template that carries the annotation must not leak a stale value into the new pod.
        annotations.remove(JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION);
    }
}

/// Why a built pod must not be sent to the API server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The pod has no labels, so no selector could ever own it (upstream refuses the create
    /// before calling the API, and records no event).
    #[error("unable to create pods, no labels")]
    NoLabels,
}

/// The client-side check upstream `RealPodControl.createPods` makes before POSTing a pod; a
/// failure counts as a failed create (expectations lowered) but emits no FailedCreate event.
pub fn check_creatable(pod: &Pod) -> Result<(), TemplateError> {
    if pod.metadata.labels.as_ref().is_none_or(BTreeMap::is_empty) {
        return Err(TemplateError::NoLabels);
    }
    Ok(())
}

/// `<job>-<index>-`, with the job name cut so the prefix fits [`MAX_GENERATED_NAME_LENGTH`]
/// (upstream `podGenerateNameWithIndex`).
pub fn generate_name_with_index(job_name: &str, index: i32) -> String {
    let suffix = format!("-{index}-");
    let full = format!("{job_name}{suffix}");
    if full.len() <= MAX_GENERATED_NAME_LENGTH {
        return full;
    }
    let keep = MAX_GENERATED_NAME_LENGTH.saturating_sub(suffix.len());
    // Job names are DNS labels (ASCII), so byte slicing is on a char boundary; be safe anyway.
    let mut cut = keep.min(job_name.len());
    while !job_name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{suffix}", &job_name[..cut])
}

/// generateName of NonIndexed pods: `<job>-`, or `<job>` when the dashed form is not a valid
/// pod-name prefix (upstream `controller.getPodsPrefix`).
pub fn pods_prefix(job_name: &str) -> String {
    let dashed = format!("{job_name}-");
    if is_valid_name_prefix(&dashed) { dashed } else { job_name.to_string() }
}

/// DNS-1123 subdomain check with the trailing dash masked, as `ValidatePodName(prefix, true)`.
fn is_valid_name_prefix(prefix: &str) -> bool {
    let masked = match prefix.strip_suffix('-') {
        Some(p) => format!("{p}a"),
        None => prefix.to_string(),
    };
    if masked.is_empty() || masked.len() > 253 {
        return false;
    }
    masked.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
    })
}

/// The `reason` label for pods created in this sync: "new" unless the Job already has failed or
/// terminating pods, then "recreate_failed" under podReplacementPolicy Failed and
/// "recreate_terminating_or_failed" otherwise (upstream `recordJobPodsCreationTotal`).
pub fn pod_creation_reason(job: &Job) -> &'static str {
    let status = job.status.as_ref();
    let terminating = status.and_then(|s| s.terminating).unwrap_or(0) > 0;
    let failed = status.and_then(|s| s.failed).unwrap_or(0) > 0;
    if !(terminating || failed) {
        return POD_CREATE_NEW;
    }
    let policy = job.spec.as_ref().and_then(|s| s.pod_replacement_policy.as_deref());
    if policy == Some(POD_REPLACEMENT_POLICY_FAILED) {
        POD_RECREATE_FAILED
    } else {
        POD_RECREATE_TERMINATING_OR_FAILED
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{at, exit_code_rule, mk_job, mk_pod};
    use kjob_core::CONTROLLER_UID_LABEL;

    fn ann<'a>(p: &'a Pod, k: &str) -> Option<&'a str> {
        p.metadata.annotations.as_ref().and_then(|a| a.get(k)).map(String::as_str)
    }

    fn label<'a>(p: &'a Pod, k: &str) -> Option<&'a str> {
        p.metadata.labels.as_ref().and_then(|a| a.get(k)).map(String::as_str)
    }

    #[test]
    fn non_indexed_pod() {
        let job = mk_job("pi").build();
        let pod = new_pod(&job, None, None);
        let m = &pod.metadata;
        assert_eq!(m.generate_name.as_deref(), Some("pi-"));
        assert_eq!(m.namespace.as_deref(), Some("default"));
        assert_eq!(m.finalizers.as_deref(), Some(&[JOB_TRACKING_FINALIZER.to_string()][..]));
        let owner = &m.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str()
            ),
            ("batch/v1", "Job", "pi", "uid-pi")
        );
        assert_eq!((owner.controller, owner.block_owner_deletion), (Some(true), Some(true)));
        assert_eq!(label(&pod, CONTROLLER_UID_LABEL), Some("uid-pi"));
        assert_eq!(ann(&pod, JOB_COMPLETION_INDEX_ANNOTATION), None);
        let spec = pod.spec.unwrap();
        assert_eq!(spec.hostname, None);
        assert_eq!(spec.containers[0].env, None, "no index env var for NonIndexed Jobs");
    }

    #[test]
    fn indexed_pod() {
        let job = mk_job("pi")
            .indexed()
            .completions(Some(5))
            .with(|j| {
                let t = &mut j.spec.as_mut().unwrap().template;
                let spec = t.spec.as_mut().unwrap();
                spec.subdomain = Some("svc".into());
                spec.init_containers =
                    Some(vec![Container { name: "init".into(), ..Default::default() }]);
                // A user-provided variable of the same name is left alone.
                spec.containers.push(Container {
                    name: "side".into(),
                    env: Some(vec![EnvVar {
                        name: JOB_COMPLETION_INDEX_ENV.into(),
                        value: Some("x".into()),
                        value_from: None,
                    }]),
                    ..Default::default()
                });
                t.metadata.as_mut().unwrap().finalizers = Some(vec!["example.com/keep".into()]);
            })
            .build();
        let pod = new_pod(&job, Some(3), None);
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("pi-3-"));
        assert_eq!(ann(&pod, JOB_COMPLETION_INDEX_ANNOTATION), Some("3"));
        assert_eq!(label(&pod, JOB_COMPLETION_INDEX_ANNOTATION), Some("3"));
        assert_eq!(
            ann(&pod, JOB_INDEX_FAILURE_COUNT_ANNOTATION),
            None,
            "only with backoffLimitPerIndex"
        );
        assert_eq!(
            pod.metadata.finalizers.as_deref(),
            Some(&["example.com/keep".to_string(), JOB_TRACKING_FINALIZER.to_string()][..])
        );
        let spec = pod.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("pi-3"));
        assert_eq!(spec.subdomain.as_deref(), Some("svc"));
        let env_of = |c: &Container| c.env.clone().unwrap_or_default();
        for c in spec.init_containers.as_ref().unwrap().iter().chain(&spec.containers[..1]) {
            let env = env_of(c);
            assert_eq!(env.len(), 1, "{}", c.name);
            let path =
                env[0].value_from.as_ref().unwrap().field_ref.as_ref().unwrap().field_path.clone();
            assert_eq!(path, "metadata.labels['batch.kubernetes.io/job-completion-index']");
        }
        assert_eq!(env_of(&spec.containers[1])[0].value.as_deref(), Some("x"));
        // The base template is reusable: building another index does not leak the first one.
        let base = base_pod_template(&job);
        let p4 = pod_from_template(&job, &base, Some(4), None);
        assert_eq!(ann(&p4, JOB_COMPLETION_INDEX_ANNOTATION), Some("4"));
        assert!(base.metadata.as_ref().unwrap().annotations.is_none());
    }

    #[test]
    fn failure_count_annotations_per_index() {
        let job = mk_job("pi").indexed().completions(Some(3)).backoff_limit_per_index(2).build();
        let fresh = new_pod(&job, Some(0), None);
        assert_eq!(ann(&fresh, JOB_INDEX_FAILURE_COUNT_ANNOTATION), Some("0"));
        assert_eq!(ann(&fresh, JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION), None);
        let prev = mk_pod(&job, "p").index(0).failure_counts(1, None).failed(1, at(1)).build();
        let next = new_pod(&job, Some(0), Some(&prev));
        assert_eq!(ann(&next, JOB_INDEX_FAILURE_COUNT_ANNOTATION), Some("2"));
        assert_eq!(ann(&next, JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION), None);

        let ignoring = mk_job("pi")
            .indexed()
            .completions(Some(3))
            .backoff_limit_per_index(2)
            .pod_failure_policy(vec![exit_code_rule("Ignore", None, "In", &[1])])
            .build();
        let next = new_pod(&ignoring, Some(0), Some(&prev));
        assert_eq!(ann(&next, JOB_INDEX_FAILURE_COUNT_ANNOTATION), Some("1"));
        assert_eq!(ann(&next, JOB_INDEX_IGNORED_FAILURE_COUNT_ANNOTATION), Some("1"));
    }

    #[test]
    fn pods_without_labels_are_refused() {
        let job = mk_job("pi").build();
        assert_eq!(check_creatable(&new_pod(&job, None, None)), Ok(()));
        let unlabelled = mk_job("pi")
            .with(|j| j.spec.as_mut().unwrap().template.metadata.as_mut().unwrap().labels = None)
            .build();
        let pod = new_pod(&unlabelled, None, None);
        assert_eq!(check_creatable(&pod), Err(TemplateError::NoLabels));
        assert_eq!(TemplateError::NoLabels.to_string(), "unable to create pods, no labels");
        // Indexed pods always carry the index label, so they are never refused.
        let indexed = mk_job("pi")
            .indexed()
            .completions(Some(2))
            .with(|j| j.spec.as_mut().unwrap().template.metadata.as_mut().unwrap().labels = None)
            .build();
        assert_eq!(check_creatable(&new_pod(&indexed, Some(1), None)), Ok(()));
    }

    #[test]
    fn generate_names() {
        assert_eq!(generate_name_with_index("pi", 7), "pi-7-");
        let long = "a".repeat(63);
        let got = generate_name_with_index(&long, 12345);
        assert_eq!(got.len(), MAX_GENERATED_NAME_LENGTH);
        assert!(got.ends_with("a-12345-"));
        let exact = "b".repeat(MAX_GENERATED_NAME_LENGTH - 3);
        assert_eq!(generate_name_with_index(&exact, 1), format!("{exact}-1-"));
        assert_eq!(pods_prefix("pi"), "pi-");
        assert_eq!(pods_prefix(&"c".repeat(253)), "c".repeat(253));
        assert_eq!(pods_prefix("Bad_Name"), "Bad_Name");
    }

    #[test]
    fn creation_reason_table() {
        let cases = [
            (mk_job("j").build(), POD_CREATE_NEW),
            (mk_job("j").counted(0, 1).build(), POD_RECREATE_TERMINATING_OR_FAILED),
            (mk_job("j").active(1, 0, 1).build(), POD_RECREATE_TERMINATING_OR_FAILED),
            (
                mk_job("j").pod_replacement_policy("Failed").counted(0, 2).build(),
                POD_RECREATE_FAILED,
            ),
            (mk_job("j").pod_replacement_policy("Failed").counted(3, 0).build(), POD_CREATE_NEW),
        ];
        for (job, want) in cases {
            assert_eq!(pod_creation_reason(&job), want);
        }
    }
}
