//! The process-level stack: start everything, find and kill the leading watcher, restart the
//! servers on their ports, add and remove workers.

use std::time::Duration;

use kjob_testkit::Program;
use kjob_testkit::redis::redis_server_binary;
use kjob_testkit::stack::{QUEUE, REDIS, missing_binaries};
use kjob_testkit::{Stack, StackConfig, bin_path, wait_for_tcp};

/// Lease timings short enough that a failover fits a test, long enough for a loaded machine.
const WATCHER_ARGS: [&str; 3] =
    ["--lease-duration=3s", "--renew-deadline=2s", "--retry-period=500ms"];

fn addr_of(url: &str) -> std::net::SocketAddr {
    let hostport = url.rsplit("//").next().unwrap();
    hostport.parse().unwrap()
}

#[test]
fn stack_survives_per_process_control() {
    let bin_dir =
        bin_path("kjob-sim").expect("kjob binaries built").parent().unwrap().to_path_buf();
    assert!(missing_binaries(&bin_dir).is_empty(), "run `cargo build --bins` first");
    let run = tempfile::tempdir().unwrap();
    let mut cfg =
        StackConfig::new(bin_dir, redis_server_binary().unwrap(), run.path().to_path_buf(), 2);
    cfg.watchers = 2;
    cfg.extra_args.add(Program::Watcher, WATCHER_ARGS);
    let mut stack = Stack::start(cfg).unwrap();
    assert_eq!(stack.workers(), ["kjob-worker-1", "kjob-worker-2"]);
    assert_eq!(stack.watchers().len(), 2);

    let leader = stack.wait_for_leader(Duration::from_secs(20)).unwrap();
    stack.kill(&leader).unwrap();
    assert!(!stack.watchers().contains(&leader));
    let next = stack.wait_for_leader(Duration::from_secs(20)).unwrap();
    assert_ne!(next, leader, "the surviving watcher takes the Lease");
    stack.restart(&leader).unwrap();
    assert_eq!(stack.starts(&leader), 2);
    assert_eq!(stack.watchers().len(), 2);

    let queue_pid = stack.pid(QUEUE).unwrap();
    stack.restart(QUEUE).unwrap();
    assert_ne!(stack.pid(QUEUE).unwrap(), queue_pid);
    wait_for_tcp(addr_of(&stack.queue_url), Duration::from_secs(5)).unwrap();

    stack.kill(REDIS).unwrap();
    assert!(stack.pid(REDIS).is_none());
    stack.restart(REDIS).unwrap();
    wait_for_tcp(addr_of(&stack.redis_url), Duration::from_secs(5)).unwrap();

    let w3 = stack.add_worker().unwrap();
    assert_eq!(w3, "kjob-worker-3");
    stack.remove_worker("kjob-worker-1", true, Duration::ZERO).unwrap();
    stack.remove_worker("kjob-worker-2", false, Duration::from_secs(10)).unwrap();
    assert_eq!(stack.workers(), [w3]);
    stack.check_alive().unwrap();

    let (status, body) = stack.sim_get("/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("kjob_sim_apiserver_requests"));
    assert!(std::fs::metadata(stack.log_path(QUEUE)).unwrap().len() > 0, "queue logged");
}
