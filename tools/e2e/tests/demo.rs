//! Full Job lifecycles through the real binaries: `kjob-demo` starts redis-server, kjob-sim,
//! kjob-queue, kjob-watcher and two kjob-workers as processes, creates every example Job and
//! exits 0 only if each ended as its `kjob.io/demo-expect` annotation says.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kjob_testkit::{bin_path, require_bins};

/// The binaries a demo run starts.
const DEMO_BINS: [&str; 5] = ["kjob-demo", "kjob-sim", "kjob-queue", "kjob-watcher", "kjob-worker"];

/// Whole-run limit handed to the demo: the slowest example (backoff-limit) needs ~15 s of
/// upstream pod-failure backoff; the rest is slack for a loaded 2-core machine.
const DEMO_TIMEOUT: &str = "60s";

#[test]
fn every_example_job_reaches_its_expected_terminal_condition() {
    require_bins(&DEMO_BINS).unwrap_or_else(|e| panic!("cannot run the demo lifecycle test: {e}"));
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
    for name in kjob_demo::examples::DEMO_CASES {
        assert!(
            stdout.lines().any(|l| l.contains(" ok ") && l.contains(name)),
            "{name} not ok:\n{stdout}"
        );
    }
}

/// Kills the demo if the test fails half-way.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How long the demo may take to start its stack and to stop it after Ctrl-C.
const PHASE_TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn ctrl_c_stops_every_process_the_demo_started() {
    require_bins(&DEMO_BINS).unwrap_or_else(|e| panic!("{e}"));
    let examples = tempfile::tempdir().unwrap();
    std::fs::write(
        examples.path().join("forever.yaml"),
        r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: forever
  annotations: {kjob.io/demo-expect: Complete}
spec:
  managedBy: kjob.io/job-controller
  template:
    metadata:
      annotations: {kjob.io/sim-run-time: never}
    spec:
      restartPolicy: Never
      containers: [{name: main, image: busybox}]
"#,
    )
    .unwrap();
    let run_dir = tempfile::tempdir().unwrap();
    let bin_dir = bin_path("kjob-sim").unwrap().parent().unwrap().to_path_buf();
    let mut demo = KillOnDrop(
        Command::new(bin_path("kjob-demo").unwrap())
            .arg("--examples")
            .arg(examples.path())
            .arg("--run-dir")
            .arg(run_dir.path())
            .arg("--bin-dir")
            .arg(&bin_dir)
            .args(["--plain", "--timeout", "300s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Read stdout on a thread so a silent demo cannot hang the test.
    let stdout = demo.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut ports = Vec::new();
    let deadline = Instant::now() + PHASE_TIMEOUT;
    loop {
        let line = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).unwrap();
        for prefix in ["kjob-sim:", "queue:"] {
            if let Some(url) = line.strip_prefix(prefix) {
                let port = url.trim().rsplit(':').next().unwrap().parse::<u16>().unwrap();
                ports.push(SocketAddr::from(([127, 0, 0, 1], port)));
            }
        }
        // The first progress line: the stack is up and the Job exists.
        if line.contains("Jobs finished") {
            break;
        }
    }
    assert_eq!(ports.len(), 2, "sim and queue URLs not printed");
    let pid = demo.0.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    let deadline = Instant::now() + PHASE_TIMEOUT;
    let status = loop {
        if let Some(s) = demo.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "kjob-demo still running {PHASE_TIMEOUT:?} after SIGINT"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(130), "{status}");
    for addr in ports {
        assert!(
            TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err(),
            "{addr} still accepts connections after the demo stopped"
        );
    }
    // Every child had the run folder on its command line (kubeconfig, redis --dir).
    let ps = Command::new("ps").args(["-eo", "pid,args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    let run = run_dir.path().to_string_lossy();
    let left: Vec<&str> = ps.lines().filter(|l| l.contains(run.as_ref())).collect();
    assert!(left.is_empty(), "processes left running: {left:?}");
}
