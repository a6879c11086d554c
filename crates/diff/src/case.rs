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
    /// Evict it through the Eviction API this long after it started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evict_after_ms: Option<u64>,
    /// A user deletes it (gracefully) this long after it started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_after_ms: Option<u64>,
}

fn default_run_ms() -> u64 {
    500
}

impl Default for Fate {
    fn default() -> Self {
        Self { run_ms: default_run_ms(), exit_code: 0, evict_after_ms: None, delete_after_ms: None }
    }
}

/// A merge patch to the Job at a fixed time.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct UserAction {
    /// Time after the Job's creation.
    pub after_ms: u64,
    /// JSON merge patch applied to the Job.
    pub patch: Value,
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

fn random_fate(rng: &mut StdRng) -> Fate {
    const CODES: [i64; 6] = [0, 0, 0, 1, 3, 42];
    Fate {
        run_ms: RUN_TIMES_MS[rng.random_range(0..RUN_TIMES_MS.len())],
        exit_code: CODES[rng.random_range(0..CODES.len())],
        evict_after_ms: None,
        delete_after_ms: None,
    }
}

fn generate_one(seed: u64, i: usize) -> Case {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(i as u64));
    let indexed = rng.random_bool(0.5);
    let completions: u32 = rng.random_range(1..=3);
    // Parallelism 0 now and then: nothing runs, compared at the horizon.
    let parallelism: u32 = if rng.random_bool(0.1) { 0 } else { rng.random_range(1..=3) };
    // Pod-failure back-off is 10 s, 20 s, ...: small limits keep a case under a minute.
    let backoff_limit: u32 = rng.random_range(0..=1);
    let mut spec = json!({
        "completions": completions, "parallelism": parallelism, "backoffLimit": backoff_limit,
        "completionMode": if indexed { "Indexed" } else { "NonIndexed" },
    });
    if rng.random_bool(0.3) {
        let rule = match rng.random_range(0..3) {
            0 => json!({"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}),
            1 => json!({"action": "Ignore", "onExitCodes": {"containerName": "main",
                "operator": "In", "values": [3]}}),
            _ => json!({"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [0, 3]}}),
        };
        spec["podFailurePolicy"] = json!({"rules": [rule]});
    }
    let mut fates = Fates::default();
    if indexed {
        for index in 0..completions {
            let tries = rng.random_range(0..=2);
            let list: Vec<Fate> = (0..tries).map(|_| random_fate(&mut rng)).collect();
            if !list.is_empty() {
                fates.by_index.insert(index, list);
            }
        }
    } else {
        let n = rng.random_range(0..=(completions + backoff_limit) as usize);
        fates.by_order = (0..n).map(|_| random_fate(&mut rng)).collect();
    }
    let horizon_s = if parallelism == 0 { 6 } else { DEFAULT_HORIZON_S };
    Case { name: format!("gen-{seed}-{i}"), spec, fates, actions: Vec::new(), horizon_s }
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
