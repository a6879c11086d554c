//! The comparator: pure functions from what one run left behind ([`RawRun`]) to what a user
//! sees once names, uids and times are put aside ([`Observed`]), and from two of those to
//! their differences, part by part.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use crate::kubelet::PodRecord;

/// Length of the random suffix the API server appends to a `generateName`.
const NAME_SUFFIX_LEN: usize = 5;
/// Prefix of the ServiceAccount token volume, which also ends in a random suffix.
const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";

/// What one run of a case left on the server.
#[derive(Debug, Clone, Default)]
pub struct RawRun {
    /// The Job as read at the end (`Null` when gone).
    pub job: Value,
    /// Every pod the kubelet saw.
    pub pods: Vec<PodRecord>,
    /// The namespace's core/v1 Events.
    pub events: Vec<Value>,
    /// The Job controller's successful writes in the namespace, `"<verb> <resource>"` → count.
    pub writes: BTreeMap<String, u64>,
    /// When each kind of state change was first seen, seconds after the Job's creation.
    pub milestones: BTreeMap<String, f64>,
    /// The API server's refusals of the case's own requests, in order (cases of refused Jobs).
    pub refusals: Vec<Value>,
    /// When the Job was created (the origin of `milestones`), to put cases of one Kueue group
    /// on one timeline.
    pub started: Option<std::time::Instant>,
}

/// A run as compared: normalised and ordered.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Observed {
    /// `status` of the Job, timestamps replaced by `"<set>"`, uid lists by their length.
    pub status: Value,
    /// One entry per pod ever created, sorted (a multiset).
    pub pods: Vec<Value>,
    /// One `[type, reason, message, source.component, reportingComponent]` per event occurrence, sorted (a multiset).
    pub events: Vec<Value>,
    /// The controller's writes as compared: exact counts for pod writes, presence for the rest
    /// (see [`writes`]).
    pub writes: Value,
    /// Every write count, reported beside the comparison (not compared).
    pub write_counts: BTreeMap<String, u64>,
    /// See [`RawRun::milestones`] (reported, not compared).
    pub milestones: BTreeMap<String, f64>,
    /// See [`RawRun::refusals`].
    pub refusals: Vec<Value>,
}

/// The compared parts, in report order.
pub const PARTS: [&str; 5] = ["status", "pods", "events", "writes", "refusals"];

/// Writes compared by exact count: the pods a controller creates, and how many distinct pods
/// it deletes and patches (the tracking finalizer's removal), are what a user sees of its
/// work. Other writes are compared by presence: how many status updates carry the same end
/// state depends on how a controller batches pod events (upstream waits 1 s per Job);
/// upstream patches some pods more than once, and a second delete of a terminating pod
/// succeeds too, so raw pod patch and delete counts are reported, distinct pods compared;
/// event occurrences are compared in `events` already.
const EXACT_WRITES: [&str; 3] = ["create pods", "pods deleted", "pods patched"];

/// The compared form of a run's writes.
fn writes(w: &BTreeMap<String, u64>) -> Value {
    let mut out = serde_json::Map::new();
    for (k, n) in w.iter().filter(|(_, n)| **n > 0) {
        let v = if EXACT_WRITES.contains(&k.as_str()) { json!(n) } else { json!("<some>") };
        out.insert(k.clone(), v);
    }
    Value::Object(out)
}

/// One difference in one part.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    /// `status`, `pods` or `events`.
    pub part: String,
    /// JSON path (status) or `only upstream` / `only kjob` (multisets).
    pub path: String,
    /// The upstream value (`Null` when absent).
    pub upstream: Value,
    /// The kjob value (`Null` when absent).
    pub kjob: Value,
}

/// The name without the random suffix: `job-x7k2p` → `job-*`, `job-2-x7k2p` → `job-2-*`.
pub fn strip_suffix(name: &str) -> String {
    match name.rsplit_once('-') {
        Some((stem, s))
            if s.len() == NAME_SUFFIX_LEN && s.bytes().all(|b| b.is_ascii_alphanumeric()) =>
        {
            format!("{stem}-*")
        }
        _ => name.to_string(),
    }
}

/// Alphabet of the random suffix of a `generateName` (apimachinery's `utilrand.String`).
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `s` with the random suffix of every generated name of the case's Job's pods
/// (`job-<suffix>`, `job-<index>-<suffix>`) replaced by `*`: the name of a pod that was never
/// created (its create refused, named in a FailedCreate event) is known to no record.
pub fn strip_generated_names(s: &str) -> String {
    let stem = format!("{}-", crate::case::JOB_NAME);
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let at_word = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'-');
        if at_word && s[i..].starts_with(&stem) {
            let mut j = i + stem.len();
            let digits = b[j..].iter().take_while(|c| c.is_ascii_digit()).count();
            if digits > 0 && b.get(j + digits) == Some(&b'-') {
                j += digits + 1;
            }
            let suffix = b.get(j..j + NAME_SUFFIX_LEN).filter(|x| {
                x.iter().all(|c| SUFFIX_ALPHABET.contains(c))
                    && b.get(j + NAME_SUFFIX_LEN)
                        .is_none_or(|c| !(c.is_ascii_alphanumeric() || *c == b'-'))
            });
            if suffix.is_some() {
                out.push_str(&s[i..j]);
                out.push('*');
                i = j + NAME_SUFFIX_LEN;
                continue;
            }
        }
        let ch = s[i..].chars().next().unwrap_or_default();
        out.push(ch);
        i += ch.len_utf8().max(1);
    }
    out
}

/// Replaces, in every string of `v`, each `from` by its `to` (longest first) and the token
/// volume's random suffix by `*`.
fn rewrite(v: &mut Value, subst: &[(String, String)]) {
    match v {
        Value::String(s) => {
            for (from, to) in subst {
                if !from.is_empty() && s.contains(from.as_str()) {
                    *s = s.replace(from.as_str(), to);
                }
            }
            if let Some(i) = s.find(TOKEN_VOLUME_PREFIX) {
                let start = i + TOKEN_VOLUME_PREFIX.len();
                let end = (start + NAME_SUFFIX_LEN).min(s.len());
                if s.is_char_boundary(end) {
                    s.replace_range(start..end, "*");
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rewrite(x, subst)),
        Value::Object(o) => o.values_mut().for_each(|x| rewrite(x, subst)),
        _ => {}
    }
}

fn present(v: &mut Value, key: &str) {
    if let Some(o) = v.as_object_mut()
        && let Some(x) = o.get_mut(key)
        && !x.is_null()
    {
        *x = json!("<set>");
    }
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

/// The substitutions of a run: pod names → stripped, the Job's and pods' uids → placeholders.
/// The Job's uid comes from the Job, or, once it is gone (deleted in the case), from its
/// pods' controller references.
fn substitutions(raw: &RawRun) -> Vec<(String, String)> {
    let mut subst: Vec<(String, String)> = Vec::new();
    let owner_uids = raw.pods.iter().filter_map(|r| {
        r.first.pointer("/metadata/ownerReferences")?.as_array()?.iter().find_map(|o| {
            (o["kind"] == "Job" && o["controller"] == true).then(|| o["uid"].as_str()).flatten()
        })
    });
    let job_uids: std::collections::BTreeSet<&str> =
        std::iter::once(str_at(&raw.job, "/metadata/uid")).chain(owner_uids).collect();
    for uid in job_uids.into_iter().filter(|u| !u.is_empty()) {
        subst.push((uid.to_string(), "<job-uid>".into()));
    }
    for r in &raw.pods {
        let name = str_at(&r.first, "/metadata/name");
        subst.push((name.to_string(), strip_suffix(name)));
        let uid = str_at(&r.first, "/metadata/uid");
        subst.push((uid.to_string(), "<pod-uid>".into()));
    }
    subst.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    subst.dedup();
    subst
}

fn sorted(mut v: Vec<Value>) -> Vec<Value> {
    v.sort_by_key(|x| x.to_string());
    v
}

/// `kind` of the object a JobSet case leaves as its "Job": `jobset` (the JobSet as read at
/// the end) and `jobs` (each Job of the namespace then, by name).
pub const JOBSET_RUN_KIND: &str = "JobSetRun";

/// The status as compared: a Job's, or for a JobSet case the JobSet's and each Job's.
fn status(job: &Value) -> Value {
    if job["kind"] != JOBSET_RUN_KIND {
        return job_status(job);
    }
    let mut set = job["jobset"].get("status").cloned().unwrap_or_else(|| json!({}));
    if let Some(Value::Array(cs)) = set.get_mut("conditions") {
        for c in cs {
            present(c, "lastTransitionTime");
        }
    }
    let jobs: serde_json::Map<String, Value> = job["jobs"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), job_status(v))).collect())
        .unwrap_or_default();
    json!({"jobset": set, "jobs": jobs})
}

/// A Job's status as compared.
fn job_status(job: &Value) -> Value {
    let mut s = job.get("status").cloned().unwrap_or_else(|| json!({}));
    for k in ["startTime", "completionTime"] {
        present(&mut s, k);
    }
    if let Some(Value::Array(cs)) = s.get_mut("conditions") {
        for c in cs {
            present(c, "lastProbeTime");
            present(c, "lastTransitionTime");
        }
    }
    if let Some(Value::Object(u)) = s.get_mut("uncountedTerminatedPods") {
        for v in u.values_mut() {
            *v = json!(v.as_array().map_or(0, Vec::len));
        }
    }
    s
}

/// The pod's finalizers, `Null` when none (absent and empty look alike to users).
fn finalizers(p: &Value) -> &Value {
    match p.pointer("/metadata/finalizers") {
        Some(Value::Array(a)) if !a.is_empty() => &p["metadata"]["finalizers"],
        _ => &Value::Null,
    }
}

/// One pod as compared: metadata as created, spec as created, and how it ended.
fn pod(r: &PodRecord) -> Value {
    let m = &r.first["metadata"];
    let mut spec = r.first.get("spec").cloned().unwrap_or(Value::Null);
    if let Some(o) = spec.as_object_mut() {
        o.remove("nodeName");
    }
    let last = &r.last;
    let mut annotations = m.get("annotations").cloned().unwrap_or(Value::Null);
    if let Some(w) = annotations.get_mut(KUEUE_WORKLOAD_ANNOTATION) {
        *w = json!("<the Job's Workload>");
    }
    json!({
        "name": strip_suffix(str_at(&r.first, "/metadata/name")),
        "generateName": m.get("generateName"),
        "labels": m.get("labels"),
        "annotations": annotations,
        "finalizers": m.get("finalizers"),
        "ownerReferences": m.get("ownerReferences"),
        "spec": spec,
        "end": {
            "phase": last.pointer("/status/phase"),
            // A gone pod has none left: its DELETED event may still show the one whose
            // removal let it go (the server sends the last stored version), depending only
            // on whether the controller or the kubelet's final delete came second.
            "finalizers": if r.gone { &Value::Null } else { finalizers(last) },
            // By the controller, or by the garbage collector once the Job is deleted (which
            // pods the controller deleted, the writes part counts).
            "deleted": !r.disrupted_by_script
                && last.pointer("/metadata/deletionTimestamp").is_some_and(|d| !d.is_null())
                && r.first.pointer("/metadata/deletionTimestamp").is_none(),
        },
    })
}

/// The annotation Kueue copies into a Job's pod template on admission: the name of the Job's
/// Workload, which ends in a hash of the Job's uid, so it differs between any two runs.
const KUEUE_WORKLOAD_ANNOTATION: &str = "kueue.x-k8s.io/workload";

/// Occurrences of an event (an aggregated event counts `count` times).
fn event_count(e: &Value) -> u64 {
    e.pointer("/series/count")
        .or_else(|| e.get("count"))
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .max(1)
}

/// Kueue's events (on the Job and on its Workload: `CreatedWorkload`, `QuotaReserved`,
/// `Admitted`, `Pending`, `Started`, `FinishedWorkload`, …) are compared by kind only (type,
/// reason, component), once each: their messages carry the Workload's name (a hash of the
/// Job's uid) and wait times, and how often Kueue repeats one is its own timing, not the Job
/// controller's.
fn kueue_event(e: &Value) -> Option<Value> {
    let component = match str_at(e, "/source/component") {
        "" => str_at(e, "/reportingComponent"),
        c => c,
    };
    let kind = str_at(e, "/involvedObject/kind");
    // Kueue's recorders: `kueue-admission`, `batch/job-kueue-controller`, ….
    if !component.contains("kueue") && kind != "Workload" {
        return None;
    }
    Some(json!([e.get("type"), e.get("reason"), "<Kueue's message>", component, kind]))
}

/// Normalises one run.
pub fn observe(raw: &RawRun) -> Observed {
    let subst = substitutions(raw);
    let mut status = status(&raw.job);
    rewrite(&mut status, &subst);
    let mut pods: Vec<Value> = raw.pods.iter().map(pod).collect();
    pods.iter_mut().for_each(|p| rewrite(p, &subst));
    let mut events = Vec::new();
    let mut kueue_seen = std::collections::BTreeSet::new();
    for e in &raw.events {
        if let Some(t) = kueue_event(e) {
            // Once per kind: see [`kueue_event`].
            if kueue_seen.insert(t.to_string()) {
                events.push(t);
            }
            continue;
        }
        let mut t = json!([
            e.get("type"),
            e.get("reason"),
            e.get("message"),
            str_at(e, "/source/component"),
            str_at(e, "/reportingComponent")
        ]);
        rewrite(&mut t, &subst);
        if let Some(m) = t[2].as_str() {
            t[2] = json!(strip_generated_names(m));
        }
        for _ in 0..event_count(e) {
            events.push(t.clone());
        }
    }
    Observed {
        status,
        pods: sorted(pods),
        events: sorted(events),
        writes: writes(&raw.writes),
        write_counts: raw.writes.clone(),
        milestones: raw.milestones.clone(),
        refusals: raw.refusals.clone(),
    }
}

/// Path-wise differences of two JSON values.
fn json_diff(part: &str, path: &str, a: &Value, b: &Value, out: &mut Vec<Difference>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (va, vb) = (x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null));
                json_diff(part, &format!("{path}/{k}"), va, vb, out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                json_diff(part, &format!("{path}/{i}"), va, vb, out);
            }
        }
        _ if a != b => out.push(Difference {
            part: part.into(),
            path: if path.is_empty() { "/".into() } else { path.into() },
            upstream: a.clone(),
            kjob: b.clone(),
        }),
        _ => {}
    }
}

/// Items of two sorted multisets found in only one of them. Items with the same `key` on
/// both sides (a pod's normalised name) are paired and diffed field by field.
fn multiset_diff(part: &str, key: &str, a: &[Value], b: &[Value], out: &mut Vec<Difference>) {
    let mut count: BTreeMap<String, (i64, Value)> = BTreeMap::new();
    for x in a {
        count.entry(x.to_string()).or_insert((0, x.clone())).0 += 1;
    }
    for y in b {
        count.entry(y.to_string()).or_insert((0, y.clone())).0 -= 1;
    }
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    for (_, (n, v)) in count {
        let side = if n > 0 { &mut only_a } else { &mut only_b };
        side.extend(std::iter::repeat_n(v, n.unsigned_abs() as usize));
    }
    let mut left_b = Vec::new();
    for y in only_b {
        let k = y.get(key).filter(|k| !k.is_null());
        match k.and_then(|k| only_a.iter().position(|x| x.get(key) == Some(k))) {
            Some(i) => {
                let x = only_a.remove(i);
                let k = k.map(|k| k.as_str().map_or_else(|| k.to_string(), String::from));
                json_diff(part, &format!("[{}]", k.unwrap_or_default()), &x, &y, out);
            }
            None => left_b.push(y),
        }
    }
    for x in only_a {
        out.push(Difference {
            part: part.into(),
            path: "only upstream".into(),
            upstream: x,
            kjob: Value::Null,
        });
    }
    for y in left_b {
        out.push(Difference {
            part: part.into(),
            path: "only kjob".into(),
            upstream: Value::Null,
            kjob: y,
        });
    }
}

/// Every difference between the upstream run `a` and the kjob run `b`.
pub fn compare(a: &Observed, b: &Observed) -> Vec<Difference> {
    let mut out = Vec::new();
    json_diff("status", "", &a.status, &b.status, &mut out);
    multiset_diff("pods", "name", &a.pods, &b.pods, &mut out);
    multiset_diff("events", "", &a.events, &b.events, &mut out);
    json_diff("writes", "", &a.writes, &b.writes, &mut out);
    json_diff("refusals", "", &json!(a.refusals), &json!(b.refusals), &mut out);
    out
}

/// A difference kept on purpose, matched by name (listed in the README's "How it differs"):
/// it rewrites the kjob run into what upstream would show in that one respect only.
#[derive(Debug)]
pub struct Accepted {
    /// Its name in the report and the README.
    pub name: &'static str,
    /// Rewrites the kjob run; a no-op unless the difference is there.
    pub normalise: fn(&mut Observed),
}

/// kjob's reporting controller: its core/v1 Events carry `source.component: job-controller`
/// as upstream's do, but `reportingComponent` is kjob's controller name (upstream's legacy
/// recorder copies the source), so a user can tell which controller wrote an event.
fn kjob_reporting_component(o: &mut Observed) {
    for e in &mut o.events {
        if e[4] == kjob_core::DEFAULT_CONTROLLER_NAME {
            e[4] = json!("job-controller");
        }
    }
    o.events.sort_by_key(|x| x.to_string());
}

/// The accepted differences.
pub const ACCEPTED: &[Accepted] =
    &[Accepted { name: "reporting-component-is-kjob", normalise: kjob_reporting_component }];

/// Compares with the accepted differences taken into account: every difference, each with
/// the names of the accepted ones that explain it (`None`: neither fixed nor accepted).
pub fn judge(a: &Observed, b: &Observed) -> Vec<(Difference, Option<String>)> {
    let raw = compare(a, b);
    if raw.is_empty() {
        return Vec::new();
    }
    let mut b2 = b.clone();
    let mut applied = Vec::new();
    for acc in ACCEPTED {
        let before = b2.clone();
        (acc.normalise)(&mut b2);
        if b2 != before {
            applied.push(acc.name);
        }
    }
    let left = compare(a, &b2);
    let names = applied.join(", ");
    let mut out: Vec<(Difference, Option<String>)> = left.into_iter().map(|d| (d, None)).collect();
    for d in raw {
        if !out.iter().any(|(x, _)| *x == d) {
            out.push((d, Some(names.clone())));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_value(name: &str, uid: &str, job_uid: &str, t: &str) -> Value {
        json!({
            "metadata": {"name": name, "uid": uid, "generateName": "job-",
                "creationTimestamp": t, "resourceVersion": "17",
                "labels": {"batch.kubernetes.io/job-name": "job",
                    "batch.kubernetes.io/controller-uid": job_uid},
                "annotations": {"batch.kubernetes.io/job-tracking": ""},
                "finalizers": ["batch.kubernetes.io/job-tracking"],
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "job",
                    "uid": job_uid, "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"restartPolicy": "Never", "nodeName": "kjob-node-0",
                "containers": [{"name": "main", "image": "busybox",
                    "volumeMounts": [{"name": format!("kube-api-access-{}", &uid[..5])}]}]},
            "status": {"phase": "Succeeded"}
        })
    }

    /// A complete run: a Job with one succeeded pod and its events.
    fn run(suffix: &str, uid: &str, job_uid: &str, t: &str) -> RawRun {
        let name = format!("job-{suffix}");
        let p = pod_value(&name, uid, job_uid, t);
        let mut last = p.clone();
        last["metadata"]["finalizers"] = json!([]);
        RawRun {
            job: json!({"metadata": {"name": "job", "uid": job_uid}, "status": {
                "startTime": t, "completionTime": t, "succeeded": 1, "failed": 0,
                "terminating": 0, "ready": 0,
                "uncountedTerminatedPods": {},
                "conditions": [
                    {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
                     "message": "Reached expected number of succeeded pods",
                     "lastProbeTime": t, "lastTransitionTime": t},
                    {"type": "Complete", "status": "True", "reason": "CompletionsReached",
                     "message": "Reached expected number of succeeded pods",
                     "lastProbeTime": t, "lastTransitionTime": t}]}}),
            pods: vec![PodRecord { first: p, last, gone: false, disrupted_by_script: false }],
            events: vec![
                json!({"type": "Normal", "reason": "SuccessfulCreate",
                    "message": format!("Created pod: {name}"), "source": {"component": "job-controller"},
                    "reportingComponent": "job-controller", "count": 1, "firstTimestamp": t}),
                json!({"type": "Normal", "reason": "Completed", "message": "Job completed",
                    "source": {"component": "job-controller"},
                    "reportingComponent": "job-controller", "count": 1, "lastTimestamp": t}),
            ],
            writes: [
                ("create pods", 1),
                ("patch pods", 1),
                ("pods patched", 1),
                ("update jobs/status", 3),
                ("create events", 2),
            ]
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect(),
            milestones: [("pod 1 created".to_string(), 0.5)].into(),
            refusals: vec![json!({"request": "patch job", "code": 422, "reason": "Invalid",
                "message": "Job.batch \"job\" is invalid: spec.completions: field is immutable"})],
            started: None,
        }
    }

    fn upstream() -> RawRun {
        run("x7k2p", "11111111-aaaa", "99999999-job1", "2026-12-01T09:00:00Z")
    }

    fn kjob() -> RawRun {
        run("q9zzt", "22222222-bbbb", "88888888-job2", "2026-12-01T09:07:13Z")
    }

    #[test]
    fn identical_runs_with_other_suffixes_uids_and_times_compare_equal() {
        let (a, b) = (observe(&upstream()), observe(&kjob()));
        assert_eq!(compare(&a, &b), vec![]);
        assert_eq!(a.pods[0]["name"], "job-*");
        assert_eq!(a.events.len(), 2);
    }

    fn differs_in(part: &str, change: impl Fn(&mut RawRun)) {
        let mut b = kjob();
        change(&mut b);
        let diffs = compare(&observe(&upstream()), &observe(&b));
        assert!(!diffs.is_empty(), "a change in {part} went unnoticed");
        assert!(diffs.iter().all(|d| d.part == part), "{diffs:?}");
    }

    #[test]
    fn one_field_of_each_part_is_reported() {
        differs_in("status", |r| r.job["status"]["succeeded"] = json!(2));
        differs_in("status", |r| r.job["status"]["conditions"][1]["reason"] = json!("Other"));
        differs_in("status", |r| r.job["status"]["conditions"][0]["message"] = json!("m"));
        differs_in("status", |r| {
            let cs = r.job["status"]["conditions"].as_array_mut().unwrap();
            cs.swap(0, 1);
        });
        differs_in("status", |r| {
            r.job["status"]["completionTime"].take();
        });
        differs_in("status", |r| {
            r.job["status"]["uncountedTerminatedPods"] = json!({"succeeded": ["u"]})
        });
        differs_in("pods", |r| {
            r.pods[0].first["metadata"]["labels"]["extra"] = json!("x");
        });
        differs_in("pods", |r| {
            r.pods[0].first["metadata"]["annotations"]["extra"] = json!("x");
        });
        differs_in("pods", |r| r.pods[0].first["metadata"]["finalizers"] = json!([]));
        differs_in("pods", |r| {
            r.pods[0].first["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = json!(false)
        });
        differs_in("pods", |r| r.pods[0].first["spec"]["hostname"] = json!("h"));
        differs_in("pods", |r| r.pods[0].last["metadata"]["finalizers"] = json!(["f"]));
        differs_in("pods", |r| {
            let p = r.pods[0].clone();
            r.pods.push(p);
        });
        differs_in("events", |r| r.events[1]["message"] = json!("Job done"));
        differs_in("events", |r| r.events[1]["type"] = json!("Warning"));
        differs_in("events", |r| r.events[0]["reason"] = json!("Created"));
        differs_in("events", |r| r.events[0]["source"]["component"] = json!("kjob"));
        differs_in("events", |r| r.events[0]["count"] = json!(2));
        differs_in("writes", |r| *r.writes.get_mut("create pods").unwrap() = 2);
        differs_in("writes", |r| *r.writes.get_mut("pods patched").unwrap() = 0);
        differs_in("writes", |r| {
            r.writes.insert("pods deleted".into(), 1);
        });
        differs_in("writes", |r| {
            r.writes.insert("update jobs".into(), 1);
        });
        differs_in("writes", |r| {
            r.writes.remove("update jobs/status");
        });
        differs_in("refusals", |r| r.refusals[0]["code"] = json!(403));
        differs_in("refusals", |r| r.refusals[0]["message"] = json!("no"));
        differs_in("refusals", |r| r.refusals.clear());
    }

    #[test]
    fn names_of_pods_never_created_lose_their_suffix_in_event_messages() {
        let msg = |name: &str| {
            format!(
                "Error creating: pods \"{name}\" is forbidden: exceeded quota: quota, \
                 requested: pods=1, used: pods=0, limited: pods=0"
            )
        };
        assert_eq!(strip_generated_names(&msg("job-x7k2p")), msg("job-*"));
        assert_eq!(strip_generated_names(&msg("job-12-x7k2p")), msg("job-12-*"));
        // Not a generated name: other stems, other lengths, letters outside the alphabet.
        for s in ["myjob-x7k2p", "job-x7k2pq", "job-abcde", "job-x7k2", "Created pod: job"] {
            assert_eq!(strip_generated_names(s), s);
        }
        assert_eq!(strip_generated_names("job-x7k2p, job-q9zzt."), "job-*, job-*.");
        let (mut a, mut b) = (upstream(), kjob());
        let ev = |m: String| {
            json!({"type": "Warning", "reason": "FailedCreate", "message": m,
                "source": {"component": "job-controller"}, "reportingComponent": "job-controller"})
        };
        a.events.push(ev(msg("job-bcdfg")));
        b.events.push(ev(msg("job-hjklm")));
        assert_eq!(compare(&observe(&a), &observe(&b)), vec![]);
        b.events.push(ev(msg("job-hjklm")));
        assert!(!compare(&observe(&a), &observe(&b)).is_empty(), "occurrences still count");
    }

    #[test]
    fn status_write_counts_and_timing_are_reported_not_compared() {
        let mut b = kjob();
        *b.writes.get_mut("update jobs/status").unwrap() = 5;
        *b.writes.get_mut("patch pods").unwrap() = 3;
        b.milestones.insert("condition Complete".into(), 9.5);
        let (oa, ob) = (observe(&upstream()), observe(&b));
        assert_eq!(compare(&oa, &ob), vec![]);
        assert_eq!(ob.write_counts["update jobs/status"], 5);
    }

    #[test]
    fn pods_are_paired_by_name_and_gone_pods_have_no_finalizers() {
        let mut b = kjob();
        b.pods[0].first["spec"]["hostname"] = json!("h");
        let d = compare(&observe(&upstream()), &observe(&b));
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].path, "[job-*]/spec/hostname");
        // The DELETED event may carry the finalizer whose removal let the pod go.
        let (mut a, mut b) = (upstream(), kjob());
        a.pods[0].last["metadata"]["finalizers"] = json!(["batch.kubernetes.io/job-tracking"]);
        a.pods[0].gone = true;
        b.pods[0].gone = true;
        assert_eq!(compare(&observe(&a), &observe(&b)), vec![]);
    }

    #[test]
    fn a_deleted_job_is_known_by_its_pods_owner_reference() {
        let (mut a, mut b) = (upstream(), kjob());
        a.job = Value::Null;
        b.job = Value::Null;
        assert_eq!(compare(&observe(&a), &observe(&b)), vec![]);
        b.pods[0].first["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] = json!("x");
        assert!(!compare(&observe(&a), &observe(&b)).is_empty());
    }

    #[test]
    fn suffixes_are_stripped_only_when_random_looking() {
        assert_eq!(strip_suffix("job-2-ab3cd"), "job-2-*");
        assert_eq!(strip_suffix("job-abcdef"), "job-abcdef");
        assert_eq!(strip_suffix("job"), "job");
    }

    #[test]
    fn only_the_named_difference_is_accepted() {
        let mut b = kjob();
        for e in &mut b.events {
            e["reportingComponent"] = json!("kjob.io/job-controller");
        }
        let j = judge(&observe(&upstream()), &observe(&b));
        assert!(!j.is_empty());
        assert!(
            j.iter().all(|(_, a)| a.as_deref() == Some("reporting-component-is-kjob")),
            "{j:?}"
        );
        // The same rewrite does not hide another difference in the same events.
        b.events[1]["reason"] = json!("Done");
        let j = judge(&observe(&upstream()), &observe(&b));
        assert!(j.iter().any(|(_, a)| a.is_none()), "{j:?}");
        // Another reporting component is not the accepted one.
        let mut c = kjob();
        c.events[0]["reportingComponent"] = json!("someone-else");
        let j = judge(&observe(&upstream()), &observe(&c));
        assert!(j.iter().all(|(_, a)| a.is_none()), "{j:?}");
    }
}
