//! `kjob-sim-bench --scenario loaded` runs end to end against the real `kjob-sim` binary on a
//! small store and reports a positive rate for every request of the mix on both stores.

use std::process::Command;

#[test]
fn loaded_scenario_reports_every_rate() {
    let out = Command::new(env!("CARGO_BIN_EXE_kjob-sim-bench"))
        .args(["--scenario", "loaded", "--loaded-jobs", "40", "--pods-per-job", "2"])
        .args(["--namespaces", "2", "--clients", "2", "--seconds", "300ms", "--sim"])
        .arg(env!("CARGO_BIN_EXE_kjob-sim"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("filled 40 Jobs + 80 pods"), "{stdout}");
    for row in ["GET pod", "LIST pods by controller-uid", "PATCH pod status", "POST pod"] {
        let line =
            stdout.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("{stdout}"));
        // Columns after the name: empty/s, loaded/s, ratio.
        let nums: Vec<f64> = line[44..].split_whitespace().filter_map(|n| n.parse().ok()).collect();
        assert_eq!(nums.len(), 3, "{line}");
        assert!(nums[0] > 0.0 && nums[1] > 0.0, "{line}");
    }
}
