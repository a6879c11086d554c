//! Measures what the informer cache costs per pod: builds N realistic Job pods (default
//! 100,000), stores their slim view the way the watcher does, and reports the growth of the
//! process's resident memory.
//!
//! `cargo run --release -p kjob-bench --example cache_memory -- 100000`

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kjob_watcher::cache::{PodInfo, Store};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    pages * 4096
}

fn pod(i: usize) -> Pod {
    let job = format!("job-{:05}", i / 10);
    let uid = format!("6f1c2d3e-0000-4000-8000-{:012}", i / 10);
    let labels = BTreeMap::from([
        (kjob_core::CONTROLLER_UID_LABEL.to_string(), uid.clone()),
        (kjob_core::LEGACY_CONTROLLER_UID_LABEL.to_string(), uid.clone()),
        (kjob_core::JOB_NAME_LABEL.to_string(), job.clone()),
        (kjob_core::LEGACY_JOB_NAME_LABEL.to_string(), job.clone()),
    ]);
    Pod {
        metadata: ObjectMeta {
            namespace: Some("bench".into()),
            name: Some(format!("{job}-{i:05x}")),
            uid: Some(format!("0a1b2c3d-0000-4000-8000-{i:012}")),
            resource_version: Some(format!("{}", 1_000_000 + i)),
            labels: Some(labels),
            finalizers: Some(vec![kjob_core::JOB_TRACKING_FINALIZER.into()]),
            owner_references: Some(vec![OwnerReference {
                api_version: "batch/v1".into(),
                kind: "Job".into(),
                name: job,
                uid,
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let before = rss_bytes();
    let mut store = Store::new();
    for i in 0..n {
        store.upsert(PodInfo::from_pod(&pod(i)));
    }
    let after = rss_bytes();
    let grown = after.saturating_sub(before);
    println!(
        "pods={n} rss_before={before} rss_after={after} grown={grown} bytes_per_pod={}",
        grown / n.max(1) as u64
    );
    assert_eq!(store.pod_count(), n);
}
