//! The API server a test runs on: kjob-sim in process, or the real control plane (see
//! [`crate::cluster`]). One test body runs on both through [`on_both_servers!`]:
//!
//! ```ignore
//! async fn job_completes(server: TestServer) { /* server.client(), server.namespace("x") */ }
//! kjob_testkit::on_both_servers!(kjob_sim::SimConfig::default(); job_completes);
//! ```
//!
//! On the real server the test runs as cluster-admin, kjob's services on their own
//! ServiceAccounts ([`TestServer::worker_kubeconfig`], [`TestServer::watcher_kubeconfig`]), and
//! each test gets a namespace of its own (names get a unique suffix, since the control plane is
//! shared by every test of a `make test` run).
//!
//! Faults ([`TestServer::inject`], [`TestServer::close_watches`]) hit the services' traffic on
//! both: kjob-sim injects them itself (for every client, the test's too), the real server gets
//! them through a [`FaultProxy`] the services' kubeconfigs point at (the test's own client goes
//! to kube-apiserver directly).

use std::path::{Path, PathBuf};

use kjob_sim::SimConfig;
use kjob_sim::testing::TestSim;

use crate::cluster::{ClusterInfo, TestCluster, test_cluster};
use crate::faults::ApiFaults;
use crate::proxy::FaultProxy;

/// kjob-sim or the real control plane.
pub enum TestServer {
    /// kjob-sim in this process.
    Sim(TestSim),
    /// The real control plane, shared or started for this test.
    Real {
        /// The control plane.
        cluster: Box<TestCluster>,
        /// A cluster-admin client.
        client: kube::Client,
        /// Suffix of this test's namespaces.
        suffix: String,
        /// The proxy in front of kube-apiserver that the services' kubeconfigs point at.
        proxy: Box<FaultProxy>,
        /// Holds the services' kubeconfigs through [`TestServer::Real::proxy`].
        kubeconfigs: tempfile::TempDir,
    },
}

impl std::fmt::Debug for TestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_real() { "TestServer::Real" } else { "TestServer::Sim" })
    }
}

/// The client configuration of a kubeconfig file (one a harness wrote).
pub async fn kube_config(kubeconfig: &Path) -> anyhow::Result<kube::Config> {
    use anyhow::Context as _;
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    Ok(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?)
}

/// A client of a kubeconfig file; with `timeout`, every connect, read and write is bounded by
/// it (harnesses that must not hang on a stalled server; not for long watches).
pub async fn kube_client(
    kubeconfig: &Path,
    timeout: Option<std::time::Duration>,
) -> anyhow::Result<kube::Client> {
    let mut config = kube_config(kubeconfig).await?;
    if timeout.is_some() {
        config.connect_timeout = timeout;
        config.read_timeout = timeout;
        config.write_timeout = timeout;
    }
    Ok(kube::Client::try_from(config)?)
}

async fn client_for(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    kube_client(kubeconfig, None).await
}

impl TestServer {
    /// kjob-sim with `config`.
    pub async fn sim(config: SimConfig) -> TestServer {
        TestServer::Sim(TestSim::start(config).await)
    }

    /// The real control plane; `None` (with a printed reason) only when no Go toolchain exists.
    /// Panics when it cannot be built or started: that is a failure, not a skip.
    pub async fn real() -> Option<TestServer> {
        let cluster = tokio::task::spawn_blocking(test_cluster)
            .await
            .expect("test_cluster task")
            .expect("the real control plane (cluster/build.sh, kjob-cluster)")?;
        let client = client_for(&cluster.info().kubeconfig).await.expect("admin client");
        let suffix = format!("{}-{}", std::process::id(), unique());
        let proxy = FaultProxy::start(&cluster.info().kubeconfig).expect("the fault proxy");
        let kubeconfigs = tempfile::tempdir().expect("a folder for the kubeconfigs");
        for (from, name) in proxied_kubeconfigs(cluster.info()) {
            proxy.write_kubeconfig(&from, &kubeconfigs.path().join(name)).expect("a kubeconfig");
        }
        Some(TestServer::Real {
            cluster: Box::new(cluster),
            client,
            suffix,
            proxy: Box::new(proxy),
            kubeconfigs,
        })
    }

    /// Whether this is the real control plane.
    pub fn is_real(&self) -> bool {
        matches!(self, TestServer::Real { .. })
    }

    /// kjob-sim, when the test runs on it.
    pub fn as_sim(&self) -> Option<&TestSim> {
        match self {
            TestServer::Sim(s) => Some(s),
            TestServer::Real { .. } => None,
        }
    }

    /// The real control plane's files, when the test runs on it.
    pub fn cluster(&self) -> Option<&ClusterInfo> {
        match self {
            TestServer::Sim(_) => None,
            TestServer::Real { cluster, .. } => Some(cluster.info()),
        }
    }

    /// A client with every right (kjob-sim has no authorization; cluster-admin on the real one).
    pub fn client(&self) -> kube::Client {
        match self {
            TestServer::Sim(s) => s.client(),
            TestServer::Real { client, .. } => client.clone(),
        }
    }

    /// The test's own kubeconfig (cluster-admin).
    pub fn kubeconfig(&self) -> PathBuf {
        match self {
            TestServer::Sim(s) => s.kubeconfig_path().to_path_buf(),
            TestServer::Real { cluster, .. } => cluster.info().kubeconfig.clone(),
        }
    }

    /// The kubeconfig a kjob-worker runs on (its ServiceAccount, through the fault proxy, on
    /// the real server).
    pub fn worker_kubeconfig(&self) -> PathBuf {
        match self {
            TestServer::Sim(s) => s.kubeconfig_path().to_path_buf(),
            TestServer::Real { kubeconfigs, .. } => kubeconfigs.path().join(WORKER_KUBECONFIG),
        }
    }

    /// The kubeconfig a kjob-watcher runs on (its ServiceAccount, through the fault proxy, on
    /// the real server).
    pub fn watcher_kubeconfig(&self) -> PathBuf {
        match self {
            TestServer::Sim(s) => s.kubeconfig_path().to_path_buf(),
            TestServer::Real { kubeconfigs, .. } => kubeconfigs.path().join(WATCHER_KUBECONFIG),
        }
    }

    /// Sets the faults the services' API traffic meets from now on (replacing earlier ones).
    pub async fn inject(&self, faults: ApiFaults) {
        match self {
            TestServer::Sim(s) => {
                let addr = s.url().trim_start_matches("http://").parse().expect("sim address");
                let body = faults.sim_json();
                let (code, answer) = tokio::task::block_in_place(|| {
                    crate::stack::http_request(addr, "POST", "/sim/faults", Some(&body))
                })
                .expect("POST /sim/faults");
                assert_eq!(code, 200, "POST /sim/faults: {}", String::from_utf8_lossy(&answer));
            }
            TestServer::Real { proxy, .. } => proxy.set_faults(faults),
        }
    }

    /// Ends every open watch stream of the services (they watch again).
    pub fn close_watches(&self) {
        match self {
            TestServer::Sim(s) => s.close_watches(),
            TestServer::Real { proxy, .. } => proxy.close_watches(),
        }
    }

    /// The name of the test's namespace `base` (unique on the shared real server).
    pub fn namespace(&self, base: &str) -> String {
        match self {
            TestServer::Sim(_) => base.to_string(),
            TestServer::Real { suffix, .. } => format!("{base}-{suffix}"),
        }
    }

    /// Creates namespace `ns`; on the real server also waits for its `default`
    /// ServiceAccount, without which the ServiceAccount admission plugin refuses pods.
    pub async fn create_namespace(&self, ns: &str) {
        match self {
            TestServer::Sim(s) => {
                use k8s_openapi::api::core::v1::Namespace;
                let api: kube::Api<Namespace> = kube::Api::all(s.client());
                let obj: Namespace =
                    serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
                api.create(&Default::default(), &obj).await.expect("create namespace");
            }
            TestServer::Real { cluster, .. } => {
                let (info, ns) = (cluster.info().clone(), ns.to_string());
                tokio::task::spawn_blocking(move || info.create_namespace(&ns))
                    .await
                    .expect("create_namespace task")
                    .expect("create namespace");
            }
        }
    }
}

impl TestServer {
    /// The whole kjob stack for this server (see [`crate::stack`]): on kjob-sim a kjob-sim
    /// process of its own, on the real control plane the watcher scoped to `namespace` and every
    /// service on its ServiceAccount through a fault proxy of the stack's own. Creates
    /// `namespace` (on the stack's server) first. Faults go to the stack
    /// ([`crate::Stack::inject`]), not to this server.
    pub async fn start_stack(
        &self,
        namespace: &str,
        mut cfg: crate::stack::StackConfig,
    ) -> anyhow::Result<crate::stack::Stack> {
        cfg.real = self.cluster().map(|info| crate::stack::RealServer {
            fault_proxy: true,
            ..crate::stack::RealServer::from_cluster(info, namespace)
        });
        if self.is_real() {
            self.create_namespace(namespace).await;
        }
        let stack = tokio::task::block_in_place(|| crate::stack::Stack::start(cfg))?;
        if !self.is_real() {
            use k8s_openapi::api::core::v1::Namespace;
            let client = client_for(&stack.kubeconfig).await?;
            let api: kube::Api<Namespace> = kube::Api::all(client);
            let obj: Namespace =
                serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))?;
            api.create(&Default::default(), &obj).await?;
        }
        Ok(stack)
    }
}

const WORKER_KUBECONFIG: &str = "worker.kubeconfig";
const WATCHER_KUBECONFIG: &str = "watcher.kubeconfig";

/// The ServiceAccount kubeconfigs of a control plane and the names of their proxied copies.
fn proxied_kubeconfigs(info: &ClusterInfo) -> [(PathBuf, &'static str); 2] {
    [
        (info.worker_kubeconfig.clone(), WORKER_KUBECONFIG),
        (info.watcher_kubeconfig.clone(), WATCHER_KUBECONFIG),
    ]
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (t.as_millis() as u64 % 1_000_000) * 100 + N.fetch_add(1, Ordering::Relaxed) % 100
}

/// Defines each named `async fn name(server: TestServer)` as two tests, `on_sim::name` (kjob-sim
/// with the given config) and `on_real::name` (the real control plane; skipped with a reason
/// only when no Go toolchain exists).
#[macro_export]
macro_rules! on_both_servers {
    ($sim_config:expr; $($name:ident),* $(,)?) => {
        mod on_sim {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::server::TestServer::sim($sim_config).await).await
                }
            )*
        }
        mod on_real {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(s) = $crate::server::TestServer::real().await {
                        super::$name(s).await
                    }
                }
            )*
        }
    };
}
