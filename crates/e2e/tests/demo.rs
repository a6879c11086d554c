//! Full Job lifecycles through the real binaries: `kjob-demo` starts redis-server, kjob-sim,
//! kjob-queue, kjob-watcher and two kjob-workers as processes, creates every example Job and
//! exits 0 only if each ended as its `kjob.io/demo-expect` annotation says.

use std::process::Command;

use kjob_testkit::bin_path;

/// Whole-run limit handed to the demo: the slowest example (backoff-limit) needs ~15 s of
/// upstream pod-failure backoff; the rest is slack for a loaded 2-core machine.
const DEMO_TIMEOUT: &str = "60s";

#[test]
fn every_example_job_reaches_its_expected_terminal_condition() {
    let bins = ["kjob-demo", "kjob-sim", "kjob-queue", "kjob-watcher", "kjob-worker"];
    let missing: Vec<&str> = bins.into_iter().filter(|b| bin_path(b).is_err()).collect();
    assert!(
        missing.is_empty(),
        "cannot run the demo lifecycle test: binaries not built: {} (run `cargo build --bins`)",
        missing.join(", ")
    );
    let demo = bin_path("kjob-demo").unwrap();
    let bin_dir = bin_path("kjob-sim").unwrap().parent().unwrap().to_path_buf();
    let run_dir = tempfile::tempdir().unwrap();
    let out = Command::new(&demo)
        .arg("--examples")
        .arg(kjob_e2e::root().join("examples"))
        .arg("--run-dir")
        .arg(run_dir.path())
        .arg("--bin-dir")
        .arg(&bin_dir)
        .args(["--plain", "--timeout", DEMO_TIMEOUT])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let mut logs = String::new();
        if let Ok(dir) = std::fs::read_dir(run_dir.path().join("logs")) {
            for f in dir.flatten() {
                let text = std::fs::read_to_string(f.path()).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                logs.push_str(&format!("\n--- {} (tail)\n{}", f.path().display(), tail.join("\n")));
            }
        }
        panic!(
            "kjob-demo exited {}\nstdout:\n{stdout}\nstderr:\n{}{logs}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(stdout.contains("every Job ended as expected"), "{stdout}");
    for name in [
        "plain",
        "indexed",
        "work-queue",
        "pod-failure-policy",
        "backoff-limit",
        "suspended",
        "active-deadline",
    ] {
        assert!(
            stdout.lines().any(|l| l.contains(" ok ") && l.contains(name)),
            "{name} not ok:\n{stdout}"
        );
    }
}
