//! The one rule for a process's default identity (Lease holder, lease worker id, logs).

use rand::Rng;

/// `<hostname>_<pid>`: the hostname is the pod name in a Deployment, and the process id keeps
/// two processes on one host apart (two watchers sharing an identity would both think they
/// lead). Without a hostname, `<service>-<random>` stands in for it. Flags (`POD_NAME`) win
/// over this; it is only the default.
pub fn default_identity(service: &str) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("{service}-{:08x}", rand::rng().random::<u32>()));
    format!("{host}_{}", std::process::id())
}

/// `identity` when given and not empty, else [`default_identity`].
pub fn identity_or_default(identity: Option<String>, service: &str) -> String {
    identity.filter(|s| !s.is_empty()).unwrap_or_else(|| default_identity(service))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_identity_is_per_process() {
        let id = default_identity("kjob-test");
        let (host, pid) = id.rsplit_once('_').unwrap();
        assert!(!host.is_empty(), "{id}");
        assert_eq!(pid, std::process::id().to_string());
        assert_eq!(identity_or_default(Some("pod-1".into()), "kjob-test"), "pod-1");
        assert_eq!(
            identity_or_default(Some(String::new()), "kjob-test").rsplit_once('_'),
            Some((host, pid))
        );
    }
}
