//! Test harness: real `redis-server` processes and kjob binaries on free loopback ports.
//!
//! Every helper owns its child process and kills it on drop, so a failing test never leaves a
//! server behind, and every test gets its own ports so tests run in parallel.

pub mod addons;
pub mod args;
pub mod cluster;
pub mod faults;
pub mod pki;
pub mod process;
pub mod proxy;
pub mod raw;
pub mod redis;
pub mod redis_cluster;
pub mod server;
pub mod stack;

pub use args::{ExtraArgs, Program};
pub use pki::TestPki;
pub use process::{ChildGuard, bin_path, free_port, require_bins, wait_for_tcp, workspace_root};
pub use redis::{RedisSecurity, RedisServer};
pub use redis_cluster::{RedisCluster, TestRedis};
pub use stack::{Stack, StackConfig};
