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
    /// Builds a client from the flags.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
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
        Ok(kube::Client::try_from(config)?)
    }
}
