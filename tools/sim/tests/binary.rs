//! The `kjob-sim` binary: prints its URL first, writes a kubeconfig, serves discovery.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn binary_prints_url_and_writes_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kjob-sim"))
        .args(["--listen", "127.0.0.1:0", "--kubelet", "off", "--kubeconfig-out"])
        .arg(&kc)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let guard = Kill(child);
    let url = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line.trim().to_owned()
    })
    .await
    .unwrap();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let text = std::fs::read_to_string(&kc).unwrap();
    assert!(text.contains(&format!("server: {url}")), "{text}");
    let http =
        reqwest::Client::builder().timeout(std::time::Duration::from_secs(5)).build().unwrap();
    let v: serde_json::Value =
        http.get(format!("{url}/version")).send().await.unwrap().json().await.unwrap();
    assert_eq!(v["major"], "1");
    let ns: serde_json::Value = http
        .get(format!("{url}/api/v1/namespaces/default"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ns["status"]["phase"], "Active");
    drop(guard);
}
