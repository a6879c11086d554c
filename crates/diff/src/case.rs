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
}

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
        }
    }
}

/// A user's change to the Job at a fixed time: a merge patch, a deletion, or both.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct UserAction {
    /// Time after the Job's creation.
    pub after_ms: u64,
    /// JSON merge patch applied to the Job (none when null).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub patch: Value,
    /// Delete the Job with this propagation policy (`Foreground`, `Background`, `Orphan`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete: Option<String>,
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
        let f = match slot {
            Slot::Index { index, attempt } => {
                self.by_index.get(&index).and_then(|v| v.get(attempt))
            }
            Slot::Order(n) => self.by_order.get(n),
        };
        f.cloned().unwrap_or_else(|| self.default.clone())
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
        j
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

/// Run times of generated pods: 2 s apart, more than either controller takes to react to a
/// pod's end, so which pod ends first never depends on the controller's speed (pods of one
/// wave start within tens of milliseconds of each other).
const RUN_TIMES_MS: [u64; 3] = [300, 2300, 4300];
/// Run time of pods meant to outlive a case's timed events (deadline, eviction, deletion).
const LONG_RUN_MS: u64 = 30_000;
/// When a generated user action (or the first of two) happens: between the ends of the first
/// wave's 300 ms and 2300 ms pods, well clear of both.
const ACTION_AT_MS: u64 = 1500;
/// `activeDeadlineSeconds` of generated Jobs that have one: seconds after the third wave of
/// short pods (their only run times are 300 ms and long), well before any long pod ends.
const ACTIVE_DEADLINE_S: u64 = 10;
/// When a generated pod is evicted or deleted, after it started running.
const DISRUPT_AFTER_MS: u64 = 500;
/// How long a slow-to-stop pod takes to terminate once deleted.
const TERMINATION_MS: u64 = 2000;
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
                f.evict_after_ms = Some(DISRUPT_AFTER_MS);
            }
            2 => {
                f.run_ms = LONG_RUN_MS;
                f.delete_after_ms = Some(DISRUPT_AFTER_MS);
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
    let mut actions = Vec::new();
    // Whether the Job ends up with parallelism 0 (it then never finishes by itself).
    let mut stalls = parallelism == 0;
    match rng.random_range(0..16) {
        0 => {
            spec["suspend"] = json!(true);
            actions.push(UserAction {
                after_ms: 3000,
                patch: json!({"spec": {"suspend": false}}),
                delete: None,
            });
        }
        1 => {
            actions.push(UserAction {
                after_ms: ACTION_AT_MS,
                patch: json!({"spec": {"suspend": true}}),
                delete: None,
            });
            actions.push(UserAction {
                after_ms: ACTION_AT_MS + 3000,
                patch: json!({"spec": {"suspend": false}}),
                delete: None,
            });
        }
        2 => {
            let p = rng.random_range(u32::from(parallelism == 0)..=3);
            stalls = p == 0;
            actions.push(UserAction {
                after_ms: ACTION_AT_MS,
                patch: json!({"spec": {"parallelism": p}}),
                delete: None,
            });
        }
        3 if indexed && !per_index && !success_policy => {
            // Elastic Indexed: completions may change only together with an equal parallelism.
            parallelism = completions.unwrap_or(1);
            spec["parallelism"] = json!(parallelism);
            stalls = false;
            let n = rng.random_range(1..=4);
            actions.push(UserAction {
                after_ms: ACTION_AT_MS,
                patch: json!({"spec": {"completions": n, "parallelism": n}}),
                delete: None,
            });
        }
        4 => {
            let policy = pick(rng, &["Foreground", "Background", "Orphan"]);
            actions.push(UserAction {
                after_ms: ACTION_AT_MS,
                patch: Value::Null,
                delete: Some(policy.into()),
            });
        }
        _ => {}
    }
    let mut fates = Fates::default();
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
    // A stalled Job is compared 6 s after the last action (or its deadline, when it has one).
    let last_s = actions.iter().map(|a| a.after_ms.div_ceil(1000)).max().unwrap_or(0);
    let horizon_s = if stalls {
        (last_s + 6).max(if shape.deadline { ACTIVE_DEADLINE_S + 4 } else { 0 })
    } else {
        DEFAULT_HORIZON_S
    };
    Case { name: format!("gen-{seed}-{i}"), spec, fates, actions, horizon_s }
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
            all.retain(|c| c.name == name);
            anyhow::ensure!(!all.is_empty(), "no case named {name}");
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

    #[test]
    fn fates_fall_back_to_the_default() {
        let mut f = Fates::default();
        f.by_index.insert(1, vec![Fate { exit_code: 1, ..Fate::default() }]);
        assert_eq!(f.of(Slot::Index { index: 1, attempt: 0 }).exit_code, 1);
        assert_eq!(f.of(Slot::Index { index: 1, attempt: 1 }).exit_code, 0);
        assert_eq!(f.of(Slot::Order(3)), Fate::default());
    }
}
