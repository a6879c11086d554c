//! Container image references, read the way admission defaults `imagePullPolicy` and the kubelet
//! reports `image`.

/// What an image reference pins its version with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin<'a> {
    /// A digest (`busybox@sha256:…`).
    Digest,
    /// A tag (`busybox:1.36`).
    Tag(&'a str),
    /// Nothing (`busybox`): the runtime pulls `latest`.
    Untagged,
}

/// What `image` pins; a registry port (`localhost:5000/busybox`) is not a tag.
pub fn pin(image: &str) -> Pin<'_> {
    if image.contains('@') {
        return Pin::Digest;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, tag)) => Pin::Tag(tag),
        None => Pin::Untagged,
    }
}

/// `imagePullPolicy` default: `Always` for `:latest` or untagged images, else `IfNotPresent`
/// (digest references count as tagged).
pub fn default_pull_policy(image: &str) -> &'static str {
    match pin(image) {
        Pin::Tag("latest") | Pin::Untagged => "Always",
        Pin::Tag(_) | Pin::Digest => "IfNotPresent",
    }
}

/// Fully qualified image reference, as the kubelet reports it (`docker.io/library/x:latest`).
pub fn qualified_image(image: &str) -> String {
    let name =
        if pin(image) == Pin::Untagged { format!("{image}:latest") } else { image.to_string() };
    let first = name.split('/').next().unwrap_or_default();
    let has_registry =
        name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if has_registry {
        name
    } else if name.contains('/') {
        format!("docker.io/{name}")
    } else {
        format!("docker.io/library/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policies_and_qualified_names() {
        let cases = [
            ("busybox", "Always", "docker.io/library/busybox:latest"),
            ("busybox:latest", "Always", "docker.io/library/busybox:latest"),
            ("busybox:1.36", "IfNotPresent", "docker.io/library/busybox:1.36"),
            ("localhost:5000/busybox", "Always", "localhost:5000/busybox:latest"),
            ("localhost:5000/busybox:1", "IfNotPresent", "localhost:5000/busybox:1"),
            ("busybox@sha256:abc", "IfNotPresent", "docker.io/library/busybox@sha256:abc"),
            ("perl:5.34", "IfNotPresent", "docker.io/library/perl:5.34"),
            ("bitnami/redis:7", "IfNotPresent", "docker.io/bitnami/redis:7"),
            ("registry.k8s.io/pause:3.10", "IfNotPresent", "registry.k8s.io/pause:3.10"),
        ];
        for (image, policy, qualified) in cases {
            assert_eq!(default_pull_policy(image), policy, "{image}");
            assert_eq!(qualified_image(image), qualified, "{image}");
        }
    }
}
