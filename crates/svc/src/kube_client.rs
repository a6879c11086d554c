//! Kube client flags: kubeconfig found the usual way (KUBECONFIG, ~/.kube/config, in-cluster).

/// Kube client flags shared by the watcher and the worker.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeClientArgs {
    /// Path to a kubeconfig; unset = KUBECONFIG, then ~/.kube/config, then in-cluster config.
    #[arg(long, env = "KJOB_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Connect and write timeout of API requests, in seconds. Reads keep kube's default (longer
    /// than the server's watch timeout) so watches are not cut.
    #[arg(long, env = "KJOB_KUBE_TIMEOUT_SECONDS", default_value_t = 30)]
    pub kube_timeout_seconds: u64,
}

impl KubeClientArgs {
    /// The kube configuration [`KubeClientArgs::client`] builds its client from, for callers
    /// that adjust it first (e.g. switch kube's retry layer off).
    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        let mut config = match &self.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)?;
                kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
            }
            None => kube::Config::infer().await?,
        };
        let timeout = std::time::Duration::from_secs(self.kube_timeout_seconds);
        config.write_timeout = Some(timeout);
        config.connect_timeout = Some(timeout);
        Ok(config)
    }

    /// Builds a client from the flags.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        Ok(kube::Client::try_from(self.config().await?)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = r#"
apiVersion: v1
kind: Config
clusters:
- name: sim
  cluster: {server: "http://127.0.0.1:40123"}
users:
- name: sim
  user: {token: "t"}
contexts:
- name: sim
  context: {cluster: sim, user: sim, namespace: work}
current-context: sim
"#;

    #[tokio::test]
    async fn config_reads_the_kubeconfig_and_sets_the_timeouts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, KUBECONFIG).unwrap();
        let args = KubeClientArgs { kubeconfig: Some(path), kube_timeout_seconds: 7 };
        let config = args.config().await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:40123/");
        assert_eq!(config.default_namespace, "work");
        let seven = Some(std::time::Duration::from_secs(7));
        assert_eq!((config.connect_timeout, config.write_timeout), (seven, seven));
        assert!(config.default_retry, "kube's retry layer stays on unless a caller turns it off");
        args.client().await.unwrap();
    }

    #[tokio::test]
    async fn config_reports_a_missing_kubeconfig() {
        let args = KubeClientArgs {
            kubeconfig: Some("/nonexistent/kjob-kubeconfig".into()),
            kube_timeout_seconds: 30,
        };
        assert!(args.config().await.is_err());
    }
}
