//! Cases as data: a Job spec, the fate of every pod it will get, and timed user actions.
//! Built-in cases live in `cases.yaml`; [`generate`] makes seeded random ones.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The built-in cases (scenarios the worker tests and the Python suite run).
const BUILTIN: &str = include_str!("../cases.yaml");
/// Name of every case's Job (each case has a namespace of its own).
pub const JOB_NAME: &str = "job";
/// JobSet's API group and the version its cases use.
pub const JOBSET_GROUP: &str = "jobset.x-k8s.io";
pub const JOBSET_VERSION: &str = "v1alpha2";
/// Default horizon: a case that is not terminal by then is compared as it stands.
const DEFAULT_HORIZON_S: u64 = 60;

/// One workload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Case {
    /// Unique name; also the namespace suffix.
    pub name: String,
    /// Fields merged into the Job's `spec` (the template is one `main` container, Never).
    #[serde(default)]
    pub spec: Value,
    /// What happens to each pod.
    #[serde(default)]
    pub fates: Fates,
    /// User actions at fixed times after the Job's creation.
    #[serde(default)]
    pub actions: Vec<UserAction>,
    /// Compare at this time after creation if the Job is not terminal before.
    #[serde(default = "default_horizon")]
    pub horizon_s: u64,
    /// A ResourceQuota's `spec.hard` for the namespace, in force before the Job is created.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub quota: Value,
    /// The API server refuses the case's Job or one of its patches: the refusals are compared
    /// instead of ending the run (never set on generated cases, whose Jobs must be valid).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// Kueue queues the case's Job (created suspended, with the queue-name label and pods of
    /// 1 CPU); the run starts Kueue beside both control planes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kueue: Option<KueueQueue>,
    /// A JobSet's `spec` instead of a Job: JobSet's controller (started beside both control
    /// planes) makes the Jobs, each `replicatedJobs[].template.spec` getting the case's pod
    /// template when it names none. `spec`, `quota` and `kueue` do not apply; actions may
    /// only patch the JobSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobset: Option<Value>,
    /// Fields the JobSet's final `status` must hold on each control plane (`terminalState`,
    /// `restarts`, …): what the scenario is about, checked beside the comparison, which alone
    /// would pass two runs that went wrong alike.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub jobset_expect: Value,
}

/// The Kueue queue of a case: a LocalQueue `queue` in the case's namespace pointing at a
/// ClusterQueue that cases of one group share (so their Jobs compete for its quota).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct KueueQueue {
    /// The shared ClusterQueue (made by the first case that needs it).
    pub cluster_queue: String,
    /// Its nominal CPU quota, in whole CPUs (each pod requests 1).
    pub cpus: u32,
    /// Place of this case's Job in the group's creation order (0 first): the Job is created
    /// `position` × [`KUEUE_CREATE_SPACING_MS`] after the case starts, so each has a creation
    /// timestamp of its own (they have 1-second resolution, and Kueue queues by it).
    pub position: u32,
    /// Node labels of the ClusterQueue's ResourceFlavor, which Kueue injects into the pods'
    /// `nodeSelector` when it admits the Job; with none (and no tolerations) the queue uses the
    /// shared default flavor.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub flavor_node_labels: BTreeMap<String, String>,
    /// Tolerations of the flavor, which Kueue injects into the pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flavor_tolerations: Vec<Value>,
    /// Kueue's partial admission: the Job's `kueue.x-k8s.io/job-min-parallelism`, so Kueue may
    /// admit it with fewer pods in parallel (down to this) when the quota has less room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_parallelism: Option<u32>,
    /// The Job's priority, as a Kueue WorkloadPriorityClass of that value (label
    /// `kueue.x-k8s.io/priority-class`). A ClusterQueue whose Jobs have priorities preempts lower
    /// priority within itself, so a higher Job suspends a running lower one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// The Job's first pods never become ready in time: Kueue's waitForPodsReady timeout (the
    /// add-on's configuration, `kjob_testkit::addons::KUEUE_PODS_READY_TIMEOUT`) evicts it, which
    /// suspends the Job, and admits it again after its requeue backoff.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pods_ready_eviction: bool,
}

/// Kueue's label naming a Job's WorkloadPriorityClass.
pub const KUEUE_PRIORITY_LABEL: &str = "kueue.x-k8s.io/priority-class";

impl KueueQueue {
    /// Name of the WorkloadPriorityClass of [`Self::priority`].
    pub fn priority_class(&self) -> Option<String> {
        self.priority.map(|p| format!("diff-priority-{p}"))
    }

    /// Whether the queue has a flavor of its own (node labels or tolerations).
    pub fn own_flavor(&self) -> bool {
        !self.flavor_node_labels.is_empty() || !self.flavor_tolerations.is_empty()
    }
}

/// Spacing of the creations of one Kueue group's Jobs; more than a second (see
/// [`KueueQueue::position`]). The quota group's later Jobs must be created while the first ones
/// still run, so Kueue holds them inadmissible together and admits them in creation order: at
/// 3 s, the last Job came after the first had finished and was admitted at once, ahead of an
/// older one still waiting to be requeued (Kueue's BestEffortFIFO), on both control planes. The
/// spacing is also the gap between the first two Jobs' ends, so between the admissions of the
/// last two: at 2 s a loaded machine's jitter in admission and first pod swapped them.
pub const KUEUE_CREATE_SPACING_MS: u64 = 4000;
/// Name of each case's LocalQueue.
pub const KUEUE_LOCAL_QUEUE: &str = "queue";
/// Kueue's label naming a Job's LocalQueue.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Kueue's annotation allowing partial admission down to that many pods in parallel.
pub const KUEUE_MIN_PARALLELISM: &str = "kueue.x-k8s.io/job-min-parallelism";

fn default_horizon() -> u64 {
    DEFAULT_HORIZON_S
}

/// Fates keyed by what does not depend on the controller.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Fates {
    /// Fate of pods no other entry names.
    #[serde(default)]
    pub default: Fate,
    /// Indexed Jobs: completion index → fate of its 1st, 2nd, ... pod.
    #[serde(default)]
    pub by_index: BTreeMap<u32, Vec<Fate>>,
    /// Non-indexed Jobs: fate of the Job's 1st, 2nd, ... pod in creation order.
    #[serde(default)]
    pub by_order: Vec<Fate>,
    /// Per Job name (a JobSet's Jobs): `by_index` and `by_order` of that Job only, ahead of the
    /// ones above; their `default` is not used.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_job: BTreeMap<String, Fates>,
}

/// The life of one pod once it runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Fate {
    /// How long the container runs before exiting.
    #[serde(default = "default_run_ms")]
    pub run_ms: u64,
    /// Its exit code.
    #[serde(default)]
    pub exit_code: i64,
    /// Exit codes of named containers that differ from `exit_code`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub container_exit_codes: BTreeMap<String, i64>,
    /// Evict it through the Eviction API this long after it started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evict_after_ms: Option<u64>,
    /// A user deletes it (gracefully) this long after it started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_after_ms: Option<u64>,
    /// Once deleted (by anyone), it takes this long to terminate (0: at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_ms: Option<u64>,
    /// It takes this long to start once accepted (an image pull that hangs, say); not ready
    /// until then. Default: the kubelet's usual start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_delay_ms: Option<u64>,
    /// A user edits its labels this long after it started running, so that the Job's selector
    /// no longer matches (`batch.kubernetes.io/controller-uid` set to `released`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relabel_after_ms: Option<u64>,
}

fn is_created(s: &Since) -> bool {
    *s == Since::Created
}

fn default_run_ms() -> u64 {
    500
}

impl Default for Fate {
    fn default() -> Self {
        Self {
            run_ms: default_run_ms(),
            exit_code: 0,
            container_exit_codes: BTreeMap::new(),
            evict_after_ms: None,
            delete_after_ms: None,
            termination_ms: None,
            start_delay_ms: None,
            relabel_after_ms: None,
        }
    }
}

/// What a user action's time counts from.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Since {
    /// The Job's creation.
    #[default]
    Created,
    /// The start of the Job's first running container (as the scripted kubelet started it):
    /// a mid-run action then meets every pod at the same point of its fate, however long the
    /// controller took to create the first pods. Never reached, the action never happens.
    FirstPodRunning,
}

/// A user's change at a fixed time: a merge patch of the Job, its deletion, its creation
/// again, a pod of the user's own.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct UserAction {
    /// Time after `since`.
    pub after_ms: u64,
    /// What `after_ms` counts from.
    #[serde(default, skip_serializing_if = "is_created")]
    pub since: Since,
    /// JSON merge patch applied to the Job (none when null).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub patch: Value,
    /// Delete the Job with this propagation policy (`Foreground`, `Background`, `Orphan`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete: Option<String>,
    /// Create the Job again, from the case's spec, once the one before is gone (due only then).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub create: bool,
    /// Create this pod, with the tracking finalizer (as if a Job controller had made it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<UserPod>,
}

/// A pod a user creates beside the Job's: a `main` container, label `app: user`, the tracking
/// finalizer, the owner named here (none, another object, or the case's Job), and a scheduler
/// nobody runs (it stays Pending).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct UserPod {
    /// Its name (fixed: no random suffix).
    pub name: String,
    /// Its controller reference (`controller: true` is added); none when null.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub owner: Value,
    /// Its controller is the case's Job (by its uid at that moment).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub owned_by_job: bool,
}

/// Where a pod stands among the Job's pods, independent of the controller that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The `attempt`-th pod (0-based) seen with completion index `index`.
    Index { index: u32, attempt: usize },
    /// The `n`-th pod (0-based) of the Job in creation order.
    Order(usize),
}

impl Fates {
    /// The fate of the pod in `slot`.
    pub fn of(&self, slot: Slot) -> Fate {
        self.listed(slot).unwrap_or_else(|| self.default.clone())
    }

    /// The fate of the pod in `slot` of Job `job`: its own entry in `by_job` first.
    pub fn of_job(&self, job: &str, slot: Slot) -> Fate {
        self.by_job.get(job).and_then(|f| f.listed(slot)).unwrap_or_else(|| self.of(slot))
    }

    /// The fate `by_index` or `by_order` names for `slot`, if any.
    fn listed(&self, slot: Slot) -> Option<Fate> {
        match slot {
            Slot::Index { index, attempt } => {
                self.by_index.get(&index).and_then(|v| v.get(attempt))
            }
            Slot::Order(n) => self.by_order.get(n),
        }
        .cloned()
    }
}

impl Case {
    /// The Job object to create. `spec.managedBy` stays unset so whichever controller runs
    /// takes it (kjob with `--manage-all-jobs`).
    pub fn job(&self) -> Value {
        let mut j = json!({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": JOB_NAME},
            "spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox"}]}}}
        });
        if let Some(spec) = self.spec.as_object() {
            for (k, v) in spec {
                j["spec"][k] = v.clone();
            }
        }
        if let Some(q) = &self.kueue {
            j["metadata"]["labels"] = json!({KUEUE_QUEUE_LABEL: KUEUE_LOCAL_QUEUE});
            if let Some(pc) = q.priority_class() {
                j["metadata"]["labels"][KUEUE_PRIORITY_LABEL] = json!(pc);
            }
            if let Some(n) = q.min_parallelism {
                j["metadata"]["annotations"] = json!({KUEUE_MIN_PARALLELISM: n.to_string()});
            }
            j["spec"]["template"]["spec"]["containers"][0]["resources"] =
                json!({"requests": {"cpu": "1"}});
        }
        j
    }

    /// The JobSet object to create, for a JobSet case: named like a case's Job, its
    /// replicated Jobs' templates completed with the pod template every case uses.
    pub fn jobset_object(&self) -> Option<Value> {
        let mut spec = self.jobset.clone()?;
        if let Some(rjobs) = spec["replicatedJobs"].as_array_mut() {
            for rj in rjobs {
                let job_spec = &mut rj["template"]["spec"];
                if job_spec["template"].is_null() {
                    job_spec["template"] = json!({"spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "busybox"}]}});
                }
            }
        }
        Some(json!({
            "apiVersion": format!("{JOBSET_GROUP}/{JOBSET_VERSION}"), "kind": "JobSet",
            "metadata": {"name": JOB_NAME}, "spec": spec
        }))
    }

    /// The same case again under another name (so in fresh namespaces): attempt `n`.
    pub fn rerun(&self, n: usize) -> Case {
        Case { name: format!("{}-r{n}", self.name), ..self.clone() }
    }

    /// The case again as one of the Kueue and JobSet scenarios run again together after a
    /// violation: attempt `n`, named apart from [`Case::rerun`]'s (a scenario case rerun both
    /// ways would otherwise meet its own namespace).
    pub fn rerun_scenario(&self, n: usize) -> Case {
        Case { name: format!("{}-g{n}", self.name), ..self.clone() }
    }

    /// The case again after its run failed with an error, in fresh namespaces.
    pub fn rerun_after_error(&self, n: usize) -> Case {
        Case { name: format!("{}-e{n}", self.name), ..self.clone() }
    }

    /// Namespace the case runs in (the same in both runs, so messages match).
    pub fn namespace(&self) -> String {
        format!("diff-{}", self.name)
    }
}

/// The built-in cases.
pub fn builtin() -> anyhow::Result<Vec<Case>> {
    Ok(serde_yaml::from_str(BUILTIN)?)
}

/// `n` random valid Jobs and fates from `seed`; case `i` depends only on (seed, i).
pub fn generate(seed: u64, n: usize) -> Vec<Case> {
    (0..n).map(|i| generate_one(seed, i)).collect()
}

/// Run times of generated pods: 3 s apart, more than either controller takes to react to a
/// pod's end on a loaded machine, so which pod ends first never depends on the controller's
/// speed (pods of one wave start within tens of milliseconds of each other). Every timed
/// event of a generated case sits on this grid, at least 1.5 s from any other kind.
const RUN_TIMES_MS: [u64; 3] = [300, 3300, 6300];
/// Run time of pods meant to outlive a case's timed events (deadline, eviction, deletion).
const LONG_RUN_MS: u64 = 30_000;
/// When a generated mid-run user action (or the first of two) happens, after the first pod
/// started running: 2 s after the first wave's 300 ms pods end (time for the controller to act
/// on them, even to finish the Job), 1 s before its 3300 ms pods end.
const ACTION_AT_MS: u64 = 2300;
/// `activeDeadlineSeconds` of generated Jobs that have one. Such Jobs get no user action but a
/// deletion and only 300 ms and long pods, so the deadline (counted from a `startTime`
/// truncated to the second: it fires 6 to 7 s after the Job started) comes seconds after
/// three waves of short pods and seconds before a failed pod's replacement (10 s back-off).
const ACTIVE_DEADLINE_S: u64 = 7;
/// When a generated pod is evicted or deleted, after it started running, in order of
/// preference: the first whose decision window has no other aligned pod's end in it (see
/// [`place_disruption`]). 4.8 s falls between the ends of the first wave's 3300 ms and 6300 ms
/// pods; 3.5 s between the ends of its 3300 ms pods and those of the pods that replace its
/// 300 ms successes; 9.2 s after every end but those of 6300 ms pods that replace successes.
const DISRUPT_AFTER_MS: [u64; 3] = [4800, 3500, 9200];
/// Both controllers sync a Job one batch period after a pod event (upstream's
/// `syncJobBatchPeriod`; kjob's watcher has the same handlers), so what a pod's disruption
/// decides (the Job failed, other pods deleted) is decided up to that long after it.
const SYNC_BATCH_MS: u64 = 1000;
/// From a controller's decision to its new pod's container running: the create, the binding,
/// the kubelet's acceptance and its start delay (100 ms).
const POD_START_LAG_MS: u64 = 150;
/// How far a pod's end moves on a loaded machine (pods after the first wave start late by up
/// to that much): the margin kept on both sides of a decision's window.
const JITTER_MS: u64 = 200;
/// How long a slow-to-stop pod takes to terminate once deleted.
const TERMINATION_MS: u64 = 1000;
/// The second container of templates with two (so `containerName` picks one of them).
const SIDECAR: &str = "side";
/// Exit codes pods end with (0 most often); 3 and 42 are the ones generated rules name.
const CODES: [i64; 6] = [0, 0, 0, 1, 3, 42];

/// The shape of a generated Job that its pods' fates depend on.
#[derive(Debug, Clone, Copy)]
struct Shape {
    sidecar: bool,
    on_failure: bool,
    deadline: bool,
}

fn pick<T: Copy>(rng: &mut StdRng, xs: &[T]) -> T {
    xs[rng.random_range(0..xs.len())]
}

fn random_fate(rng: &mut StdRng, shape: Shape) -> Fate {
    let mut f =
        Fate { run_ms: pick(rng, &RUN_TIMES_MS), exit_code: pick(rng, &CODES), ..Fate::default() };
    if shape.sidecar && rng.random_bool(0.4) {
        f.container_exit_codes.insert(SIDECAR.into(), pick(rng, &CODES));
    }
    if shape.deadline {
        f.run_ms = if rng.random_bool(0.4) { LONG_RUN_MS } else { RUN_TIMES_MS[0] };
    }
    // Slow to stop now and then, so `terminating` and podReplacementPolicy have something to see.
    if rng.random_bool(0.25) {
        f.termination_ms = Some(TERMINATION_MS);
    }
    // Disruptions only under restartPolicy Never: a restarting pod's start time moves.
    if !shape.on_failure {
        match rng.random_range(0..20) {
            0 | 1 => {
                f.run_ms = LONG_RUN_MS;
                f.evict_after_ms = Some(DISRUPT_AFTER_MS[0]);
            }
            2 => {
                f.run_ms = LONG_RUN_MS;
                f.delete_after_ms = Some(DISRUPT_AFTER_MS[0]);
            }
            _ => {}
        }
    }
    f
}

/// An `onExitCodes` requirement, naming a container now and then.
fn on_exit_codes(rng: &mut StdRng, shape: Shape, operator: &str, values: &[i64]) -> Value {
    let mut r = json!({"operator": operator, "values": values});
    if rng.random_bool(0.4) {
        r["containerName"] =
            json!(if shape.sidecar && rng.random_bool(0.5) { SIDECAR } else { "main" });
    }
    r
}

/// One to three podFailurePolicy rules; FailIndex only with `backoffLimitPerIndex` (the API
/// server's rule).
fn random_rules(rng: &mut StdRng, shape: Shape, per_index: bool) -> Vec<Value> {
    let n = rng.random_range(1..=3);
    let mut kinds: Vec<u32> = Vec::new();
    while kinds.len() < n {
        let k = rng.random_range(0..8);
        if (k >= 6 && !per_index) || kinds.contains(&k) {
            continue;
        }
        kinds.push(k);
    }
    let cond = |action: &str| {
        json!({"action": action,
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]})
    };
    kinds
        .into_iter()
        .map(|k| match k {
            0 => json!({"action": "FailJob", "onExitCodes": on_exit_codes(rng, shape, "In", &[42])}),
            1 => json!({"action": "Ignore", "onExitCodes": on_exit_codes(rng, shape, "In", &[3])}),
            2 => json!({"action": "Count", "onExitCodes": on_exit_codes(rng, shape, "NotIn", &[0, 3])}),
            3 => json!({"action": "FailJob", "onExitCodes": on_exit_codes(rng, shape, "NotIn", &[0, 1, 3])}),
            4 => cond("Ignore"),
            5 => cond("FailJob"),
            6 => json!({"action": "FailIndex", "onExitCodes": on_exit_codes(rng, shape, "In", &[1, 42])}),
            _ => cond("FailIndex"),
        })
        .collect()
}

/// `0..n` as an index list in the API's interval syntax, from a random non-empty subset.
fn random_indexes(rng: &mut StdRng, n: u32) -> (String, u32) {
    let set: Vec<u32> = loop {
        let s: Vec<u32> = (0..n).filter(|_| rng.random_bool(0.5)).collect();
        if !s.is_empty() {
            break s;
        }
    };
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < set.len() {
        let mut j = i;
        while j + 1 < set.len() && set[j + 1] == set[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { set[i].to_string() } else { format!("{}-{}", set[i], set[j]) });
        i = j + 1;
    }
    (parts.join(","), set.len() as u32)
}

/// A random valid Job (by the API server's validation rules: per-index limits and success
/// policies only for Indexed Jobs, FailIndex only with per-index limits, podFailurePolicy only
/// with restartPolicy Never and podReplacementPolicy Failed, elastic changes only while
/// completions equal parallelism), its pods' fates and at most one kind of user action.
fn generate_one(seed: u64, i: usize) -> Case {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(i as u64));
    let rng = &mut rng;
    let indexed = rng.random_bool(0.5);
    // Non-indexed without completions now and then: done when any pod succeeds.
    let completions: Option<u32> =
        if !indexed && rng.random_bool(0.15) { None } else { Some(rng.random_range(1..=3)) };
    // Parallelism 0 now and then: nothing runs, compared at the horizon.
    let mut parallelism: u32 = if rng.random_bool(0.08) { 0 } else { rng.random_range(1..=3) };
    let shape = Shape {
        sidecar: rng.random_bool(0.3),
        on_failure: rng.random_bool(0.12),
        deadline: rng.random_bool(0.12),
    };
    let mut spec = json!({
        "parallelism": parallelism,
        "completionMode": if indexed { "Indexed" } else { "NonIndexed" },
    });
    if let Some(c) = completions {
        spec["completions"] = json!(c);
    }
    let mut containers = vec![json!({"name": "main", "image": "busybox"})];
    if shape.sidecar {
        containers.push(json!({"name": SIDECAR, "image": "busybox"}));
    }
    let restart = if shape.on_failure { "OnFailure" } else { "Never" };
    spec["template"] = json!({"spec": {"restartPolicy": restart, "containers": containers}});
    // Pod-failure back-off is 10 s, 20 s, ...: small limits keep a case under a minute.
    let per_index = indexed && !shape.on_failure && rng.random_bool(0.35);
    if per_index {
        let c = completions.unwrap_or(1);
        spec["backoffLimitPerIndex"] = json!(rng.random_range(0..=1));
        if rng.random_bool(0.5) {
            spec["maxFailedIndexes"] = json!(rng.random_range(0..c));
        }
        // Unset, the limit of the whole Job is MaxInt32 (only the per-index ones count).
        if rng.random_bool(0.5) {
            spec["backoffLimit"] = json!(rng.random_range(0..=2));
        }
    } else {
        spec["backoffLimit"] = json!(rng.random_range(0..=1));
    }
    let pfp = !shape.on_failure && rng.random_bool(0.4);
    if pfp {
        spec["podFailurePolicy"] = json!({"rules": random_rules(rng, shape, per_index)});
        if rng.random_bool(0.3) {
            spec["podReplacementPolicy"] = json!("Failed");
        }
    } else if rng.random_bool(0.3) {
        spec["podReplacementPolicy"] = json!(pick(rng, &["Failed", "TerminatingOrFailed"]));
    }
    let success_policy = indexed && rng.random_bool(0.25);
    if success_policy {
        let c = completions.unwrap_or(1);
        let mut rule = serde_json::Map::new();
        let mut max_count = c;
        if rng.random_bool(0.7) {
            let (list, n) = random_indexes(rng, c);
            rule.insert("succeededIndexes".into(), json!(list));
            max_count = n;
        }
        if !rule.contains_key("succeededIndexes") || rng.random_bool(0.5) {
            rule.insert("succeededCount".into(), json!(rng.random_range(1..=max_count)));
        }
        spec["successPolicy"] = json!({"rules": [Value::Object(rule)]});
    }
    if shape.deadline {
        spec["activeDeadlineSeconds"] = json!(ACTIVE_DEADLINE_S);
    }
    // Pods the lists below do not name end on the grid too.
    let default_run = if shape.deadline { RUN_TIMES_MS[0] } else { RUN_TIMES_MS[1] };
    let mut fates =
        Fates { default: Fate { run_ms: default_run, ..Fate::default() }, ..Fates::default() };
    if indexed {
        for index in 0..4 {
            let tries = rng.random_range(0..=2);
            let list: Vec<Fate> = (0..tries).map(|_| random_fate(rng, shape)).collect();
            if !list.is_empty() {
                fates.by_index.insert(index, list);
            }
        }
    } else {
        let n = rng.random_range(0..=4);
        fates.by_order = (0..n).map(|_| random_fate(rng, shape)).collect();
    }
    // First-wave pods still running when a mid-run action comes.
    let running_at_action = (0..parallelism as usize)
        .filter(|&n| {
            let slot =
                if indexed { Slot::Index { index: n as u32, attempt: 0 } } else { Slot::Order(n) };
            fates.of(slot).run_ms > ACTION_AT_MS
        })
        .count() as u32;
    let mut actions = Vec::new();
    // Whether the Job ends up with parallelism 0 (it then never finishes by itself).
    let mut stalls = parallelism == 0;
    let act =
        |after_ms, since, patch: Value| UserAction { after_ms, since, patch, ..Default::default() };
    let mid_run = Since::FirstPodRunning;
    match rng.random_range(0..16) {
        0 if !shape.deadline => {
            spec["suspend"] = json!(true);
            actions.push(act(3000, Since::Created, json!({"spec": {"suspend": false}})));
        }
        1 if !shape.deadline => {
            actions.push(act(ACTION_AT_MS, mid_run, json!({"spec": {"suspend": true}})));
            actions.push(act(ACTION_AT_MS + 3000, mid_run, json!({"spec": {"suspend": false}})));
        }
        2 if !shape.deadline => {
            // Never below the pods running then: which of equal pods a controller deletes
            // depends on their Ready times, to the second, so on the run, not the controller.
            let low = running_at_action.max(u32::from(parallelism == 0));
            let p = rng.random_range(low..=3.max(low));
            // From 0 no pod runs before the change: count from the Job's creation.
            let since = if parallelism == 0 { Since::Created } else { mid_run };
            stalls = p == 0;
            actions.push(act(ACTION_AT_MS, since, json!({"spec": {"parallelism": p}})));
        }
        3 if indexed && !per_index && !success_policy && !shape.deadline => {
            // Elastic Indexed: completions may change only together with an equal parallelism.
            parallelism = completions.unwrap_or(1);
            spec["parallelism"] = json!(parallelism);
            stalls = false;
            let n = rng.random_range(1..=4);
            actions.push(act(
                ACTION_AT_MS,
                mid_run,
                json!({"spec": {"completions": n, "parallelism": n}}),
            ));
        }
        4 => {
            let policy = pick(rng, &["Foreground", "Background", "Orphan"]);
            actions.push(UserAction {
                after_ms: ACTION_AT_MS,
                since: mid_run,
                delete: Some(policy.into()),
                ..Default::default()
            });
        }
        _ => {}
    }
    // With the final parallelism (an elastic change sets it).
    untangle(&mut fates, indexed, parallelism as usize);
    // A stalled Job is compared 8 s after the last action (or its deadline, when it has one).
    let last_s = actions.iter().map(|a| a.after_ms.div_ceil(1000)).max().unwrap_or(0);
    let orphaned_restarts = shape.on_failure && actions.iter().any(|a| a.delete.is_some());
    let horizon_s = if stalls {
        (last_s + 8).max(if shape.deadline { ACTIVE_DEADLINE_S + 4 } else { 0 })
    } else if orphaned_restarts {
        // A failing OnFailure pod of a deleted Job restarts for ever: look a while, then stop.
        20
    } else {
        DEFAULT_HORIZON_S
    };
    let mut case = Case {
        name: format!("gen-{seed}-{i}"),
        spec,
        fates,
        actions,
        horizon_s,
        quota: Value::Null,
        refused: false,
        kueue: None,
        jobset: None,
        jobset_expect: Value::Null,
    };
    // Moving a failure may put a disruption's window on its new end, and moving a disruption a
    // failure's window on it: place both until neither moves (seed 5's gen-5-1964 takes two).
    for _ in 0..4 {
        let before = case.fates.clone();
        place_failures(&mut case);
        place_disruption(&mut case);
        if case.fates == before {
            break;
        }
    }
    case
}

fn fails(f: &Fate) -> bool {
    f.exit_code != 0 || f.container_exit_codes.values().any(|c| *c != 0)
}

/// Keeps fates from racing each other where even upstream alone is not deterministic: a pod
/// of the first wave failing at the same moment as another one ends (a FailJob message names
/// whichever failure the controller's sync looks at first, in its cache's order; upstream syncs
/// at once on a failure but batches a success for 1 s, so a success in the same moment may be
/// counted or its pod deleted), or two pods disrupted at once. Such a failing pod moves to a
/// run time no other first-wave pod has, or succeeds when there is none; only the first
/// disruption stays. Later waves start when the controller has reacted to the first, so
/// their ends are not aligned with it; what races remain are what `--reruns` is for.
fn untangle(fates: &mut Fates, indexed: bool, parallelism: usize) {
    let mut disrupted = false;
    let all = fates.by_order.iter_mut().chain(fates.by_index.values_mut().flatten());
    for f in all {
        if f.evict_after_ms.is_some() || f.delete_after_ms.is_some() {
            if disrupted {
                f.evict_after_ms = None;
                f.delete_after_ms = None;
                f.run_ms = RUN_TIMES_MS[2];
            }
            disrupted = true;
        }
    }
    let slot = |n: usize| {
        if indexed { Slot::Index { index: n as u32, attempt: 0 } } else { Slot::Order(n) }
    };
    let mut ends: BTreeMap<u64, usize> = BTreeMap::new();
    for n in 0..parallelism {
        *ends.entry(end_of(&fates.of(slot(n)))).or_default() += 1;
    }
    for n in 0..parallelism {
        let f = if indexed {
            fates.by_index.get_mut(&(n as u32)).and_then(|v| v.first_mut())
        } else {
            fates.by_order.get_mut(n)
        };
        // The default fate never fails, so every failing pod of the wave is listed; the one
        // disrupted pod ends at a time of its own.
        let Some(f) = f.filter(|f| fails(f) && end_of(f) == f.run_ms) else { continue };
        if ends.get(&f.run_ms).copied().unwrap_or(0) <= 1 {
            continue;
        }
        *ends.entry(f.run_ms).or_default() -= 1;
        match RUN_TIMES_MS.into_iter().find(|t| ends.get(t).copied().unwrap_or(0) == 0) {
            Some(t) => f.run_ms = t,
            None => {
                f.exit_code = 0;
                f.container_exit_codes.clear();
            }
        }
        *ends.entry(f.run_ms).or_default() += 1;
    }
}

/// When a pod's fate ends it, after it started: its disruption, else its exit.
fn end_of(f: &Fate) -> u64 {
    f.evict_after_ms.or(f.delete_after_ms).unwrap_or(f.run_ms)
}

/// A pod of a generated case whose start the grid fixes: its slot, and when it starts (ms after
/// the first pod started), up to `late` ms later.
#[derive(Debug, Clone, Copy)]
struct Aligned {
    slot: Slot,
    start: u64,
    late: u64,
}

impl Aligned {
    fn end(&self, fates: &Fates) -> u64 {
        self.start + end_of(&fates.of(self.slot))
    }

    /// When it may end: from its earliest end to `late` ms after.
    fn ends(&self, fates: &Fates) -> (u64, u64) {
        let e = self.end(fates);
        (e, e + self.late)
    }

    fn succeeds(&self, fates: &Fates) -> bool {
        let f = fates.of(self.slot);
        !fails(&f) && end_of(&f) == f.run_ms
    }
}

/// The pods of a generated case whose start the grid fixes: the first wave (at 0); the pods
/// that replace its successes while completions are left (a pod start after the next sync,
/// which comes a sync batch after the success at the latest, sooner when one was already due:
/// seed 1's gen-1-138 started one 0.3 s early); the pods a mid-run action adds (a pod start
/// after it: a Job spec change is synced at once; a parallelism or elastic increase, a resume). Replacements of failed pods wait 10 s or more of back-off counted from
/// a finish time the API stores to the second, so they are aligned with nothing and left out.
fn aligned_pods(c: &Case) -> Vec<Aligned> {
    let indexed = c.spec["completionMode"] == "Indexed";
    let mut completions = c.spec["completions"].as_u64();
    let parallelism = c.spec["parallelism"].as_u64().unwrap_or(1);
    let slot = |n: u64, attempt: usize| {
        if indexed { Slot::Index { index: n as u32, attempt } } else { Slot::Order(n as usize) }
    };
    let fates = &c.fates;
    let wave = parallelism.min(completions.unwrap_or(parallelism));
    let mut pods: Vec<Aligned> =
        (0..wave).map(|n| Aligned { slot: slot(n, 0), start: 0, late: 0 }).collect();
    let mut next = wave;
    // In time order: a mid-run action that adds pods before the first wave's successes end
    // takes the indexes (or completions) their replacements would have had.
    let mut successes: Vec<u64> =
        pods.iter().filter(|p| p.succeeds(fates)).map(|p| p.end(fates)).collect();
    successes.sort_unstable();
    let mut successes = successes.into_iter().peekable();
    let mut actions = c.actions.iter().filter(|a| a.since == Since::FirstPodRunning).peekable();
    let mut suspended: Vec<Slot> = Vec::new();
    loop {
        let success_first = match (successes.peek(), actions.peek()) {
            (None, None) => break,
            (Some(&e), Some(a)) => e < a.after_ms,
            (s, _) => s.is_some(),
        };
        if success_first {
            let e = successes.next().unwrap_or_default();
            // Replaced while completions are left (pods created so far, failed ones' retries
            // aside, are the completions taken).
            if completions.is_some_and(|c| next < c) {
                let start = e + POD_START_LAG_MS;
                pods.push(Aligned { slot: slot(next, 0), start, late: SYNC_BATCH_MS });
                next += 1;
            }
            continue;
        }
        let Some(a) = actions.next() else { break };
        let at = a.after_ms;
        let start = at + POD_START_LAG_MS;
        let spec = &a.patch["spec"];
        let running: Vec<Slot> =
            pods.iter().filter(|p| p.start <= at && p.end(fates) > at).map(|p| p.slot).collect();
        if spec["suspend"] == true {
            suspended = running;
        } else if spec["suspend"] == false {
            for s in std::mem::take(&mut suspended) {
                let slot = match s {
                    Slot::Index { index, attempt } => Slot::Index { index, attempt: attempt + 1 },
                    Slot::Order(_) => {
                        next += 1;
                        slot(next - 1, 0)
                    }
                };
                pods.push(Aligned { slot, start, late: 0 });
            }
        } else if let Some(p) = spec["parallelism"].as_u64() {
            let done = pods.iter().filter(|q| q.succeeds(fates) && q.end(fates) <= at).count();
            // An elastic change holds for the successes' replacements after it too.
            completions = spec["completions"].as_u64().or(completions);
            let want = completions.map_or(p, |c| p.min(c.saturating_sub(done as u64)));
            for _ in (running.len() as u64)..want {
                pods.push(Aligned { slot: slot(next, 0), start, late: 0 });
                next += 1;
            }
        }
    }
    pods
}

/// The listed fate of `slot` (the default fate is never disrupted).
fn listed_mut(fates: &mut Fates, slot: Slot) -> Option<&mut Fate> {
    match slot {
        Slot::Index { index, attempt } => fates.by_index.get_mut(&index)?.get_mut(attempt),
        Slot::Order(n) => fates.by_order.get_mut(n),
    }
}

/// Whether a disruption at `at` (ms after the first pod started) is decided with no other
/// aligned pod ending meanwhile (`ends`: when each may end, earliest and latest): a pod ending
/// between the disruption and the sync that acts on it (a sync batch later at most), give or
/// take the jitter, is counted or deleted as the machine's timing falls.
fn decided_alone(at: u64, ends: &[(u64, u64)]) -> bool {
    ends.iter().all(|&(lo, hi)| hi + JITTER_MS <= at || lo >= at + SYNC_BATCH_MS + JITTER_MS)
}

/// Moves the disruption of an aligned pod to the first time of [`DISRUPT_AFTER_MS`] at which it
/// is [`decided_alone`], or drops it (the pod then runs its long run) when none is. Seed 1's
/// gen-1-210 is why: a pod its parallelism increase started ended 60 ms before the sync that
/// acted on the eviction at 4.8 s (so it was counted) or, on a loaded machine, just after it
/// (so it was deleted), on either controller.
fn place_disruption(c: &mut Case) {
    let pods = aligned_pods(c);
    for (i, p) in pods.iter().enumerate() {
        let f = c.fates.of(p.slot);
        if f.evict_after_ms.is_none() && f.delete_after_ms.is_none() {
            continue;
        }
        let ends = other_ends(&pods, i, &c.fates);
        // A disrupted pod that may start late is checked at each end of its start's span.
        let alone = |d: u64| [0, p.late].iter().all(|l| decided_alone(p.start + l + d, &ends));
        let at = DISRUPT_AFTER_MS.into_iter().find(|&d| alone(d));
        let Some(f) = listed_mut(&mut c.fates, p.slot) else { continue };
        let set = |x: &mut Option<u64>| {
            if x.is_some() {
                *x = at;
            }
        };
        set(&mut f.evict_after_ms);
        set(&mut f.delete_after_ms);
    }
}

/// Ends (earliest, latest) of every aligned pod but the `i`-th.
fn other_ends(pods: &[Aligned], i: usize, fates: &Fates) -> Vec<(u64, u64)> {
    pods.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, q)| q.ends(fates)).collect()
}

/// A failing first-wave pod may decide as a disruption does (fail the Job, deleting the pods
/// still running): one whose failure is not [`decided_alone`] moves to the first run time of
/// the grid at which it is, or succeeds when there is none. Seed 4242's gen-4242-223 is why:
/// a 3300 ms failure exceeding `backoffLimit: 0` against the 3300 ms pod replacing a 300 ms
/// success, which was counted or deleted as the machine's timing fell. Pods under
/// `restartPolicy: OnFailure` restart instead of ending, so their failures are left alone.
fn place_failures(c: &mut Case) {
    if c.spec["template"]["spec"]["restartPolicy"] == "OnFailure" {
        return;
    }
    // Each change may move the replacements of successes: look again, a bounded number of times.
    for _ in 0..8 {
        let pods = aligned_pods(c);
        let tangled = pods.iter().enumerate().find(|(i, p)| {
            let f = c.fates.of(p.slot);
            fails(&f)
                && end_of(&f) == f.run_ms
                && !failure_alone(p, f.run_ms, &other_ends(&pods, *i, &c.fates))
        });
        let Some((i, p)) = tangled else { return };
        let p = *p;
        let ends = other_ends(&pods, i, &c.fates);
        let Some(f) = listed_mut(&mut c.fates, p.slot) else { return };
        match RUN_TIMES_MS.into_iter().find(|&t| failure_alone(&p, t, &ends)) {
            Some(t) => f.run_ms = t,
            None => {
                f.exit_code = 0;
                f.container_exit_codes.clear();
            }
        }
    }
}

/// Whether the failure of aligned pod `p` after `run_ms` is [`decided_alone`] wherever in its
/// start's span the pod starts.
fn failure_alone(p: &Aligned, run_ms: u64, ends: &[(u64, u64)]) -> bool {
    [0, p.late].iter().all(|l| decided_alone(p.start + l + run_ms, ends))
}

/// The cases to run: built-ins then `generated` random ones, or only the one named `only`.
pub fn select(seed: u64, generated: usize, only: Option<&str>) -> anyhow::Result<Vec<Case>> {
    let mut all = builtin()?;
    match only {
        Some(name) => {
            // A generated name runs without generating the whole batch before it.
            if let Some(i) =
                name.strip_prefix(&format!("gen-{seed}-")).and_then(|i| i.parse::<usize>().ok())
            {
                return Ok(vec![generate_one(seed, i)]);
            }
            // `prefix*`: every built-in case whose name starts so (a Kueue group together);
            // several patterns comma-separated.
            let patterns: Vec<&str> = name.split(',').map(str::trim).collect();
            for p in &patterns {
                let hit = |c: &Case| match p.strip_suffix('*') {
                    Some(prefix) => c.name.starts_with(prefix),
                    None => c.name == *p,
                };
                anyhow::ensure!(all.iter().any(hit), "no case named {p}");
            }
            all.retain(|c| {
                patterns.iter().any(|p| match p.strip_suffix('*') {
                    Some(prefix) => c.name.starts_with(prefix),
                    None => c.name == *p,
                })
            });
            Ok(all)
        }
        None => {
            all.extend(generate(seed, generated));
            Ok(all)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_cases_parse_and_have_unique_names() {
        let cases = builtin().unwrap();
        assert!(cases.len() >= 7);
        let mut names: Vec<_> = cases.iter().map(|c| c.name.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), cases.len());
    }

    #[test]
    fn generation_is_deterministic_per_seed() {
        assert_eq!(generate(7, 20), generate(7, 20));
        assert_ne!(generate(7, 20), generate(8, 20));
        assert_eq!(select(7, 0, Some("gen-7-13")).unwrap()[0], generate(7, 20)[13]);
    }

    /// The API server's validation rules the generator must keep (a case whose Job the
    /// server refuses stops the whole run).
    #[test]
    fn generated_jobs_keep_the_validation_rules() {
        let mut seen = std::collections::BTreeSet::new();
        for c in generate(3, 3000) {
            let s = &c.spec;
            let indexed = s["completionMode"] == "Indexed";
            let rules = s["podFailurePolicy"]["rules"].as_array().cloned().unwrap_or_default();
            let containers: Vec<&str> = s["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap())
                .collect();
            if indexed {
                assert!(s["completions"].is_u64(), "{}", c.name);
            } else {
                for k in ["backoffLimitPerIndex", "maxFailedIndexes", "successPolicy"] {
                    assert!(s.get(k).is_none(), "{}: {k} needs Indexed", c.name);
                }
            }
            if s.get("maxFailedIndexes").is_some() {
                assert!(s.get("backoffLimitPerIndex").is_some(), "{}", c.name);
                assert!(s["maxFailedIndexes"].as_u64() <= s["completions"].as_u64());
            }
            if !rules.is_empty() {
                assert_eq!(s["template"]["spec"]["restartPolicy"], "Never", "{}", c.name);
                assert!(s.get("podReplacementPolicy").is_none_or(|p| p == "Failed"), "{}", c.name);
            }
            for r in &rules {
                seen.insert(r["action"].as_str().unwrap().to_string());
                if r["action"] == "FailIndex" {
                    assert!(s.get("backoffLimitPerIndex").is_some(), "{}", c.name);
                }
                if let Some(e) = r.get("onExitCodes") {
                    let v: Vec<i64> = e["values"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_i64().unwrap())
                        .collect();
                    assert!(v.windows(2).all(|w| w[0] < w[1]), "{}: values sorted, unique", c.name);
                    if e["operator"] == "In" {
                        assert!(!v.contains(&0), "{}: In may not name 0", c.name);
                    }
                    if let Some(n) = e["containerName"].as_str() {
                        assert!(containers.contains(&n), "{}: no container {n}", c.name);
                    }
                }
            }
            if let Some(sp) = s["successPolicy"]["rules"].as_array() {
                let n = s["completions"].as_u64().unwrap();
                for r in sp {
                    assert!(
                        r.get("succeededIndexes").is_some() || r.get("succeededCount").is_some()
                    );
                    if let Some(k) = r["succeededCount"].as_u64() {
                        assert!(k >= 1 && k <= n, "{}", c.name);
                    }
                    if let Some(list) = r["succeededIndexes"].as_str() {
                        let last = list.rsplit([',', '-']).next().unwrap().parse::<u64>().unwrap();
                        assert!(last < n, "{}: index {last} out of range", c.name);
                    }
                }
            }
            for a in &c.actions {
                if let Some(n) = a.patch["spec"].get("completions") {
                    // Elastic Indexed: completions change only with an equal parallelism, from
                    // a Job whose completions equal its parallelism.
                    assert!(indexed);
                    assert_eq!(a.patch["spec"]["parallelism"], *n);
                    assert_eq!(s["parallelism"], s["completions"], "{}", c.name);
                }
            }
        }
        for action in ["FailJob", "FailIndex", "Ignore", "Count"] {
            assert!(seen.contains(action), "no {action} rule generated");
        }
    }

    /// A CI-sized run (300 cases of seed 1) has every dimension of the list.
    #[test]
    fn a_ci_sized_run_covers_every_dimension() {
        let cases = generate(1, 300);
        let has = |what: &str, f: &dyn Fn(&Case) -> bool| {
            let n = cases.iter().filter(|c| f(c)).count();
            assert!(n > 0, "no generated case has {what}");
        };
        let spec = |k: &'static str| move |c: &Case| c.spec.get(k).is_some();
        let text = |c: &Case| serde_json::to_string(c).unwrap();
        for k in [
            "backoffLimitPerIndex",
            "maxFailedIndexes",
            "successPolicy",
            "podFailurePolicy",
            "activeDeadlineSeconds",
            "suspend",
        ] {
            has(k, &spec(k));
        }
        has("parallelism 0", &|c| c.spec["parallelism"] == 0);
        has("NonIndexed without completions", &|c| c.spec.get("completions").is_none());
        for p in ["Failed", "TerminatingOrFailed"] {
            has(p, &|c| c.spec["podReplacementPolicy"] == p);
        }
        for k in ["succeededIndexes", "succeededCount", "onPodConditions", "containerName"] {
            has(k, &|c| text(c).contains(k));
        }
        for a in ["FailJob", "FailIndex", "Ignore", "Count", "\"NotIn\"", "\"In\""] {
            has(a, &|c| serde_json::to_string(&c.spec["podFailurePolicy"]).unwrap().contains(a));
        }
        has("OnFailure", &|c| c.spec["template"]["spec"]["restartPolicy"] == "OnFailure");
        has("a sidecar exit code", &|c| text(c).contains("container_exit_codes"));
        has("an eviction", &|c| text(c).contains("evict_after_ms"));
        has("a user's pod deletion", &|c| text(c).contains("delete_after_ms"));
        has("a slow termination", &|c| text(c).contains("termination_ms"));
        for p in ["Foreground", "Background", "Orphan"] {
            has(p, &|c| c.actions.iter().any(|a| a.delete.as_deref() == Some(p)));
        }
        has("a resume", &|c| c.actions.iter().any(|a| a.patch["spec"]["suspend"] == false));
        has("a mid-run suspend", &|c| c.actions.iter().any(|a| a.patch["spec"]["suspend"] == true));
        has("an elastic change", &|c| {
            c.actions.iter().any(|a| a.patch["spec"].get("completions").is_some())
        });
        has("a parallelism change", &|c| {
            c.actions.iter().any(|a| {
                a.patch["spec"].get("parallelism").is_some()
                    && a.patch["spec"].get("completions").is_none()
            })
        });
    }

    #[test]
    fn no_first_wave_failure_ends_with_another_pod() {
        for c in generate(5, 2000) {
            let indexed = c.spec["completionMode"] == "Indexed";
            // At most `completions` pods run at once.
            let cap = c.spec["completions"].as_u64().unwrap_or(u64::MAX);
            let p = c.spec["parallelism"].as_u64().unwrap().min(cap) as usize;
            let wave: Vec<Fate> = (0..p)
                .map(|n| {
                    c.fates.of(if indexed {
                        Slot::Index { index: n as u32, attempt: 0 }
                    } else {
                        Slot::Order(n)
                    })
                })
                .collect();
            for (i, f) in wave.iter().enumerate().filter(|(_, f)| fails(f)) {
                let same =
                    wave.iter().enumerate().filter(|(j, g)| *j != i && end_of(g) == end_of(f));
                assert_eq!(same.count(), 0, "{}: a failure ends with another pod", c.name);
            }
            let disruptions = serde_json::to_string(&c.fates).unwrap().matches("_after_ms").count();
            assert!(disruptions <= 1, "{}", c.name);
        }
    }

    /// A disruption's decision never meets the end of another pod whose start the grid fixes
    /// (the first wave, replacements of its successes, pods a mid-run action adds).
    #[test]
    fn no_disruption_is_decided_as_an_aligned_pod_ends() {
        let mut moved = 0;
        for c in generate(5, 2000) {
            let pods = aligned_pods(&c);
            for (i, p) in pods.iter().enumerate() {
                let f = c.fates.of(p.slot);
                let Some(d) = f.evict_after_ms.or(f.delete_after_ms) else { continue };
                moved += usize::from(d != DISRUPT_AFTER_MS[0]);
                let ends = other_ends(&pods, i, &c.fates);
                for at in [p.start + d, p.start + p.late + d] {
                    assert!(decided_alone(at, &ends), "{}: {ends:?} around {at}", c.name);
                }
            }
        }
        assert!(moved > 0, "no disruption needed moving: the check is not exercised");
        // Seed 1's gen-1-210: the parallelism increase at 2.3 s starts a 3300 ms pod that ends
        // 5.75 s after the first pod started, inside the window of an eviction at 4.8 s.
        let c = &select(1, 0, Some("gen-1-210")).unwrap()[0];
        assert_eq!(c.fates.by_order[0].evict_after_ms, Some(DISRUPT_AFTER_MS[1]), "{c:?}");
        let pods = aligned_pods(c);
        let starts: Vec<u64> = pods.iter().map(|p| p.start).collect();
        assert_eq!(starts, [0, ACTION_AT_MS + POD_START_LAG_MS, ACTION_AT_MS + POD_START_LAG_MS]);
        // gen-1-138: the pod replacing a 300 ms success may start up to a sync batch early and
        // end (3300 ms later) anywhere from 3.75 to 4.75 s, so neither 4.8 nor 3.5 s is clear.
        let c = &select(1, 0, Some("gen-1-138")).unwrap()[0];
        assert_eq!(c.fates.by_order[0].delete_after_ms, Some(DISRUPT_AFTER_MS[2]), "{c:?}");
    }

    /// Neither does the failure of an aligned pod (seed 4242's gen-4242-223 had one at 3.3 s
    /// with the 3300 ms pod that replaced a 300 ms success ending 3.75 to 4.75 s; seed 1's
    /// gen-1-27 one at 2.75 s, in a pod its parallelism increase added, with the first wave's
    /// 3300 ms pods ending in the sync batch after it).
    #[test]
    fn no_aligned_failure_is_decided_as_another_aligned_pod_ends() {
        let mut late_failures = 0;
        for c in generate(5, 2000) {
            if c.spec["template"]["spec"]["restartPolicy"] == "OnFailure" {
                continue;
            }
            let pods = aligned_pods(&c);
            for (i, p) in pods.iter().enumerate() {
                let f = c.fates.of(p.slot);
                if fails(&f) && end_of(&f) == f.run_ms {
                    late_failures += usize::from(p.start > 0);
                    let ends = other_ends(&pods, i, &c.fates);
                    assert!(failure_alone(p, f.run_ms, &ends), "{}: {p:?} {ends:?}", c.name);
                }
            }
        }
        assert!(late_failures > 0, "no failure after the first wave: the check is not exercised");
        let c = &select(4242, 0, Some("gen-4242-223")).unwrap()[0];
        let pods = aligned_pods(c);
        let f = c.fates.of(pods[0].slot);
        assert!(!fails(&f) || decided_alone(f.run_ms, &other_ends(&pods, 0, &c.fates)), "{c:?}");
        // gen-1-27 (Indexed, completions 3, parallelism 2 raised to 3 at 2.3 s): the raise
        // starts index 2, before the first wave's successes could have it replaced, and its
        // failure (backoffLimit 0 fails the Job) moves past the ends of indexes 0 and 1.
        let c = &select(1, 0, Some("gen-1-27")).unwrap()[0];
        let pods = aligned_pods(c);
        let slots: Vec<(Slot, u64)> = pods.iter().map(|p| (p.slot, p.start)).collect();
        let at = ACTION_AT_MS + POD_START_LAG_MS;
        assert_eq!(
            slots,
            [0, 1, 2]
                .map(|index| (Slot::Index { index, attempt: 0 }, if index < 2 { 0 } else { at }))
        );
        let f = c.fates.of(pods[2].slot);
        assert!(fails(&f) && at + f.run_ms > RUN_TIMES_MS[1] + SYNC_BATCH_MS + JITTER_MS, "{f:?}");
    }

    #[test]
    fn fates_fall_back_to_the_default() {
        let mut f = Fates::default();
        f.by_index.insert(1, vec![Fate { exit_code: 1, ..Fate::default() }]);
        assert_eq!(f.of(Slot::Index { index: 1, attempt: 0 }).exit_code, 1);
        assert_eq!(f.of(Slot::Index { index: 1, attempt: 1 }).exit_code, 0);
        assert_eq!(f.of(Slot::Order(3)), Fate::default());
    }
}
