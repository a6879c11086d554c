//! Service plumbing shared by every kjob binary, written once: the body of `main` ([`main`]),
//! listener binding, the log set-up, the admin HTTP port (`/metrics`, `/livez`, `/readyz`) and
//! its lifecycle, the readiness probe loop, the shutdown tree, the supervision of vital tasks,
//! the retry backoff, the gRPC accept loop, the kube client flags and the default identity.
//!
//! Libraries never install a subscriber; only binaries call [`init_logging`].

pub mod admin;
pub mod backoff;
pub mod binary;
pub mod duration;
pub mod identity;
pub mod incoming;
pub mod kube_client;
pub mod logging;
pub mod metrics;
pub mod shutdown;
pub mod view_key;
pub mod vital;

/// Every kjob binary allocates with mimalloc: the services allocate and free many small
/// buffers per request (protobuf messages, Redis arguments and replies), where glibc's malloc
/// took about a fifth of kjob-queue's CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub use admin::{
    AdminArgs, AdminListeners, AdminServer, AdminState, admin_router, probe_readiness, serve_admin,
    with_admin, with_admin_routes,
};
pub use backoff::{Attempts, Backoff};
pub use binary::{RuntimeArgs, Threads, bind, main};
pub use duration::parse_duration;
pub use identity::{default_identity, identity_or_default};
pub use incoming::tcp_incoming;
pub use kube_client::KubeClientArgs;
pub use logging::{LogArgs, LogFormat, init_logging};
pub use shutdown::{Shutdown, shutdown_on_signals};
pub use view_key::ViewKeyArgs;
pub use vital::{Vital, VitalFuture, VitalTaskError};
