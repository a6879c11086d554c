//! Helpers of the end-to-end tests (`tests/*.rs`): render the kustomize manifests, parse them
//! into k8s-openapi types, extract RBAC grants and the `--flags` used in manifests and
//! docker-compose.yml, and read a binary's `--help`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_json::Value;

/// The repository root.
pub fn root() -> PathBuf {
    kjob_testkit::workspace_root()
}

/// The kubectl used to render kustomizations: `KJOB_KUBECTL`, then `kubectl.1.32` on PATH or in
/// the Google Cloud SDK folder, then `kubectl` on PATH. The versioned binary is preferred: the
/// SDK's plain `kubectl` is a dispatcher that may contact a server first.
pub fn kubectl() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KJOB_KUBECTL") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var("PATH").unwrap_or_default();
    let on_path =
        |name: &str| path.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file());
    on_path("kubectl.1.32")
        .or_else(|| {
            Some(PathBuf::from("/usr/lib/google-cloud-sdk/bin/kubectl.1.32"))
                .filter(|p| p.is_file())
        })
        .or_else(|| on_path("kubectl"))
}

/// Parses a multi-document YAML stream into JSON values, skipping empty documents.
pub fn parse_docs(yaml: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v = Value::deserialize(doc)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// `kubectl kustomize <dir>` (relative to the repository root), parsed.
pub fn kustomize(kubectl: &Path, dir: &str) -> anyhow::Result<Vec<Value>> {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(root().join(dir))
        .output()
        .with_context(|| format!("running {}", kubectl.display()))?;
    if !out.status.success() {
        bail!("kubectl kustomize {dir} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    parse_docs(&String::from_utf8(out.stdout)?)
}

/// Kinds without a namespace.
const CLUSTER_KINDS: [&str; 3] = ["Namespace", "ClusterRole", "ClusterRoleBinding"];

/// deploy/base without kustomize: its `resources` files with its `namespace` applied. Enough
/// for RBAC and flag checks on machines without kubectl (base uses no other transformer that
/// matters to them).
pub fn base_without_kustomize() -> anyhow::Result<Vec<Value>> {
    let base = root().join("deploy/base");
    let k: Value =
        serde_yaml::from_str(&std::fs::read_to_string(base.join("kustomization.yaml"))?)?;
    let ns = k["namespace"].as_str().context("base kustomization has no namespace")?;
    let mut out = Vec::new();
    for r in k["resources"].as_array().context("no resources")? {
        let file = base.join(r.as_str().context("resource is not a string")?);
        for mut obj in parse_docs(&std::fs::read_to_string(&file)?)? {
            if !CLUSTER_KINDS.contains(&obj["kind"].as_str().unwrap_or_default()) {
                obj["metadata"]["namespace"] = Value::from(ns);
            }
            out.push(obj);
        }
    }
    Ok(out)
}

fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(
    obj: &Value,
) -> anyhow::Result<()> {
    let typed: T = serde_json::from_value(obj.clone())?;
    let back = serde_json::to_value(&typed)?;
    if let Some(path) = first_difference(obj, &back, String::new()) {
        bail!("field {path} is lost or changed by the typed round trip (misspelled or misplaced?)");
    }
    Ok(())
}

/// The first path where `a` has something `b` lacks or differs on. Keys only `b` has are
/// fine: typed serialisation adds `apiVersion`/`kind` to embedded objects.
fn first_difference(a: &Value, b: &Value, path: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().filter(|k| !x[*k].is_null()).collect();
            keys.into_iter().find_map(|k| {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(xv), Some(yv)) => first_difference(xv, yv, p),
                    _ => Some(p),
                }
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (xv, yv))| first_difference(xv, yv, format!("{path}[{i}]"))),
        _ if a == b => None,
        _ => Some(if path.is_empty() { ".".into() } else { path }),
    }
}

/// Parses `obj` into the k8s-openapi type of its kind and checks nothing is lost on the way
/// back (which catches misspelled or misplaced fields that a plain parse would ignore).
pub fn check_typed(obj: &Value) -> anyhow::Result<()> {
    use k8s_openapi::api::{apps, autoscaling, batch, core, networking, policy, rbac};
    let kind = obj["kind"].as_str().unwrap_or_default();
    let api = obj["apiVersion"].as_str().unwrap_or_default();
    match (api, kind) {
        ("v1", "Namespace") => round_trip::<core::v1::Namespace>(obj),
        ("v1", "ServiceAccount") => round_trip::<core::v1::ServiceAccount>(obj),
        ("v1", "Service") => round_trip::<core::v1::Service>(obj),
        ("v1", "ConfigMap") => round_trip::<core::v1::ConfigMap>(obj),
        ("v1", "Secret") => round_trip::<core::v1::Secret>(obj),
        ("apps/v1", "Deployment") => round_trip::<apps::v1::Deployment>(obj),
        ("apps/v1", "StatefulSet") => round_trip::<apps::v1::StatefulSet>(obj),
        ("batch/v1", "Job") => round_trip::<batch::v1::Job>(obj),
        ("policy/v1", "PodDisruptionBudget") => round_trip::<policy::v1::PodDisruptionBudget>(obj),
        ("networking.k8s.io/v1", "NetworkPolicy") => {
            round_trip::<networking::v1::NetworkPolicy>(obj)
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<rbac::v1::ClusterRole>(obj),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<rbac::v1::ClusterRoleBinding>(obj)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<rbac::v1::Role>(obj),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<rbac::v1::RoleBinding>(obj),
        ("autoscaling/v2", "HorizontalPodAutoscaler") => {
            round_trip::<autoscaling::v2::HorizontalPodAutoscaler>(obj)
        }
        _ => bail!("unexpected object {api} {kind}: add it to check_typed"),
    }
    .with_context(|| format!("{kind} {}", name(obj)))
}

/// `metadata.name` (empty if absent).
pub fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

/// The objects of one kind.
pub fn of_kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

/// One granted permission, owned: (scope, api group, resource, verb); scope is `cluster` or
/// `namespace/<ns>`.
pub type Grant = (String, String, String, String);

/// Every permission granted to each ServiceAccount (`namespace/name`) by the RBAC objects.
/// Wildcards, resourceNames and nonResourceURLs are refused: least privilege is checked
/// against exact rules only.
pub fn grants_by_service_account(
    objs: &[Value],
) -> anyhow::Result<BTreeMap<String, BTreeSet<Grant>>> {
    let roles: BTreeMap<(String, String), &Value> = objs
        .iter()
        .filter(|o| o["kind"] == "Role" || o["kind"] == "ClusterRole")
        .map(|o| {
            let ns = o["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
            ((format!("{}/{ns}", o["kind"].as_str().unwrap_or_default()), name(o).to_string()), o)
        })
        .collect();
    let mut out: BTreeMap<String, BTreeSet<Grant>> = BTreeMap::new();
    for b in objs.iter().filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding")
    {
        let binding_ns = b["metadata"]["namespace"].as_str().unwrap_or_default();
        let role_kind = b["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_ns = if role_kind == "Role" { binding_ns } else { "" };
        let role_name = b["roleRef"]["name"].as_str().unwrap_or_default();
        let role =
            roles.get(&(format!("{role_kind}/{role_ns}"), role_name.to_string())).with_context(
                || format!("binding {} refers to missing {role_kind} {role_name}", name(b)),
            )?;
        let scope = if b["kind"] == "ClusterRoleBinding" {
            "cluster".to_string()
        } else {
            format!("namespace/{binding_ns}")
        };
        for s in b["subjects"].as_array().into_iter().flatten() {
            if s["kind"] != "ServiceAccount" {
                bail!("binding {} has a non-ServiceAccount subject {s}", name(b));
            }
            let sa = format!(
                "{}/{}",
                s["namespace"].as_str().unwrap_or(binding_ns),
                s["name"].as_str().unwrap_or_default()
            );
            let set = out.entry(sa).or_default();
            for rule in role["rules"].as_array().into_iter().flatten() {
                if rule.get("resourceNames").is_some() || rule.get("nonResourceURLs").is_some() {
                    bail!(
                        "{role_name}: resourceNames/nonResourceURLs are not modelled in kjob_core::rbac"
                    );
                }
                let strs = |k: &str| -> Vec<String> {
                    rule[k]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                };
                for g in strs("apiGroups") {
                    for r in strs("resources") {
                        for v in strs("verbs") {
                            if [&g, &r, &v].iter().any(|x| x.contains('*')) {
                                bail!("{role_name}: wildcard in rule {rule}");
                            }
                            set.insert((scope.clone(), g.clone(), r.clone(), v));
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// What `kjob_core::rbac` says each ServiceAccount (`namespace/name`) needs.
pub fn expected_grants() -> BTreeMap<String, BTreeSet<Grant>> {
    use kjob_core::rbac::{COMPONENTS, KJOB_NAMESPACE, Scope};
    COMPONENTS
        .iter()
        .map(|c| {
            let set = c
                .permissions()
                .into_iter()
                .map(|(scope, g, r, v)| {
                    let scope = match scope {
                        Scope::Cluster => "cluster".to_string(),
                        Scope::Namespace(ns) => format!("namespace/{ns}"),
                    };
                    (scope, g.to_string(), r.to_string(), v.to_string())
                })
                .collect();
            (format!("{KJOB_NAMESPACE}/{}", c.service_account), set)
        })
        .collect()
}

/// The kjob binary a container runs, from its image name (`…/kjob-queue:tag`, `kjob/queue:dev`).
pub fn binary_of_image(image: &str) -> Option<String> {
    // A digest ends the reference (`name:tag@sha256:…`); a ':' after the last '/' starts the
    // tag; one before it belongs to a registry port.
    let image = image.split_once('@').map_or(image, |(name, _)| name);
    let repo = match image.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') => r,
        _ => image,
    };
    let last = repo.rsplit('/').next()?;
    let bin = if last.starts_with("kjob-") { last.to_string() } else { format!("kjob-{last}") };
    ["kjob-queue", "kjob-watcher", "kjob-worker", "kjob-sim"].contains(&bin.as_str()).then_some(bin)
}

/// Whether an image reference names its content: `…@sha256:` and 64 lowercase hex digits.
pub fn pinned_by_digest(image: &str) -> bool {
    image.split_once("@sha256:").is_some_and(|(name, hex)| {
        !name.is_empty()
            && hex.len() == 64
            && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Every container image (init containers included) of the rendered objects' pod templates
/// (Deployments, StatefulSets, Jobs), as (object name, image).
pub fn pod_template_images(objs: &[Value]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for o in objs {
        let spec = &o["spec"]["template"]["spec"];
        for list in ["initContainers", "containers"] {
            for c in spec[list].as_array().into_iter().flatten() {
                if let Some(image) = c["image"].as_str() {
                    out.push((name(o).to_string(), image.to_string()));
                }
            }
        }
    }
    out
}

/// (binary, args) of every kjob container in the rendered objects' pod templates.
pub fn manifest_args(objs: &[Value]) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for o in objs {
        let containers = o["spec"]["template"]["spec"]["containers"].as_array();
        for c in containers.into_iter().flatten() {
            let Some(bin) = binary_of_image(c["image"].as_str().unwrap_or_default()) else {
                continue;
            };
            let args = c["args"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str().map(String::from));
            out.push((bin, args.collect()));
        }
    }
    out
}

/// (binary, command) of every docker-compose service built from the Dockerfile (`build.args.BIN`).
pub fn compose_args(compose: &Value) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let services = compose["services"].as_object().context("compose file has no services")?;
    let mut out = Vec::new();
    for (svc, s) in services {
        let Some(bin) = s["build"]["args"]["BIN"].as_str() else { continue };
        let cmd = match &s["command"] {
            Value::Array(a) => a.iter().filter_map(|v| v.as_str().map(String::from)).collect(),
            Value::String(s) => s.split_whitespace().map(String::from).collect(),
            Value::Null => Vec::new(),
            other => bail!("service {svc}: unexpected command {other}"),
        };
        out.push((bin.to_string(), cmd));
    }
    Ok(out)
}

/// The `--long` flag names in `args` (`--a=b` and `--a b` both give `--a`).
pub fn flag_names(args: &[String]) -> BTreeSet<String> {
    args.iter()
        .filter(|a| a.starts_with("--") && a.len() > 2)
        .map(|a| a.split_once('=').map_or(a.as_str(), |(f, _)| f).to_string())
        .collect()
}

/// The `--long` flags a `--help` text documents (subcommands' flags are not included).
pub fn help_flags(help: &str) -> BTreeSet<String> {
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']' || c == '=')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()).to_string())
        .collect()
}

/// Runs `<binary> --help` and returns its output.
pub fn help_of(binary: &Path) -> anyhow::Result<String> {
    let out = Command::new(binary).arg("--help").output()?;
    if !out.status.success() {
        bail!("{} --help failed: {}", binary.display(), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Runs a command to its end and returns its stdout; panics with its output when it fails.
pub fn run_ok(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().expect("running a command");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_help_parsing() {
        let args: Vec<String> = ["--listen=0.0.0.0:1", "--kubeconfig", "/x", "-v", "--", "value"]
            .map(String::from)
            .into();
        assert_eq!(flag_names(&args), BTreeSet::from(["--listen".into(), "--kubeconfig".into()]));
        let help = "Options:\n      --queue-url <QUEUE_URL>  Queue [env: KJOB_QUEUE_URL=]\n  -h, --help\n      --manage-all-jobs\n";
        let h = help_flags(help);
        assert!(
            h.contains("--queue-url") && h.contains("--help") && h.contains("--manage-all-jobs"),
            "{h:?}"
        );
        assert!(!h.contains("--listen"));
    }

    const DIGEST: &str = "sha256:ff02b58f971e7d7d156a1267e283fcbbeee91773b6aa36c49dac28ecfe28eadf";

    #[test]
    fn image_to_binary() {
        assert_eq!(
            binary_of_image("ghcr.io/kjob-dev/kjob-queue:0.1.0").as_deref(),
            Some("kjob-queue")
        );
        assert_eq!(binary_of_image("kjob/worker:dev").as_deref(), Some("kjob-worker"));
        assert_eq!(binary_of_image("localhost:5000/kjob/watcher").as_deref(), Some("kjob-watcher"));
        assert_eq!(binary_of_image("redis:7.4-alpine"), None);
        assert_eq!(binary_of_image(&format!("redis:7.4.11-alpine@{DIGEST}")), None);
        assert_eq!(
            binary_of_image(&format!("registry.example:5000/kjob-worker:1.0@{DIGEST}")).as_deref(),
            Some("kjob-worker")
        );
        assert!(pinned_by_digest(&format!("redis:7.4.11-alpine@{DIGEST}")));
        assert!(!pinned_by_digest("redis:7.4.11-alpine"));
        assert!(!pinned_by_digest("redis@sha256:abc"));
        assert!(!pinned_by_digest(&format!("redis@{}", DIGEST.to_uppercase())));
    }

    #[test]
    fn round_trip_catches_misspelled_fields() {
        let good = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "a"}, "automountServiceAccountToken": false});
        check_typed(&good).unwrap();
        let bad = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "a"}, "automountServiceAcountToken": false});
        let err = format!("{:#}", check_typed(&bad).unwrap_err());
        assert!(err.contains("automountServiceAcountToken"), "{err}");
        let unknown = serde_json::json!({"apiVersion": "v1", "kind": "Pod"});
        assert!(check_typed(&unknown).is_err());
    }

    #[test]
    fn grants_flatten_bindings() {
        let objs = parse_docs(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: r, namespace: ns}
rules: [{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, update]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: rb, namespace: ns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: r}
subjects: [{kind: ServiceAccount, name: sa, namespace: ns}]
"#,
        )
        .unwrap();
        let g = grants_by_service_account(&objs).unwrap();
        let want: BTreeSet<Grant> = ["get", "update"]
            .map(|v| {
                ("namespace/ns".into(), "coordination.k8s.io".into(), "leases".into(), v.into())
            })
            .into();
        assert_eq!(g["ns/sa"], want);
        let mut wild = objs.clone();
        wild[0]["rules"][0]["verbs"] = serde_json::json!(["*"]);
        assert!(grants_by_service_account(&wild).is_err());
    }
}
