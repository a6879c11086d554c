//! The pure part of the simulated kubelet: which stage a pod is in, when its next transition
//! is due, and the pod status each transition writes (real kubelet shapes, including
//! `imageID`, `containerID`, `startedAt`/`finishedAt` and the five pod conditions).

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::KubeletConfig;
use crate::image::qualified_image;

/// Annotation: how long containers run before exiting (`2s`, `500ms`; `never` runs until
/// deleted).
pub const RUN_TIME_ANNOTATION: &str = "kjob.io/sim-run-time";
/// Annotation: exit code of every container (default 0).
pub const EXIT_CODE_ANNOTATION: &str = "kjob.io/sim-exit-code";
/// Annotation prefix: exit code of one container (`kjob.io/sim-exit-code.<container>`).
pub const EXIT_CODE_CONTAINER_PREFIX: &str = "kjob.io/sim-exit-code.";
/// Annotation: how long containers take to stop after SIGTERM; at or past the grace period
/// they are killed (exit 137) instead of exiting on SIGTERM (143).
pub const TERMINATION_TIME_ANNOTATION: &str = "kjob.io/sim-termination-time";
/// Annotation: delay between the pod being accepted and its containers running.
pub const START_DELAY_ANNOTATION: &str = "kjob.io/sim-start-delay";
/// Annotation: `"false"` keeps the pod unschedulable (`PodScheduled=False`, `Unschedulable`).
pub const SCHEDULABLE_ANNOTATION: &str = "kjob.io/sim-schedulable";

/// Exit code of a container killed at the end of its grace period (SIGKILL).
pub const EXIT_CODE_SIGKILL: i64 = 137;
/// Exit code of a container that stopped on SIGTERM.
pub const EXIT_CODE_SIGTERM: i64 = 143;
/// Cap of the CrashLoopBackOff delay.
pub const MAX_CRASH_LOOP_BACKOFF: Duration = Duration::from_secs(300);

/// A transition the kubelet performs on a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Bind the pod to a node (the scheduler's job).
    Bind,
    /// Mark the pod unschedulable.
    Unschedulable,
    /// Accept the pod on its node: Pending, startTime, IPs, containers ContainerCreating.
    Accept,
    /// Start (or restart) the containers: Running and Ready.
    Start,
    /// Containers exit with their configured codes.
    Exit,
    /// Containers stop because the pod is being deleted.
    Terminate,
    /// Issue the final `DELETE gracePeriodSeconds=0`.
    FinalDelete,
}

/// Precise times the kubelet remembers per pod; status timestamps have second precision,
/// which is too coarse for sub-second run times.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memo {
    /// When the kubelet accepted the pod.
    pub accepted_at: Option<Timestamp>,
    /// When the containers last started.
    pub started_at: Option<Timestamp>,
    /// When the containers last exited (for crash-loop back-off).
    pub exited_at: Option<Timestamp>,
}

fn annotation<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod.pointer("/metadata/annotations").and_then(|a| a.get(key)).and_then(Value::as_str)
}

fn parse_duration(s: &str) -> Option<Duration> {
    kjob_svc::parse_duration(s.trim()).ok()
}

/// Container run time of a pod: `None` means it runs until deleted.
pub fn run_time(pod: &Value, cfg: &KubeletConfig) -> Option<Duration> {
    match annotation(pod, RUN_TIME_ANNOTATION) {
        Some(v) if matches!(v.trim(), "never" | "forever" | "infinite") => None,
        Some(v) => Some(parse_duration(v).unwrap_or(cfg.run_time)),
        None => Some(cfg.run_time),
    }
}

fn start_delay(pod: &Value, cfg: &KubeletConfig) -> Duration {
    annotation(pod, START_DELAY_ANNOTATION).and_then(parse_duration).unwrap_or(cfg.start_delay)
}

fn termination_time(pod: &Value, cfg: &KubeletConfig) -> Duration {
    annotation(pod, TERMINATION_TIME_ANNOTATION)
        .and_then(parse_duration)
        .unwrap_or(cfg.termination_time)
}

/// Exit code of a container: the per-container annotation, else the pod one, else 0.
pub fn exit_code(pod: &Value, container: &str) -> i64 {
    let per = format!("{EXIT_CODE_CONTAINER_PREFIX}{container}");
    annotation(pod, &per)
        .or_else(|| annotation(pod, EXIT_CODE_ANNOTATION))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn add(t: Timestamp, d: Duration) -> Timestamp {
    let d = SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
    t.checked_add(d).unwrap_or(t)
}

fn time_at(pod: &Value, ptr: &str) -> Option<Timestamp> {
    pod.pointer(ptr).and_then(Value::as_str).and_then(|s| s.parse().ok())
}

/// Formats a `metav1.Time` (second precision, UTC).
pub fn format_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Names of the pod's regular containers, in order.
pub fn container_names(pod: &Value) -> Vec<String> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|cs| cs.iter().filter_map(|c| c["name"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn container_statuses(pod: &Value) -> Vec<Value> {
    pod.pointer("/status/containerStatuses").and_then(Value::as_array).cloned().unwrap_or_default()
}

fn phase(pod: &Value) -> &str {
    pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default()
}

fn restart_policy(pod: &Value) -> &str {
    pod.pointer("/spec/restartPolicy").and_then(Value::as_str).unwrap_or("Always")
}

/// Whether every container status is in the given state (`running`, `waiting`, ...).
fn all_in_state(pod: &Value, state: &str) -> bool {
    let cs = container_statuses(pod);
    !cs.is_empty() && cs.iter().all(|c| c.pointer(&format!("/state/{state}")).is_some())
}

fn any_waiting_for(pod: &Value, reason: &str) -> bool {
    container_statuses(pod)
        .iter()
        .any(|c| c.pointer("/state/waiting/reason").and_then(Value::as_str) == Some(reason))
}

fn restart_count(pod: &Value) -> i64 {
    container_statuses(pod).iter().filter_map(|c| c["restartCount"].as_i64()).max().unwrap_or(0)
}

/// CrashLoopBackOff delay after `restarts` restarts: base, 2×base, 4×base … capped at 5 min.
pub fn crash_loop_backoff(base: Duration, restarts: i64) -> Duration {
    let exp = u32::try_from(restarts.saturating_sub(1).clamp(0, 16)).unwrap_or(16);
    kjob_svc::Backoff::new(base, MAX_CRASH_LOOP_BACKOFF).delay(exp)
}

/// Whether `node` is one of the kubelet's nodes (`<node_prefix>-<i>`, `i` below `nodes`).
pub fn owns_node(node: &str, cfg: &KubeletConfig) -> bool {
    node.strip_prefix(cfg.node_prefix.as_str())
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(|i| i.parse::<u32>().ok())
        .is_some_and(|i| i < cfg.nodes)
}

/// The next transition of a pod and when it is due, or `None` when the pod waits for
/// something outside the kubelet (a delete, a finalizer removal, nothing at all).
pub fn plan(
    pod: &Value,
    memo: Option<&Memo>,
    now: Timestamp,
    cfg: &KubeletConfig,
) -> Option<(Timestamp, Action)> {
    let memo = memo.cloned().unwrap_or_default();
    let meta = pod.get("metadata")?;
    let node = pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default();
    let deleting = meta.get("deletionTimestamp").is_some_and(|d| !d.is_null());
    let terminal = matches!(phase(pod), "Succeeded" | "Failed");
    if cfg.only_own_nodes && !node.is_empty() && !owns_node(node, cfg) {
        return None;
    }
    if node.is_empty() {
        if deleting {
            return None;
        }
        let scheduler = pod
            .pointer("/spec/schedulerName")
            .and_then(Value::as_str)
            .unwrap_or("default-scheduler");
        if scheduler != "default-scheduler" || !cfg.schedule {
            return None;
        }
        if annotation(pod, SCHEDULABLE_ANNOTATION) == Some("false") {
            let already =
                pod_condition(pod, "PodScheduled").is_some_and(|c| c["status"] == "False");
            return (!already).then_some((now, Action::Unschedulable));
        }
        return Some((now, Action::Bind));
    }
    if deleting {
        if terminal {
            let grace = meta.get("deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0);
            return (grace > 0).then_some((now, Action::FinalDelete));
        }
        let grace =
            meta.get("deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0).max(0);
        let deadline = time_at(pod, "/metadata/deletionTimestamp").unwrap_or(now);
        let grace = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        let requested = deadline
            .checked_sub(SignedDuration::try_from(grace).unwrap_or_default())
            .unwrap_or(deadline);
        let stop = termination_time(pod, cfg).min(grace);
        return Some((add(requested, stop), Action::Terminate));
    }
    if terminal {
        return None;
    }
    if pod.pointer("/status/startTime").is_none() {
        return Some((now, Action::Accept));
    }
    if all_in_state(pod, "running") {
        let rt = run_time(pod, cfg)?;
        let started = memo
            .started_at
            .or_else(|| {
                container_statuses(pod)
                    .iter()
                    .filter_map(|c| time_at(c, "/state/running/startedAt"))
                    .max()
            })
            .unwrap_or(now);
        return Some((add(started, rt), Action::Exit));
    }
    if any_waiting_for(pod, "CrashLoopBackOff") {
        let exited = memo.exited_at.unwrap_or(now);
        return Some((
            add(exited, crash_loop_backoff(cfg.crash_loop_backoff, restart_count(pod))),
            Action::Start,
        ));
    }
    if phase(pod) == "Pending" {
        let accepted =
            memo.accepted_at.or_else(|| time_at(pod, "/status/startTime")).unwrap_or(now);
        return Some((add(accepted, start_delay(pod, cfg)), Action::Start));
    }
    None
}

/// Node a pod is bound to: one of `cfg.nodes` nodes, chosen by a stable hash of its name.
pub fn node_for(pod: &Value, cfg: &KubeletConfig) -> String {
    let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let h = name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let n = u64::from(cfg.nodes.max(1));
    format!("{}-{}", cfg.node_prefix, h % n)
}

/// The Binding object that schedules a pod onto a node.
pub fn binding(pod: &Value, node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod["metadata"]["name"], "namespace": pod["metadata"]["namespace"]},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}
    })
}

fn hex64(seed: &str) -> String {
    // FNV-1a rounds give a stable, realistic-looking 64-hex-digit id per seed.
    let mut out = String::with_capacity(64);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for round in 0..4u64 {
        for b in seed.bytes().chain(round.to_le_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

fn image_id(image: &str) -> String {
    let q = qualified_image(image);
    let repo = match q.rsplit_once('@') {
        Some((r, _)) => r.to_string(),
        None => {
            let (head, last) = q.rsplit_once('/').unwrap_or(("", &q));
            let last = last.split(':').next().unwrap_or(last);
            if head.is_empty() { last.to_string() } else { format!("{head}/{last}") }
        }
    };
    format!("{repo}@sha256:{}", hex64(&q))
}

fn container_id(pod: &Value, name: &str, restarts: i64) -> String {
    let uid = pod.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default();
    format!("containerd://{}", hex64(&format!("{uid}/{name}/{restarts}")))
}

fn containers(pod: &Value) -> Vec<Value> {
    pod.pointer("/spec/containers").and_then(Value::as_array).cloned().unwrap_or_default()
}

fn condition(
    ty: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    now: &str,
) -> Value {
    let mut c = json!({"type": ty, "status": if ok { "True" } else { "False" }, "lastProbeTime": null, "lastTransitionTime": now});
    if let Some(r) = reason {
        c["reason"] = json!(r);
    }
    if let Some(m) = message {
        c["message"] = json!(m);
    }
    c
}

/// The pod's condition of type `ty`.
pub(crate) fn pod_condition<'a>(pod: &'a Value, ty: &str) -> Option<&'a Value> {
    pod.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == ty)
}

/// Replaces (by type) conditions in the pod status, keeping the transition time of those
/// whose status does not change.
fn set_conditions(pod: &mut Value, conds: Vec<Value>) {
    let mut list: Vec<Value> =
        pod.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    for c in conds {
        match list.iter_mut().find(|o| o["type"] == c["type"]) {
            Some(o) => {
                let keep_time = o["status"] == c["status"];
                let old_time = o["lastTransitionTime"].clone();
                *o = c;
                if keep_time && !old_time.is_null() {
                    o["lastTransitionTime"] = old_time;
                }
            }
            None => list.push(c),
        }
    }
    pod["status"]["conditions"] = Value::Array(list);
}

fn unready_message(names: &[String]) -> String {
    format!("containers with unready status: [{}]", names.join(" "))
}

fn pod_ip(pod: &Value) -> String {
    let uid = pod.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default();
    let h = hex64(uid);
    let b = u8::from_str_radix(&h[0..2], 16).unwrap_or(0);
    let c = u8::from_str_radix(&h[2..4], 16).unwrap_or(0).max(2);
    format!("10.244.{b}.{c}")
}

fn host_ip(node: &str) -> String {
    let n: u32 = node.rsplit('-').next().and_then(|s| s.parse().ok()).unwrap_or(0);
    format!("172.18.0.{}", 2 + n % 250)
}

/// The pod after the kubelet accepted it: Pending, startTime, IPs, conditions and
/// containers waiting in ContainerCreating.
pub fn accepted(pod: &Value, now: Timestamp) -> Value {
    let mut p = pod.clone();
    let t = format_time(now);
    let node = pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default();
    let names = container_names(pod);
    let has_init = pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let (hip, pip) = (host_ip(node), pod_ip(pod));
    p["status"]["phase"] = json!("Pending");
    p["status"]["startTime"] = json!(t);
    p["status"]["hostIP"] = json!(hip);
    p["status"]["hostIPs"] = json!([{"ip": hip}]);
    p["status"]["podIP"] = json!(pip);
    p["status"]["podIPs"] = json!([{"ip": pip}]);
    set_conditions(
        &mut p,
        vec![
            condition("PodReadyToStartContainers", true, None, None, &t),
            if has_init {
                condition(
                    "Initialized",
                    false,
                    Some("ContainersNotInitialized"),
                    Some("containers with incomplete status: [init]".into()),
                    &t,
                )
            } else {
                condition("Initialized", true, None, None, &t)
            },
            condition(
                "Ready",
                false,
                Some("ContainersNotReady"),
                Some(unready_message(&names)),
                &t,
            ),
            condition(
                "ContainersReady",
                false,
                Some("ContainersNotReady"),
                Some(unready_message(&names)),
                &t,
            ),
            condition("PodScheduled", true, None, None, &t),
        ],
    );
    set_statuses(
        &mut p,
        pod,
        |c| waiting_status(c, "ContainerCreating"),
        |c| waiting_status(c, "PodInitializing"),
    );
    p
}

/// A container not started yet, waiting for `reason`.
fn waiting_status(c: &Value, reason: &str) -> Value {
    json!({
        "name": c["name"],
        "image": qualified_image(c["image"].as_str().unwrap_or_default()),
        "imageID": "",
        "ready": false,
        "restartCount": 0,
        "started": false,
        "state": {"waiting": {"reason": reason}},
        "lastState": {}
    })
}

/// Writes the status of every container of `pod` into `p`: `main` for each of
/// `spec.containers`, `init` for each of `spec.initContainers` (when the pod has any).
fn set_statuses(
    p: &mut Value,
    pod: &Value,
    main: impl Fn(&Value) -> Value,
    init: impl Fn(&Value) -> Value,
) {
    p["status"]["containerStatuses"] = containers(pod).iter().map(main).collect();
    if let Some(inits) = pod.pointer("/spec/initContainers").and_then(Value::as_array) {
        p["status"]["initContainerStatuses"] = inits.iter().map(init).collect();
    }
}

fn running_status(pod: &Value, c: &Value, restarts: i64, last: Value, t: &str) -> Value {
    let name = c["name"].as_str().unwrap_or_default();
    let image = c["image"].as_str().unwrap_or_default();
    json!({
        "name": name,
        "image": qualified_image(image),
        "imageID": image_id(image),
        "containerID": container_id(pod, name, restarts),
        "ready": true,
        "restartCount": restarts,
        "started": true,
        "state": {"running": {"startedAt": t}},
        "lastState": last
    })
}

/// The pod with its containers (re)started: Running and Ready. Init containers have run to
/// completion (sidecars, `restartPolicy: Always` init containers, keep running).
pub fn started(pod: &Value, now: Timestamp) -> Value {
    let mut p = pod.clone();
    let t = format_time(now);
    let old = container_statuses(pod);
    set_statuses(
        &mut p,
        pod,
        |c| {
            let prev = old.iter().find(|o| o["name"] == c["name"]);
            let restarts = prev.and_then(|o| o["restartCount"].as_i64()).unwrap_or(0);
            let last =
                prev.map(|o| o["lastState"].clone()).filter(|l| !l.is_null()).unwrap_or(json!({}));
            running_status(pod, c, restarts, last, &t)
        },
        |c| {
            if c["restartPolicy"] == "Always" {
                return running_status(pod, c, 0, json!({}), &t);
            }
            let name = c["name"].as_str().unwrap_or_default();
            let image = c["image"].as_str().unwrap_or_default();
            json!({"name": name, "image": qualified_image(image), "imageID": image_id(image),
                   "containerID": container_id(pod, name, 0), "ready": false, "restartCount": 0, "started": false,
                   "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": t, "finishedAt": t,
                                            "containerID": container_id(pod, name, 0)}},
                   "lastState": {}})
        },
    );
    p["status"]["phase"] = json!("Running");
    set_conditions(
        &mut p,
        vec![
            condition("PodReadyToStartContainers", true, None, None, &t),
            condition("Initialized", true, None, None, &t),
            condition("Ready", true, None, None, &t),
            condition("ContainersReady", true, None, None, &t),
        ],
    );
    p
}

fn exit_reason(code: i64) -> &'static str {
    match code {
        0 => "Completed",
        137 => "OOMKilled",
        _ => "Error",
    }
}

fn terminated_state(pod: &Value, status: &Value, code: i64, reason: &str, t: &str) -> Value {
    let name = status["name"].as_str().unwrap_or_default();
    let restarts = status["restartCount"].as_i64().unwrap_or(0);
    let started = status.pointer("/state/running/startedAt").cloned().unwrap_or(json!(t));
    json!({"terminated": {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": t,
                          "containerID": container_id(pod, name, restarts)}})
}

/// Ends the pod: every container terminated with `codes[name]`; Succeeded when all are 0,
/// else Failed; readiness conditions False with PodCompleted/PodFailed.
fn finish(
    pod: &Value,
    now: Timestamp,
    code_of: impl Fn(&str) -> i64,
    reason_of: impl Fn(i64) -> &'static str,
) -> Value {
    let mut p = pod.clone();
    let t = format_time(now);
    let mut all_zero = true;
    let statuses: Vec<Value> = container_statuses(pod)
        .into_iter()
        .map(|mut s| {
            let name = s["name"].as_str().unwrap_or_default().to_string();
            let code = code_of(&name);
            all_zero &= code == 0;
            s["state"] = terminated_state(pod, &s, code, reason_of(code), &t);
            s["ready"] = json!(false);
            s["started"] = json!(false);
            if s.get("imageID").is_none() {
                s["imageID"] = json!("");
            }
            s
        })
        .collect();
    p["status"]["containerStatuses"] = Value::Array(statuses);
    let reason = if all_zero { "PodCompleted" } else { "PodFailed" };
    p["status"]["phase"] = json!(if all_zero { "Succeeded" } else { "Failed" });
    set_conditions(
        &mut p,
        vec![
            condition("PodReadyToStartContainers", false, None, None, &t),
            condition("Ready", false, Some(reason), None, &t),
            condition("ContainersReady", false, Some(reason), None, &t),
        ],
    );
    p
}

/// Containers exit with their configured codes. `restartPolicy: Never` (or all exits 0 under
/// `OnFailure`) ends the pod; otherwise failed containers go to CrashLoopBackOff with a
/// higher restartCount and their exit in `lastState`, and the pod stays Running.
pub fn exited(pod: &Value, now: Timestamp) -> Value {
    let policy = restart_policy(pod);
    let codes: Vec<(String, i64)> = container_names(pod)
        .into_iter()
        .map(|n| {
            let c = exit_code(pod, &n);
            (n, c)
        })
        .collect();
    let restart = |code: i64| match policy {
        "Never" => false,
        "OnFailure" => code != 0,
        _ => true,
    };
    if !codes.iter().any(|(_, c)| restart(*c)) {
        return finish(pod, now, |n| exit_code(pod, n), exit_reason);
    }
    let mut p = pod.clone();
    let t = format_time(now);
    let mut unready = Vec::new();
    let statuses: Vec<Value> = container_statuses(pod)
        .into_iter()
        .map(|mut s| {
            let name = s["name"].as_str().unwrap_or_default().to_string();
            let code = exit_code(pod, &name);
            let term = terminated_state(pod, &s, code, exit_reason(code), &t);
            s["ready"] = json!(false);
            s["started"] = json!(false);
            if restart(code) {
                s["lastState"] = term;
                s["restartCount"] = json!(s["restartCount"].as_i64().unwrap_or(0) + 1);
                s["state"] = json!({"waiting": {"reason": "CrashLoopBackOff",
                    "message": format!("back-off restarting failed container {name} in pod {}",
                        pod["metadata"]["name"].as_str().unwrap_or_default())}});
                unready.push(name);
            } else {
                s["state"] = term;
            }
            s
        })
        .collect();
    p["status"]["containerStatuses"] = Value::Array(statuses);
    set_conditions(
        &mut p,
        vec![
            condition(
                "Ready",
                false,
                Some("ContainersNotReady"),
                Some(unready_message(&unready)),
                &t,
            ),
            condition(
                "ContainersReady",
                false,
                Some("ContainersNotReady"),
                Some(unready_message(&unready)),
                &t,
            ),
        ],
    );
    p
}

/// Containers stop because the pod is being deleted: exit 143 when they honour SIGTERM within
/// the grace period, 137 when killed at its end; reason Error; the pod becomes Failed.
pub fn terminated(pod: &Value, now: Timestamp, cfg: &KubeletConfig) -> Value {
    let grace =
        pod.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0);
    let grace = Duration::from_secs(u64::try_from(grace.max(0)).unwrap_or(0));
    let code =
        if termination_time(pod, cfg) < grace { EXIT_CODE_SIGTERM } else { EXIT_CODE_SIGKILL };
    let mut p = pod.clone();
    // Containers that never started still get a terminated state, as the kubelet reports.
    let t = format_time(now);
    if let Some(Value::Array(list)) = p.pointer_mut("/status/containerStatuses") {
        for s in list.iter_mut() {
            if s.pointer("/state/running").is_none() && s.pointer("/state/terminated").is_none() {
                s["state"] = json!({"running": {"startedAt": t}});
            }
        }
    }
    let ended = finish(&p, now, |_| code, |_| "Error");
    if container_statuses(pod).is_empty() {
        let mut e = ended;
        e["status"]["phase"] = json!("Failed");
        return e;
    }
    ended
}

/// The pod marked unschedulable (`PodScheduled=False`, reason `Unschedulable`).
pub fn unschedulable(pod: &Value, now: Timestamp, cfg: &KubeletConfig) -> Value {
    let mut p = pod.clone();
    let t = format_time(now);
    p["status"]["phase"] = json!("Pending");
    set_conditions(
        &mut p,
        vec![condition(
            "PodScheduled",
            false,
            Some("Unschedulable"),
            Some(format!(
                "0/{} nodes are available: {} node(s) didn't match pod's node affinity/selector.",
                cfg.nodes, cfg.nodes
            )),
            &t,
        )],
    );
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::field_of_each;

    fn cfg() -> KubeletConfig {
        KubeletConfig {
            run_time: Duration::from_secs(2),
            start_delay: Duration::from_millis(100),
            termination_time: Duration::ZERO,
            crash_loop_backoff: Duration::from_secs(10),
            ..KubeletConfig::default()
        }
    }

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1", "annotations": {}},
            "spec": {"restartPolicy": "Never", "schedulerName": "default-scheduler",
                     "containers": [{"name": "main", "image": "busybox"}, {"name": "side", "image": "nginx:1.27"}]},
            "status": {"phase": "Pending"}
        })
    }

    #[test]
    fn annotations() {
        let mut p = pod();
        p["metadata"]["annotations"] = json!({
            "kjob.io/sim-run-time": "500ms",
            "kjob.io/sim-exit-code": "1",
            "kjob.io/sim-exit-code.side": "42"
        });
        assert_eq!(run_time(&p, &cfg()), Some(Duration::from_millis(500)));
        assert_eq!(exit_code(&p, "main"), 1);
        assert_eq!(exit_code(&p, "side"), 42);
        p["metadata"]["annotations"]["kjob.io/sim-run-time"] = json!("never");
        assert_eq!(run_time(&p, &cfg()), None);
        assert_eq!(exit_code(&pod(), "main"), 0);
        assert_eq!(run_time(&pod(), &cfg()), Some(Duration::from_secs(2)));
    }

    #[test]
    fn image_ids() {
        let id = image_id("perl:5.34");
        assert!(id.starts_with("docker.io/library/perl@sha256:"), "{id}");
        assert_eq!(id.len(), "docker.io/library/perl@sha256:".len() + 64);
    }

    #[test]
    fn full_lifecycle_never() {
        let c = cfg();
        let t0 = t("2025-01-01T00:00:00Z");
        let p = pod();
        assert_eq!(plan(&p, None, t0, &c), Some((t0, Action::Bind)));
        let mut bound = p.clone();
        bound["spec"]["nodeName"] = json!(node_for(&p, &c));
        assert!(bound["spec"]["nodeName"].as_str().unwrap().starts_with("sim-node-"));
        assert_eq!(plan(&bound, None, t0, &c), Some((t0, Action::Accept)));

        let acc = accepted(&bound, t0);
        assert_eq!(acc["status"]["phase"], "Pending");
        assert_eq!(acc["status"]["startTime"], "2025-01-01T00:00:00Z");
        assert!(acc["status"]["podIP"].as_str().unwrap().starts_with("10.244."));
        assert_eq!(
            acc["status"]["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ContainerCreating"
        );
        assert_eq!(acc["status"]["containerStatuses"][0]["imageID"], "");
        assert_eq!(
            field_of_each(&acc["status"]["conditions"], "type"),
            [
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled"
            ]
        );
        assert_eq!(
            acc["status"]["conditions"][2]["message"],
            "containers with unready status: [main side]"
        );
        let memo = Memo { accepted_at: Some(t0), ..Memo::default() };
        let (when, action) = plan(&acc, Some(&memo), t0, &c).unwrap();
        assert_eq!(action, Action::Start);
        assert_eq!(when, add(t0, Duration::from_millis(100)));

        let t1 = add(t0, Duration::from_secs(1));
        let run = started(&acc, t1);
        assert_eq!(run["status"]["phase"], "Running");
        let cs = &run["status"]["containerStatuses"][0];
        assert_eq!(cs["ready"], true);
        assert_eq!(cs["started"], true);
        assert!(cs["containerID"].as_str().unwrap().starts_with("containerd://"));
        assert!(cs["imageID"].as_str().unwrap().contains("@sha256:"));
        assert_eq!(cs["state"]["running"]["startedAt"], "2025-01-01T00:00:01Z");
        let ready = pod_condition(&run, "Ready").unwrap();
        assert_eq!(ready["status"], "True");
        let sched = pod_condition(&run, "PodScheduled").unwrap();
        assert_eq!(
            sched["lastTransitionTime"], "2025-01-01T00:00:00Z",
            "unchanged conditions keep their time"
        );
        let memo = Memo { started_at: Some(t1), ..memo };
        assert_eq!(
            plan(&run, Some(&memo), t1, &c),
            Some((add(t1, Duration::from_secs(2)), Action::Exit))
        );

        let t2 = add(t1, Duration::from_secs(2));
        let done = exited(&run, t2);
        assert_eq!(done["status"]["phase"], "Succeeded");
        let term = &done["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(term["exitCode"], 0);
        assert_eq!(term["reason"], "Completed");
        assert_eq!(term["finishedAt"], "2025-01-01T00:00:03Z");
        assert_eq!(term["startedAt"], "2025-01-01T00:00:01Z");
        assert_eq!(done["status"]["containerStatuses"][0]["ready"], false);
        let ready = pod_condition(&done, "Ready").unwrap();
        assert_eq!(ready["reason"], "PodCompleted");
        assert_eq!(plan(&done, None, t2, &c), None, "terminal pods wait");
    }

    #[test]
    fn failure_codes() {
        let mut p = pod();
        p["metadata"]["annotations"] = json!({"kjob.io/sim-exit-code.side": "42"});
        p["spec"]["nodeName"] = json!("sim-node-0");
        let run = started(&accepted(&p, t("2025-01-01T00:00:00Z")), t("2025-01-01T00:00:01Z"));
        let done = exited(&run, t("2025-01-01T00:00:05Z"));
        assert_eq!(done["status"]["phase"], "Failed");
        assert_eq!(done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 0);
        assert_eq!(done["status"]["containerStatuses"][1]["state"]["terminated"]["exitCode"], 42);
        assert_eq!(
            done["status"]["containerStatuses"][1]["state"]["terminated"]["reason"],
            "Error"
        );
        let ready = pod_condition(&done, "Ready").unwrap();
        assert_eq!(ready["reason"], "PodFailed");
    }

    #[test]
    fn on_failure_restarts() {
        let c = cfg();
        let mut p = pod();
        p["spec"]["restartPolicy"] = json!("OnFailure");
        p["spec"]["containers"] = json!([{"name": "main", "image": "busybox"}]);
        p["metadata"]["annotations"] = json!({"kjob.io/sim-exit-code": "3"});
        p["spec"]["nodeName"] = json!("sim-node-0");
        let t0 = t("2025-01-01T00:00:00Z");
        let run = started(&accepted(&p, t0), t0);
        let crashed = exited(&run, add(t0, Duration::from_secs(2)));
        assert_eq!(crashed["status"]["phase"], "Running");
        let cs = &crashed["status"]["containerStatuses"][0];
        assert_eq!(cs["restartCount"], 1);
        assert_eq!(cs["state"]["waiting"]["reason"], "CrashLoopBackOff");
        assert_eq!(cs["lastState"]["terminated"]["exitCode"], 3);
        let t2 = add(t0, Duration::from_secs(2));
        let memo = Memo { exited_at: Some(t2), ..Memo::default() };
        assert_eq!(
            plan(&crashed, Some(&memo), t2, &c),
            Some((add(t2, Duration::from_secs(10)), Action::Start))
        );
        let again = started(&crashed, add(t2, Duration::from_secs(10)));
        assert_eq!(again["status"]["containerStatuses"][0]["restartCount"], 1);
        assert_eq!(
            again["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"],
            3
        );
        assert_eq!(crash_loop_backoff(Duration::from_secs(10), 1), Duration::from_secs(10));
        assert_eq!(crash_loop_backoff(Duration::from_secs(10), 3), Duration::from_secs(40));
        assert_eq!(crash_loop_backoff(Duration::from_secs(10), 30), MAX_CRASH_LOOP_BACKOFF);
        // Exit 0 under OnFailure ends the pod.
        let mut ok = run.clone();
        ok["metadata"]["annotations"] = json!({});
        assert_eq!(exited(&ok, t2)["status"]["phase"], "Succeeded");
    }

    #[test]
    fn graceful_deletion() {
        let c = cfg();
        let mut p = pod();
        p["spec"]["nodeName"] = json!("sim-node-0");
        let t0 = t("2025-01-01T00:00:00Z");
        let mut run = started(&accepted(&p, t0), t0);
        run["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:40Z");
        run["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        // Requested at 00:10; termination time 0 → stop at once with SIGTERM.
        let (when, action) = plan(&run, None, t("2025-01-01T00:00:10Z"), &c).unwrap();
        assert_eq!((when, action), (t("2025-01-01T00:00:10Z"), Action::Terminate));
        let stopped = terminated(&run, when, &c);
        assert_eq!(stopped["status"]["phase"], "Failed");
        assert_eq!(
            stopped["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            143
        );
        assert_eq!(
            stopped["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
            "Error"
        );
        assert_eq!(plan(&stopped, None, when, &c), Some((when, Action::FinalDelete)));
        // Slow to stop: killed at the end of the grace period.
        let mut slow = run.clone();
        slow["metadata"]["annotations"] = json!({"kjob.io/sim-termination-time": "1m"});
        let (when, _) = plan(&slow, None, t0, &c).unwrap();
        assert_eq!(when, t("2025-01-01T00:00:40Z"));
        assert_eq!(
            terminated(&slow, when, &c)["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            137
        );
        // Held by finalizers after the zero-grace delete: nothing more to do.
        let mut held = stopped.clone();
        held["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        assert_eq!(plan(&held, None, when, &c), None);
    }

    #[test]
    fn scheduling_rules() {
        let c = cfg();
        let t0 = t("2025-01-01T00:00:00Z");
        let mut other = pod();
        other["spec"]["schedulerName"] = json!("custom");
        assert_eq!(plan(&other, None, t0, &c), None);
        let mut uns = pod();
        uns["metadata"]["annotations"] = json!({"kjob.io/sim-schedulable": "false"});
        assert_eq!(plan(&uns, None, t0, &c), Some((t0, Action::Unschedulable)));
        let marked = unschedulable(&uns, t0, &c);
        assert_eq!(marked["status"]["conditions"][0]["reason"], "Unschedulable");
        assert_eq!(plan(&marked, None, t0, &c), None);
        let mut gone = pod();
        gone["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        assert_eq!(plan(&gone, None, t0, &c), None);
    }
}
