//! Service plumbing shared by every kjob binary, written once: the log set-up, the admin HTTP
//! port (`/metrics`, `/livez`, `/readyz`) and its lifecycle, the readiness probe loop, the
//! shutdown tree, the supervision of vital tasks, the retry backoff, the gRPC accept loop and
//! the kube client flags.
//!
//! Libraries never install a subscriber; only binaries call [`init_logging`].

pub mod admin;
pub mod backoff;
pub mod duration;
pub mod incoming;
pub mod kube_client;
pub mod logging;
pub mod shutdown;
pub mod vital;

pub use admin::{AdminArgs, AdminServer, AdminState, admin_router, probe_readiness, serve_admin};
pub use backoff::{Attempts, Backoff};
pub use duration::parse_duration;
pub use incoming::tcp_incoming;
pub use kube_client::KubeClientArgs;
pub use logging::{LogArgs, LogFormat, init_logging};
pub use shutdown::{Shutdown, shutdown_on_signals};
pub use vital::{Vital, VitalFuture, VitalTaskError};
