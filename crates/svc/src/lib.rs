//! Service plumbing shared by every kjob binary: the log set-up, the admin HTTP port
//! (`/metrics`, `/livez`, `/readyz`), the shutdown tree and the kube client flags.
//!
//! Libraries never install a subscriber; only binaries call [`init_logging`].

pub mod admin;
pub mod duration;
pub mod kube_client;
pub mod logging;
pub mod shutdown;

pub use admin::{AdminArgs, AdminState, admin_router, serve_admin};
pub use duration::parse_duration;
pub use kube_client::KubeClientArgs;
pub use logging::{LogArgs, LogFormat, init_logging};
pub use shutdown::{Shutdown, shutdown_on_signals};
