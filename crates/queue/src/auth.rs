//! Who may call what on kjob-queue: the caller's role from its client certificate, the one
//! table of RPC → roles, and the tower layer that checks every call before any service sees it
//! (kjob's two services, server reflection v1 and v1alpha, and grpc.health.v1 alike).
//!
//! The TLS layer has already verified any certificate a caller presented against the kjob CA
//! (`--client-ca-file`); a caller without one still gets a gRPC answer, UNAUTHENTICATED. The
//! role is the leaf certificate's subject common name. See
//! docs/decisions/queue-authentication.md for why mTLS rather than ServiceAccount tokens.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tonic::Status;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::service::{JOB_STATE_SERVICE, QUEUE_SERVICE};

/// A caller's role: the subject CN of its client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// kjob-watcher: enqueues (with observations) and opens its view sessions.
    Watcher,
    /// kjob-worker: leases, finishes, expectations, records, views and event gates.
    Worker,
    /// Read-only inspection (`kjob-queue inspect`, grpcurl): depths, keys, reflection.
    Inspector,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 3] = [Role::Watcher, Role::Worker, Role::Inspector];

    /// The certificate CN (and metric label) of the role.
    pub const fn name(self) -> &'static str {
        match self {
            Role::Watcher => "kjob-watcher",
            Role::Worker => "kjob-worker",
            Role::Inspector => "kjob-inspector",
        }
    }

    /// The role a certificate CN names, if any.
    pub fn from_cn(cn: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == cn)
    }
}

use Role::{Inspector, Watcher, Worker};

/// grpc.health.v1's service name.
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";
/// Server reflection v1's service name.
pub const REFLECTION_V1_SERVICE: &str = "grpc.reflection.v1.ServerReflection";
/// Server reflection v1alpha's service name.
pub const REFLECTION_V1ALPHA_SERVICE: &str = "grpc.reflection.v1alpha.ServerReflection";

/// Every RPC kjob-queue serves, as (service, method, roles allowed), derived from who calls
/// what: the watcher's sender (Add with observations, CacheSession) and its Namespace weights
/// (SetNamespaceWeights), the worker's syncs and
/// lease loop, and `kjob-queue inspect`. Stats is every client's readiness probe
/// (`QueueClient::answers`), so every role has it; health is read-only, so every role has it;
/// reflection maps the API, so only inspection has it. An RPC missing here is refused to all.
pub const RPC_ROLES: &[(&str, &str, &[Role])] = &[
    (QUEUE_SERVICE, "Add", &[Watcher, Worker]),
    (QUEUE_SERVICE, "Lease", &[Worker]),
    (QUEUE_SERVICE, "Renew", &[Worker]),
    (QUEUE_SERVICE, "Done", &[Worker]),
    (QUEUE_SERVICE, "DoneBatch", &[Worker]),
    (QUEUE_SERVICE, "Stats", &[Watcher, Worker, Inspector]),
    (QUEUE_SERVICE, "Inspect", &[Inspector]),
    (QUEUE_SERVICE, "Namespaces", &[Inspector]),
    (JOB_STATE_SERVICE, "SetExpectations", &[Worker]),
    (JOB_STATE_SERVICE, "LowerExpectations", &[Worker]),
    (JOB_STATE_SERVICE, "GetExpectations", &[Worker]),
    (JOB_STATE_SERVICE, "DeleteExpectations", &[Worker]),
    (JOB_STATE_SERVICE, "ExpectFinalizerRemovals", &[Worker]),
    (JOB_STATE_SERVICE, "ForgetFinalizerRemovals", &[Worker]),
    (JOB_STATE_SERVICE, "GetRecord", &[Worker]),
    (JOB_STATE_SERVICE, "PutRecord", &[Worker]),
    (JOB_STATE_SERVICE, "DeleteRecord", &[Worker]),
    (JOB_STATE_SERVICE, "GetJobView", &[Worker]),
    (JOB_STATE_SERVICE, "PutJobView", &[Worker]),
    (JOB_STATE_SERVICE, "CacheSession", &[Watcher]),
    (JOB_STATE_SERVICE, "GateEvents", &[Worker]),
    (JOB_STATE_SERVICE, "TakeApiTokens", &[Worker]),
    (JOB_STATE_SERVICE, "SetNamespaceWeights", &[Watcher]),
    (HEALTH_SERVICE, "Check", &[Watcher, Worker, Inspector]),
    (HEALTH_SERVICE, "Watch", &[Watcher, Worker, Inspector]),
    (REFLECTION_V1_SERVICE, "ServerReflectionInfo", &[Inspector]),
    (REFLECTION_V1ALPHA_SERVICE, "ServerReflectionInfo", &[Inspector]),
];

/// The roles allowed to call `/service/method` (none for a path the table lacks).
pub fn allowed_roles(path: &str) -> &'static [Role] {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return &[];
    };
    RPC_ROLES
        .iter()
        .find(|(s, m, _)| *s == service && *m == method)
        .map_or(&[], |(_, _, roles)| *roles)
}

/// Labels of `kjob_queue_auth_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// `no_certificate`, `unreadable_certificate` (UNAUTHENTICATED), `unknown_role` or
    /// `rpc_not_allowed` (PERMISSION_DENIED).
    pub reason: &'static str,
    /// The caller's role; `none` without a certificate, `unknown` for a CN that names none.
    pub role: &'static str,
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Metric labels.
    pub labels: RefusedLabels,
    /// The status the caller gets.
    pub code: tonic::Code,
    /// Its message.
    pub message: String,
}

impl Refusal {
    fn new(code: tonic::Code, reason: &'static str, role: &'static str, message: String) -> Self {
        Self { labels: RefusedLabels { reason, role }, code, message }
    }
}

/// Decides one call of `path` by a caller whose verified certificate chain (leaf first) is
/// `peer` (`None`: no certificate).
pub fn authorize(path: &str, peer: Option<&[impl AsRef<[u8]>]>) -> Result<Role, Refusal> {
    use tonic::Code::{PermissionDenied, Unauthenticated};
    let Some(leaf) = peer.and_then(|chain| chain.first()) else {
        let m = "kjob-queue requires a client certificate signed by the kjob CA";
        return Err(Refusal::new(Unauthenticated, "no_certificate", "none", m.into()));
    };
    let Some(cn) = subject_cn(leaf.as_ref()) else {
        let m = "the client certificate has no single readable subject CN";
        return Err(Refusal::new(Unauthenticated, "unreadable_certificate", "none", m.into()));
    };
    let Some(role) = Role::from_cn(&cn) else {
        let m = format!(
            "certificate CN {cn:?} is no kjob role (kjob-watcher, kjob-worker, kjob-inspector)"
        );
        return Err(Refusal::new(PermissionDenied, "unknown_role", "unknown", m));
    };
    if !allowed_roles(path).contains(&role) {
        let m = format!("role {} may not call {path}", role.name());
        return Err(Refusal::new(PermissionDenied, "rpc_not_allowed", role.name(), m));
    }
    Ok(role)
}

/// How the gRPC server checks its callers.
#[derive(Clone, Debug)]
enum Mode {
    /// Every call by [`authorize`].
    Roles,
    /// `--insecure-no-auth`: every caller allowed.
    AllowAll,
}

/// The tower layer that authorizes every call of the gRPC server, counting refusals.
#[derive(Clone, Debug)]
pub struct AuthLayer {
    mode: Mode,
    refused: Family<RefusedLabels, Counter>,
}

impl AuthLayer {
    /// Checks every call by role, counting refusals in `refused`.
    pub fn roles(refused: Family<RefusedLabels, Counter>) -> Self {
        Self { mode: Mode::Roles, refused }
    }

    /// Lets every call through (`--insecure-no-auth`).
    pub fn allow_all() -> Self {
        Self { mode: Mode::AllowAll, refused: Family::default() }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth { inner, layer: Arc::new(self.clone()) }
    }
}

/// The service [`AuthLayer`] wraps around the gRPC routes.
#[derive(Clone, Debug)]
pub struct Auth<S> {
    inner: S,
    layer: Arc<AuthLayer>,
}

impl<S, B> tower::Service<http::Request<B>> for Auth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<S::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if let Mode::Roles = self.layer.mode {
            let peer = req
                .extensions()
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(TlsConnectInfo::peer_certs);
            if let Err(r) = authorize(req.uri().path(), peer.as_deref().map(Vec::as_slice)) {
                self.layer.refused.get_or_create(&r.labels).inc();
                tracing::debug!(
                    path = req.uri().path(),
                    reason = r.labels.reason,
                    role = r.labels.role,
                    "call refused"
                );
                return Either::Left(ready(Ok(Status::new(r.code, r.message).into_http())));
            }
        }
        Either::Right(self.inner.call(req))
    }
}

/// The subject common name of a DER certificate: `None` when it is unreadable, has none or
/// has several (ambiguous). The chain was verified by the TLS layer, so this only reads.
pub fn subject_cn(der: &[u8]) -> Option<String> {
    const CN_OID: [u8; 3] = [0x55, 0x04, 0x03];
    let (cert, _) = tlv(der, 0x30)?;
    let (tbs, _) = tlv(cert, 0x30)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = skip(rest)?; // [0] version
    }
    for _ in ["serialNumber", "signature", "issuer", "validity"] {
        rest = skip(rest)?;
    }
    let (mut rdns, _) = tlv(rest, 0x30)?;
    let mut cn = None;
    while !rdns.is_empty() {
        let (mut set, next) = tlv(rdns, 0x31)?;
        rdns = next;
        while !set.is_empty() {
            let (atv, next) = tlv(set, 0x30)?;
            set = next;
            let (oid, value) = tlv(atv, 0x06)?;
            if oid != CN_OID {
                continue;
            }
            // UTF8String, PrintableString or IA5String.
            let tag = *value.first()?;
            if cn.is_some() || !matches!(tag, 0x0c | 0x13 | 0x16) {
                return None;
            }
            cn = Some(std::str::from_utf8(tlv(value, tag)?.0).ok()?.to_string());
        }
    }
    cn
}

/// Splits one DER element of tag `tag` off `input`: (its contents, what follows).
fn tlv(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, rest) = input.split_first()?;
    if t != tag {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let (bytes, rest) = rest.split_at_checked(n)?;
        (bytes.iter().fold(0usize, |a, b| (a << 8) | usize::from(*b)), rest)
    };
    rest.split_at_checked(len)
}

/// What follows the first DER element of `input`, whatever its tag.
fn skip(input: &[u8]) -> Option<&[u8]> {
    tlv(input, *input.first()?).map(|(_, rest)| rest)
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::certs;

    /// Every (service, method) a served proto declares.
    fn declared() -> Vec<(String, String)> {
        let sets: [&[u8]; 4] = [
            kjob_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ];
        let mut out = Vec::new();
        for set in sets {
            let set = prost_types::FileDescriptorSet::decode(set).unwrap();
            for file in set.file {
                for s in &file.service {
                    for m in &s.method {
                        let service = format!("{}.{}", file.package(), s.name());
                        out.push((service, m.name().to_string()));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn every_declared_rpc_is_in_the_table_once_and_nothing_else_is() {
        let declared = declared();
        assert!(declared.len() >= 24, "{declared:?}");
        for (s, m) in &declared {
            let n = RPC_ROLES.iter().filter(|(ts, tm, _)| ts == s && tm == m).count();
            assert_eq!(n, 1, "{s}/{m} appears {n} times in RPC_ROLES");
            assert!(!allowed_roles(&format!("/{s}/{m}")).is_empty(), "{s}/{m}: nobody");
        }
        assert_eq!(RPC_ROLES.len(), declared.len(), "RPC_ROLES names an RPC no proto declares");
        // The metrics table of kjob's own RPCs is the same set.
        let ours: usize = crate::service::RPCS.iter().map(|(_, m)| m.len()).sum();
        assert_eq!(ours, RPC_ROLES.iter().filter(|(s, ..)| s.starts_with("kjob.")).count());
    }

    #[test]
    fn roles_get_only_what_they_use() {
        let can = |role: Role, path: &str| allowed_roles(path).contains(&role);
        let q = |m: &str| format!("/{QUEUE_SERVICE}/{m}");
        let j = |m: &str| format!("/{JOB_STATE_SERVICE}/{m}");
        assert!(can(Watcher, &q("Add")) && can(Watcher, &j("CacheSession")));
        assert!(!can(Watcher, &q("Lease")) && !can(Watcher, &j("PutJobView")));
        assert!(can(Worker, &q("Lease")) && can(Worker, &j("PutJobView")));
        assert!(!can(Worker, &j("CacheSession")) && !can(Worker, &q("Inspect")));
        assert_eq!(allowed_roles(&q("Namespaces")), [Inspector]);
        // The fair lease's weights come from Namespace annotations, which only the watcher reads.
        assert!(can(Watcher, &j("SetNamespaceWeights")));
        assert!(!can(Worker, &j("SetNamespaceWeights")));
        assert!(!can(Inspector, &j("SetNamespaceWeights")));
        for (s, m, roles) in RPC_ROLES {
            let read_only =
                ["Stats", "Inspect", "Namespaces", "Check", "Watch", "ServerReflectionInfo"];
            assert_eq!(roles.contains(&Inspector), read_only.contains(m), "{s}/{m}");
        }
        assert!(allowed_roles("/kjob.queue.v1.Queue/Nope").is_empty());
        assert!(allowed_roles("garbage").is_empty());
    }

    #[test]
    fn reads_the_cn_of_generated_certificates() {
        let ca = certs::Ca::new("test CA").unwrap();
        for role in Role::ALL {
            let leaf = ca.client(role.name()).unwrap();
            assert_eq!(subject_cn(leaf.der()).as_deref(), Some(role.name()));
        }
        let server = ca.server(&["localhost".into(), "127.0.0.1".into()]).unwrap();
        assert_eq!(subject_cn(server.der()).as_deref(), Some("kjob-queue"));
        assert_eq!(subject_cn(b""), None);
        assert_eq!(subject_cn(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }

    #[test]
    fn decisions() {
        let ca = certs::Ca::new("test CA").unwrap();
        let chain = |cn: &str| vec![ca.client(cn).unwrap().der().to_vec()];
        let path = format!("/{QUEUE_SERVICE}/Lease");
        let none: Option<&[Vec<u8>]> = None;
        let e = authorize(&path, none).unwrap_err();
        assert_eq!(
            (e.code, e.labels.reason, e.labels.role),
            (tonic::Code::Unauthenticated, "no_certificate", "none")
        );
        assert_eq!(authorize(&path, Some(&chain("kjob-worker"))), Ok(Worker));
        let e = authorize(&path, Some(&chain("kjob-watcher"))).unwrap_err();
        assert_eq!((e.code, e.labels.reason), (tonic::Code::PermissionDenied, "rpc_not_allowed"));
        assert!(e.message.contains("kjob-watcher") && e.message.contains("Lease"), "{}", e.message);
        let e = authorize(&path, Some(&chain("mallory"))).unwrap_err();
        assert_eq!((e.code, e.labels.role), (tonic::Code::PermissionDenied, "unknown"));
        let e = authorize(&path, Some(&[b"junk".to_vec()])).unwrap_err();
        assert_eq!(e.labels.reason, "unreadable_certificate");
    }
}
