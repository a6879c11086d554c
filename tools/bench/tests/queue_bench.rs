//! `kjob-queue-bench run` end to end, with tiny counts (the numbers themselves are for
//! `--release`, via `make bench-queue`).

use std::process::Command;

const BENCH_BIN: &str = env!("CARGO_BIN_EXE_kjob-queue-bench");

/// The benchmark runs end to end (tiny counts; the numbers themselves are for `--release`).
#[test]
fn bench_smoke() {
    let out = Command::new(BENCH_BIN)
        .args(["run", "--items", "300", "--warmup", "50", "--rounds", "1", "--lessees", "4"])
        .args(["--latency-items", "20", "--latency-rate", "100", "--zadd-requests", "2000"])
        // The BullMQ peer needs npm packages, which tests never install; `make bench-queue`
        // runs it.
        .args(["--skip-bullmq", "--no-pin"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for want in [
        "items/s",
        "Redis cmds/item",
        "Redis CPU µs/item",
        "kjob, 1 lessee",
        "kjob, 4 lessees",
        "1 waiting lessee",
        "4 waiting lessee",
        "p99",
        "correctness gates passed",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
}
