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

/// `--topology single,cluster` runs kjob's rounds on a real 3-master Redis Cluster beside the
/// single server, with the same correctness gates, and reports every master's share of kjob's
/// keys and commands. The shares must show the sharded layout at work: a queue whose keys all
/// shared one hash tag would put every key and nearly every command on one master and fail here.
#[test]
fn bench_smoke_cluster() {
    let out = Command::new(BENCH_BIN)
        .args(["run", "--items", "1200", "--warmup", "50", "--rounds", "2", "--lessees", "4"])
        .args(["--latency-items", "20", "--latency-rate", "100", "--zadd-requests", "2000"])
        .args(["--topology", "single,cluster", "--security", "plain", "--skip-bullmq", "--no-pin"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for want in [
        "kjob, 1 lessee (gRPC service)",
        "kjob, 1 lessee, 3-master cluster",
        "kjob, 4 lessees, 3-master cluster",
        "cluster ÷ single items/s",
        "cluster share targets:",
        "correctness gates passed",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    // `  master 127.0.0.1:P: keys K of T = S % (…), entries E %; commands (name) M % [lo–hi] …`
    let masters: Vec<&str> =
        text.lines().filter(|l| l.starts_with("  master 127.0.0.1:")).collect();
    assert_eq!(masters.len(), 3, "one line per master in\n{text}");
    // The number right after `marker` in each piece of `line` that follows `start`.
    let shares = |line: &str, start: &str, marker: &str| -> Vec<f64> {
        line.split(start)
            .skip(1)
            .map(|piece| {
                let n = piece.split_once(marker).map_or("", |(_, n)| n);
                n.split(' ').next().unwrap().parse::<f64>().unwrap()
            })
            .collect()
    };
    let mut key_total = 0.0;
    for line in &masters {
        let key = shares(line, ": keys ", " = ");
        assert_eq!(key.len(), 1, "{line}");
        // 1,200 keys over 50 namespaces and 24 shards, 8 shards per master: each master holds
        // about a third; a tenth is far below what an even layout gives even at these counts.
        assert!(key[0] >= 10.0, "master holds {} % of the keys: {line}", key[0]);
        key_total += key[0];
        let commands = shares(line, "; commands (", "): ");
        assert_eq!(commands.len(), 2, "a command share per cluster configuration: {line}");
        for c in commands {
            assert!(c >= 10.0, "master serves {c} % of the commands: {line}");
        }
    }
    assert!((key_total - 100.0).abs() < 0.5, "key shares add up to {key_total} %");
}
