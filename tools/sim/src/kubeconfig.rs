//! Writing a kubeconfig that points clients at a simulator.

use std::path::Path;

/// The kubeconfig text for a server at `url` (plain HTTP, no credentials, namespace `default`).
pub fn render(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kjob-sim\n  cluster:\n    server: {url}\n\
         contexts:\n- name: kjob-sim\n  context:\n    cluster: kjob-sim\n    user: kjob-sim\n    namespace: default\n\
         current-context: kjob-sim\nusers:\n- name: kjob-sim\n  user: {{}}\npreferences: {{}}\n"
    )
}

/// Writes the kubeconfig for `url` to `path` (atomically: temp file, then rename).
pub fn write(path: &Path, url: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, render(url))?;
    std::fs::rename(tmp, path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn kubeconfig_parses_as_yaml_with_the_server() {
        let v: serde_json::Value =
            serde_yaml::from_str(&super::render("http://127.0.0.1:1")).unwrap();
        assert_eq!(v["clusters"][0]["cluster"]["server"], "http://127.0.0.1:1");
        assert_eq!(v["current-context"], "kjob-sim");
    }
}
