//! Batch add-ons beside the real control plane: Kueue's and JobSet's managers, built from the
//! Go modules pinned in `cluster/kueue` and `cluster/jobset` by `cluster/build-addons.sh`.
//!
//! Each add-on is installed as its own `config/` does it, with three changes for loopback:
//! * its CRDs and webhook configurations (copied by the build script from the same module zip
//!   the binary is built from) reach the manager at `https://127.0.0.1:<port>` by `url`
//!   instead of through a Service, with a CA of its own, made here ([`write_webhook_pki`]),
//!   in `caBundle`; Kueue's internal cert management and JobSet's are off;
//! * only the webhooks of what the manager serves are registered: Kueue's own kinds, Jobs and
//!   (with JobSet) JobSets; the ones of integrations left off (pods, Deployments, Kubeflow,
//!   Ray, …) would answer as no-ops but, with `failurePolicy: Fail`, stop every pod create
//!   whenever the manager is down;
//! * the managers run as the cluster's admin (their ClusterRoles are not installed) with
//!   leader election off, one replica each.
//!
//! The managers are processes of the [`ControlPlane`]: stopped with it, and by `make
//! cluster-down` (their pids are in the run folder).

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use serde_json::{Value, json};

use crate::cluster::ControlPlane;
use crate::process::free_port;

/// Kueue's version (`cluster/kueue/go.mod`).
pub const KUEUE_VERSION: &str = "v0.17.0";
/// JobSet's version (`cluster/jobset/go.mod`).
pub const JOBSET_VERSION: &str = "v0.10.1";
/// How long a manager may take to answer ready: a cold start on a loaded 2-core machine
/// lists every kind it watches before its webhook server starts.
const ADDON_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an add-on's CRDs may take to be Established after they are applied.
const CRD_ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);
/// Kueue's feature gates changed from its defaults: the visibility server is an aggregated
/// API server (APIService, its own port and delegated authentication) that no scenario reads.
const KUEUE_FEATURE_GATES: &str = "VisibilityOnDemand=false";

/// Kueue's waitForPodsReady timeout: an admitted Job whose pods are not all ready by then is
/// evicted (suspended) and queued again. Long enough that a loaded 2-core machine starts every
/// other scenario's pods well within it (they are ready in 1-3 s), short enough for a case.
pub const KUEUE_PODS_READY_TIMEOUT: &str = "20s";
/// Base of the requeue backoff after such an eviction, in seconds (Kueue's default is 60; its
/// delays are about base × 2^(n-1) plus jitter).
const KUEUE_REQUEUE_BACKOFF_BASE_SECONDS: u32 = 1;

/// Where Kueue reads its metrics server's certificate when its internal cert management is off:
/// a path fixed in its `cmd/kueue/main.go` (v0.17.0), with no flag or setting to move it, and
/// without the files the manager exits at start.
const KUEUE_METRICS_CERT_DIR: &str = "/etc/kueue/metrics/certs";

/// A batch add-on `make cluster-up ADDONS=…` can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Addon {
    /// Kueue (sigs.k8s.io/kueue): quota and admission by `spec.suspend`.
    Kueue,
    /// JobSet (sigs.k8s.io/jobset): groups of Jobs.
    JobSet,
}

impl Addon {
    /// Its name in `ADDONS=` and in the run folder.
    pub fn name(self) -> &'static str {
        match self {
            Addon::Kueue => "kueue",
            Addon::JobSet => "jobset",
        }
    }

    /// Parses a comma-separated list (`kueue,jobset`; empty: none).
    pub fn parse_list(s: &str) -> anyhow::Result<Vec<Addon>> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let a = match part {
                "kueue" => Addon::Kueue,
                "jobset" => Addon::JobSet,
                other => bail!("unknown add-on {other:?} (known: kueue, jobset)"),
            };
            if !out.contains(&a) {
                out.push(a);
            }
        }
        // JobSet first: Kueue's JobSet integration needs JobSet's CRD when it starts.
        out.sort_by_key(|a| std::cmp::Reverse(*a));
        Ok(out)
    }
}

/// Runs `cluster/build-addons.sh` (builds both managers once per go.sum, cached outside the
/// repo) and returns its folder: `bin/kueue`, `bin/jobset`, `config/<addon>/*.yaml`.
pub fn build_addons() -> anyhow::Result<PathBuf> {
    crate::cluster::run_build_script("cluster/build-addons.sh", "Kueue and JobSet")
}

/// Writes a CA of the add-on's own (`ca.crt`) and a serving certificate for `127.0.0.1`
/// signed by it (`tls.crt`, `tls.key`: controller-runtime's default names) into `dir`;
/// returns the CA's PEM.
pub fn write_webhook_pki(dir: &Path, name: &str) -> anyhow::Result<String> {
    fs::create_dir_all(dir)?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, format!("{name} webhook CA"));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()])?;
    p.distinguished_name.push(DnType::CommonName, format!("{name} webhook"));
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    let cert = p.signed_by(&key, &ca)?;
    fs::write(dir.join("ca.crt"), ca.pem())?;
    fs::write(dir.join("tls.crt"), cert.pem())?;
    fs::write(dir.join("tls.key"), key.serialize_pem())?;
    Ok(ca.pem())
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Every YAML document of `path` as JSON (empty documents skipped).
fn read_yaml_docs(path: &Path) -> anyhow::Result<Vec<Value>> {
    use serde::Deserialize;
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = Value::deserialize(doc).with_context(|| format!("parsing {}", path.display()))?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// Kueue's CRDs that convert between v1beta1 and v1beta2 through the manager: the ones whose
/// `patches/webhook_in_<plural>.yaml` Kueue v0.17.0's `config/components/crd/kustomization.yaml`
/// applies (the v1beta1 types with `ConvertTo`/`ConvertFrom`). Its other CRDs serve both
/// versions with the same schema and no conversion (strategy None), as there.
pub const KUEUE_CONVERTED_CRDS: [&str; 5] =
    ["localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"];

/// A CRD Kueue converts ([`KUEUE_CONVERTED_CRDS`]) converts through the manager's `/convert`, as
/// its kustomize patch says, by URL instead of through the Service.
pub fn rewrite_crd(mut crd: Value, base_url: &str, ca_bundle: &str) -> Value {
    let converted = crd["spec"]["group"] == "kueue.x-k8s.io"
        && crd["spec"]["names"]["plural"]
            .as_str()
            .is_some_and(|p| KUEUE_CONVERTED_CRDS.contains(&p));
    if converted {
        crd["spec"]["conversion"] = json!({
            "strategy": "Webhook",
            "webhook": {
                "clientConfig": {"url": format!("{base_url}/convert"), "caBundle": ca_bundle},
                "conversionReviewVersions": ["v1"],
            },
        });
    }
    crd
}

/// A webhook configuration of `config/components/webhook/manifests.yaml`, named as the
/// add-on's kustomization names it (`<addon>-…`), each webhook reaching `base_url` plus its
/// Service path; webhooks whose path `keep` refuses are dropped. JobSet's pod webhooks get the
/// object selector of its kustomize patch (only JobSet's pods).
pub fn rewrite_webhooks(
    mut cfg: Value,
    addon: Addon,
    base_url: &str,
    ca_bundle: &str,
    keep: impl Fn(&str) -> bool,
) -> Value {
    let name = cfg["metadata"]["name"].as_str().unwrap_or_default().to_string();
    cfg["metadata"]["name"] = json!(format!("{}-{name}", addon.name()));
    let hooks = cfg["webhooks"].as_array().cloned().unwrap_or_default();
    let kept: Vec<Value> = hooks
        .into_iter()
        .filter_map(|mut h| {
            let path = h["clientConfig"]["service"]["path"].as_str()?.to_string();
            if !keep(&path) {
                return None;
            }
            h["clientConfig"] = json!({"url": format!("{base_url}{path}"), "caBundle": ca_bundle});
            if addon == Addon::JobSet && path.ends_with("-v1-pod") {
                h["objectSelector"] = json!({"matchExpressions": [
                    {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]});
            }
            Some(h)
        })
        .collect();
    cfg["webhooks"] = json!(kept);
    cfg
}

/// Whether a Kueue webhook path is one the manager serves with `frameworks` on.
fn kueue_serves(path: &str, jobset: bool) -> bool {
    path.contains("-kueue-x-k8s-io-")
        || path.ends_with("-batch-v1-job")
        || (jobset && path.contains("-jobset-x-k8s-io-"))
}

/// Puts a serving certificate where Kueue looks for its metrics certificate
/// ([`KUEUE_METRICS_CERT_DIR`]) when none is there: a copy of this cluster's webhook
/// certificate and key, written into a folder of their own and renamed into place as one, so
/// clusters starting at once never see half a pair (whichever lands first stays; nothing
/// scrapes Kueue's metrics, so whose it is does not matter).
fn ensure_kueue_metrics_cert(certs: &Path) -> anyhow::Result<()> {
    let dir = Path::new(KUEUE_METRICS_CERT_DIR);
    if dir.join("tls.crt").is_file() && dir.join("tls.key").is_file() {
        return Ok(());
    }
    let parent = dir.parent().expect("a fixed absolute path");
    fs::create_dir_all(parent).with_context(|| {
        format!(
            "creating {} (Kueue reads its metrics certificate there when its internal cert \
             management is off; the path is fixed in Kueue)",
            parent.display()
        )
    })?;
    let tmp = parent.join(format!(".certs.{}", std::process::id()));
    fs::create_dir_all(&tmp)?;
    for f in ["tls.key", "tls.crt"] {
        fs::copy(certs.join(f), tmp.join(f))
            .with_context(|| format!("writing {}", tmp.display()))?;
    }
    // Fails when another cluster's pair landed first (the folder exists and is not empty).
    if fs::rename(&tmp, dir).is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    anyhow::ensure!(dir.join("tls.crt").is_file(), "no certificate in {}", dir.display());
    Ok(())
}

/// `GET /readyz` on a manager's health port answers 200.
fn ready(port: u16) -> bool {
    let Ok(mut s) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    let n = s.read(&mut buf).unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]);
    head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200")
}

impl ControlPlane {
    /// Installs and starts `addons` (in [`Addon::parse_list`]'s order) from the built folder
    /// `addons_dir`: CRDs, the manager, and once it answers ready, its webhook configurations.
    pub(crate) fn start_addons(
        &mut self,
        addons: &[Addon],
        addons_dir: &Path,
        kubeconfig: &Path,
    ) -> anyhow::Result<()> {
        for &addon in addons {
            self.start_addon(addon, addons_dir, kubeconfig, addons.contains(&Addon::JobSet))
                .with_context(|| format!("starting {}", addon.name()))?;
        }
        Ok(())
    }

    fn start_addon(
        &mut self,
        addon: Addon,
        addons_dir: &Path,
        kubeconfig: &Path,
        with_jobset: bool,
    ) -> anyhow::Result<()> {
        let name = addon.name();
        let bin = addons_dir.join("bin").join(name);
        if !bin.is_file() {
            bail!("{} lacks {name}: run cluster/build-addons.sh", addons_dir.display());
        }
        let run = self.dir.join("addons").join(name);
        let certs = run.join("certs");
        let ca = write_webhook_pki(&certs, name)?;
        let ca_bundle = base64(ca.as_bytes());
        let (webhook_port, probe_port, metrics_port) = (free_port(), free_port(), free_port());
        let base_url = format!("https://127.0.0.1:{webhook_port}");
        let config_dir = addons_dir.join("config").join(name);

        // CRDs first (the manager's informers need them).
        let mut crds = Vec::new();
        let mut files: Vec<PathBuf> = fs::read_dir(&config_dir)
            .with_context(|| format!("reading {}", config_dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|f| f != "webhooks.yaml"))
            .collect();
        files.sort();
        for f in &files {
            crds.extend(
                read_yaml_docs(f)?.into_iter().map(|c| rewrite_crd(c, &base_url, &ca_bundle)),
            );
        }
        let crd_file = run.join("crds.json");
        fs::write(
            &crd_file,
            serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": crds}))?,
        )?;
        let crd_path = crd_file.display().to_string();
        self.kubectl(&["apply", "--server-side", "-f", &crd_path])?;
        // `kubectl wait` fails at once, instead of waiting, on a CRD whose status has no
        // conditions yet (`.status.conditions accessor error: <nil>`), which a loaded server
        // leaves for a moment after the apply: ask again until the deadline.
        let deadline = Instant::now() + CRD_ESTABLISHED_TIMEOUT;
        loop {
            match self.kubectl(&[
                "wait",
                "--for=condition=Established",
                "--timeout=30s",
                "-f",
                &crd_path,
            ]) {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "{name}'s CRDs not established yet");
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => return Err(e.context(format!("{name}'s CRDs not established"))),
            }
        }
        let ns = format!("{name}-system");
        if self.kubectl(&["get", "namespace", &ns, "-o", "name"]).is_err() {
            self.kubectl(&["create", "namespace", &ns])?;
        }

        let common = format!(
            "leaderElection:\n  leaderElect: false\ninternalCertManagement:\n  enable: false\n\
             webhook:\n  host: 127.0.0.1\n  port: {webhook_port}\n  certDir: {}\n\
             health:\n  healthProbeBindAddress: 127.0.0.1:{probe_port}\n\
             metrics:\n  bindAddress: 127.0.0.1:{metrics_port}\n",
            certs.display()
        );
        let config = run.join("config.yaml");
        let mut args = vec![
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
        ];
        match addon {
            Addon::Kueue => {
                ensure_kueue_metrics_cert(&certs)?;
                let mut frameworks = "  - batch/job\n".to_string();
                if with_jobset {
                    frameworks.push_str("  - jobset.x-k8s.io/jobset\n");
                }
                fs::write(
                    &config,
                    format!(
                        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n\
                         namespace: kueue-system\n{common}integrations:\n  frameworks:\n{frameworks}\
                         waitForPodsReady:\n  timeout: {KUEUE_PODS_READY_TIMEOUT}\n  \
                         blockAdmission: false\n  recoveryTimeout: 0s\n  requeuingStrategy:\n    \
                         timestamp: Eviction\n    backoffBaseSeconds: {KUEUE_REQUEUE_BACKOFF_BASE_SECONDS}\n"
                    ),
                )?;
                args.push(format!("--feature-gates={KUEUE_FEATURE_GATES}"));
            }
            Addon::JobSet => {
                fs::write(
                    &config,
                    format!(
                        "apiVersion: config.jobset.x-k8s.io/v1alpha1\nkind: Configuration\n{common}"
                    ),
                )?;
            }
        }
        self.spawn(name, bin, args)?;
        let started = Instant::now();
        while !ready(probe_port) {
            self.check_alive()?;
            if started.elapsed() > ADDON_READY_TIMEOUT {
                bail!(
                    "{name} not ready after {ADDON_READY_TIMEOUT:?} (log: {})",
                    self.log_dir.join(format!("{name}.log")).display()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }

        let hooks: Vec<Value> = read_yaml_docs(&config_dir.join("webhooks.yaml"))?
            .into_iter()
            .map(|cfg| {
                rewrite_webhooks(cfg, addon, &base_url, &ca_bundle, |path| match addon {
                    Addon::Kueue => kueue_serves(path, with_jobset),
                    Addon::JobSet => true,
                })
            })
            .collect();
        let hook_file = run.join("webhooks.json");
        fs::write(
            &hook_file,
            serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": hooks}))?,
        )?;
        self.kubectl(&["apply", "--server-side", "-f", &hook_file.display().to_string()])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn add_on_lists_parse_in_start_order_and_refuse_unknown_names() {
        assert_eq!(Addon::parse_list("").unwrap(), vec![]);
        assert_eq!(Addon::parse_list("kueue,jobset").unwrap(), vec![Addon::JobSet, Addon::Kueue]);
        assert_eq!(
            Addon::parse_list("jobset, kueue,kueue").unwrap(),
            vec![Addon::JobSet, Addon::Kueue]
        );
        assert!(Addon::parse_list("volcano").is_err());
    }

    #[test]
    fn webhooks_reach_loopback_and_only_served_kinds_stay() {
        let cfg = json!({"kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validating-webhook-configuration"},
        "webhooks": [
            {"name": "vjob.kb.io", "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": "/validate-batch-v1-job"}}},
            {"name": "vpod.kb.io", "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": "/validate--v1-pod"}}},
        ]});
        let out = rewrite_webhooks(cfg, Addon::Kueue, "https://127.0.0.1:9", "Q0E=", |p| {
            kueue_serves(p, false)
        });
        assert_eq!(out["metadata"]["name"], "kueue-validating-webhook-configuration");
        let hooks = out["webhooks"].as_array().unwrap();
        assert_eq!(hooks.len(), 1);
        assert_eq!(hooks[0]["clientConfig"]["url"], "https://127.0.0.1:9/validate-batch-v1-job");
        assert_eq!(hooks[0]["clientConfig"]["caBundle"], "Q0E=");
        assert!(hooks[0]["clientConfig"]["service"].is_null());
    }

    #[test]
    fn only_the_crds_kueue_patches_convert_through_the_manager() {
        let crd = |plural: &str| {
            json!({"spec": {"group": "kueue.x-k8s.io", "names": {"plural": plural},
                "versions": [{"name": "v1beta1"}, {"name": "v1beta2"}]}})
        };
        let flavor = rewrite_crd(crd("resourceflavors"), "https://127.0.0.1:9", "Q0E=");
        assert!(flavor["spec"]["conversion"].is_null());
        let out = rewrite_crd(crd("workloads"), "https://127.0.0.1:9", "Q0E=");
        assert_eq!(
            out["spec"]["conversion"]["webhook"]["clientConfig"]["url"],
            "https://127.0.0.1:9/convert"
        );
    }
}
