//! Redis connections: one URL syntax for a single server and for a Cluster, a shared
//! multiplexed connection for scripts, and dedicated connections for blocking pops.
//!
//! URL forms:
//! * `redis://[user:password@]host:port[/db]` — a single server; `rediss://` for TLS.
//! * `redis+cluster://[user:password@]host:port,host:port,…` — a Redis Cluster, given by one or
//!   more seed nodes; `rediss+cluster://` for TLS. The credentials and the TLS settings apply to
//!   every node, the seeds and those the cluster names later.
//!
//! Credentials may instead come from [`RedisOptions`] (a Secret mounted as a file or put in the
//! environment), which override those of the URL. A URL is printed only through [`redact`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisFuture, Value,
};

use crate::WqError;

/// Connecting to a Redis node must not hang longer than this.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest a single command or script may take before we call Redis unavailable; scripts are
/// bounded, so a healthy server answers in milliseconds.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a redacted password reads as.
const REDACTED: &str = "***";

/// `url` with its password replaced by `***` (`rediss://kjob:***@host:port`), for logs, errors
/// and help texts. Works on any text shaped like a URL, valid or not, so a URL that fails to
/// parse is redacted too.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // Userinfo ends at the last `@` (a host never holds one; an unencoded password might).
    let Some((userinfo, hosts)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    let user = match userinfo.split_once(':') {
        Some((user, _password)) => format!("{user}:{REDACTED}"),
        // `redis://user@host`: a username alone is no secret.
        None => userinfo.to_string(),
    };
    format!("{scheme}://{user}@{hosts}")
}

/// PEM files for TLS to Redis (`rediss://`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// CA bundle that verifies the server's certificate; `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain, for Redis servers that ask for one (`tls-auth-clients yes`).
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key.
    pub key_file: Option<PathBuf>,
}

impl RedisTls {
    fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Reads the files into the redis crate's form.
    fn load(&self) -> Result<redis::TlsCertificates, WqError> {
        let read = |what: &str, p: &PathBuf| {
            std::fs::read(p).map_err(|e| {
                WqError::Config(format!("reading the Redis TLS {what} {}: {e}", p.display()))
            })
        };
        let client_tls = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read("client certificate", cert)?,
                client_key: read("client key", key)?,
            }),
            (None, None) => None,
            _ => {
                return Err(WqError::Config(
                    "a Redis TLS client certificate needs both its certificate and its key file"
                        .into(),
                ));
            }
        };
        let root_cert = self.ca_file.as_ref().map(|p| read("CA file", p)).transpose()?;
        Ok(redis::TlsCertificates { client_tls, root_cert })
    }
}

/// How to authenticate to Redis and encrypt the connection, beyond what the URL says.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisOptions {
    /// ACL username; overrides the URL's.
    pub username: Option<String>,
    /// Password; overrides the URL's. Never printed.
    pub password: Option<String>,
    /// TLS files (with a `rediss://` URL).
    pub tls: RedisTls,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| REDACTED))
            .field("tls", &self.tls)
            .finish()
    }
}

/// Where Redis is and how to reach it: the nodes (with credentials and TLS mode) of a single
/// server or a Cluster's seeds, and the TLS certificates. Printing it shows the URL redacted.
#[derive(Clone)]
pub struct RedisTarget {
    url: String,
    cluster: bool,
    nodes: Vec<ConnectionInfo>,
    certs: Option<redis::TlsCertificates>,
    /// Commands that failed for a broken or refused connection, on any connection made from
    /// this target or its clones (see [`RedisTarget::connection_breaks`]).
    breaks: Arc<AtomicU64>,
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RedisTarget").field(&self.redacted()).finish()
    }
}

impl std::fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl RedisTarget {
    /// Parses `redis[s]://…` or `redis[s]+cluster://h:p,h:p`, with no options beyond the URL.
    pub fn parse(url: &str) -> Result<Self, WqError> {
        Self::new(url, &RedisOptions::default())
    }

    /// Parses `url` (see the module docs) and applies `options`.
    pub fn new(url: &str, options: &RedisOptions) -> Result<Self, WqError> {
        let shown = redact(url);
        let (cluster, node_urls) = if let Some((scheme, rest)) = url
            .strip_prefix("redis+cluster://")
            .map(|r| ("redis", r))
            .or_else(|| url.strip_prefix("rediss+cluster://").map(|r| ("rediss", r)))
        {
            let (userinfo, hosts) = match rest.rsplit_once('@') {
                Some((u, h)) => (format!("{u}@"), h),
                None => (String::new(), rest),
            };
            let nodes: Vec<String> = hosts
                .trim_end_matches('/')
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|hp| format!("{scheme}://{userinfo}{hp}"))
                .collect();
            if nodes.is_empty() {
                return Err(WqError::Config(format!("{shown:?}: no cluster nodes given")));
            }
            (true, nodes)
        } else if url.starts_with("redis://") || url.starts_with("rediss://") {
            (false, vec![url.to_string()])
        } else {
            return Err(WqError::Config(format!(
                "{shown:?}: expected redis[s]://host:port or redis[s]+cluster://host:port,host:port"
            )));
        };
        let mut nodes = Vec::with_capacity(node_urls.len());
        for n in &node_urls {
            let mut info = n.as_str().into_connection_info().map_err(|e| {
                WqError::Config(format!("{shown:?}: bad redis node {:?}: {e}", redact(n)))
            })?;
            if options.username.is_some() {
                info.redis.username.clone_from(&options.username);
            }
            if options.password.is_some() {
                info.redis.password.clone_from(&options.password);
            }
            nodes.push(info);
        }
        let tls = matches!(nodes[0].addr, ConnectionAddr::TcpTls { .. });
        let certs = if options.tls.is_empty() {
            None
        } else if tls {
            Some(options.tls.load()?)
        } else {
            return Err(WqError::Config(format!(
                "{shown:?}: Redis TLS files are given but the URL is not rediss:// \
                 (or rediss+cluster://)"
            )));
        };
        Ok(Self { url: url.to_string(), cluster, nodes, certs, breaks: Arc::default() })
    }

    /// The URL as given, which may hold a password: connect with it, never print it (print
    /// the target itself, or [`redact`] the URL).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted(&self) -> String {
        redact(&self.url)
    }

    /// How many commands, on every connection made from this target (and its clones), failed
    /// because the connection broke or was refused. A Redis that restarted or failed over
    /// breaks every connection to it, so this moving tells the data-loss fence
    /// ([`crate::epoch`]) to look before the next lease.
    pub fn connection_breaks(&self) -> u64 {
        self.breaks.load(Ordering::SeqCst)
    }

    /// The shared counter behind [`Self::connection_breaks`].
    pub(crate) fn breaks_counter(&self) -> Arc<AtomicU64> {
        self.breaks.clone()
    }

    /// Whether it names a Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// Whether connections use TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self.nodes[0].addr, ConnectionAddr::TcpTls { .. })
    }

    /// `host:port` of each node named by the target (seed nodes for a Cluster).
    pub fn node_addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.to_string()).collect()
    }

    /// A client of `node` (its credentials and TLS included).
    fn client(&self, node: &ConnectionInfo) -> Result<redis::Client, WqError> {
        Ok(match &self.certs {
            Some(certs) => redis::Client::build_with_tls(node.clone(), certs.clone())?,
            None => redis::Client::open(node.clone())?,
        })
    }

    /// A multiplexed connection to each node named by the target, with its `host:port`.
    pub async fn node_connections(
        &self,
    ) -> Result<Vec<(String, redis::aio::MultiplexedConnection)>, WqError> {
        let mut out = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let addr = node.addr.to_string();
            let client = self.client(node)?;
            let c =
                tokio::time::timeout(CONNECT_TIMEOUT, client.get_multiplexed_async_connection())
                    .await
                    .map_err(|_| WqError::Unavailable(format!("connecting to {addr} timed out")))?
                    .map_err(|e| connect_error(&addr, e))?;
            out.push((addr, c));
        }
        Ok(out)
    }
}

/// A failed connection to `addr`. An untrusted certificate or refused credentials are
/// configuration errors that say what to fix (retrying would not help); anything else is the
/// Redis error as it is (unavailable when the server is down).
fn connect_error(addr: &str, e: redis::RedisError) -> WqError {
    let text = e.to_string();
    if text.contains("certificate") || text.contains("UnknownIssuer") {
        return WqError::Config(format!(
            "connecting to {addr}: {text} (TLS: the server's certificate is not trusted by the \
             CA of --redis-ca-file, or does not name {addr}'s host)"
        ));
    }
    if matches!(e.kind(), redis::ErrorKind::AuthenticationFailed)
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
        || text.contains("NOPERM")
    {
        return WqError::Config(format!(
            "connecting to {addr}: {text} (authentication: check the Redis username and \
             password, and that the user has kjob's ACL: `kjob-queue redis-acl`)"
        ));
    }
    WqError::from(e)
}

/// A Redis connection that runs commands and scripts on a single server or a Cluster, and
/// counts the commands that failed on a broken connection into its target's
/// [`RedisTarget::connection_breaks`].
#[derive(Clone)]
pub struct Conn {
    link: Link,
    breaks: Arc<AtomicU64>,
}

#[derive(Clone)]
enum Link {
    /// Reconnecting multiplexed connection to one server.
    Single(ConnectionManager),
    /// Cluster connection (routes by key slot); boxed, it is much the larger.
    Cluster(Box<ClusterLink>),
}

/// Least time between two rebuilds of a cluster connection: a failover takes longer, and a
/// rebuild made while it is still under way is made again once it has ended.
const CLUSTER_REBUILD_PAUSE: Duration = Duration::from_secs(1);

/// Pause before a cluster command that certainly did not run (MOVED, TRYAGAIN, CLUSTERDOWN, a
/// refused connection) is sent again: long enough for the slot map refresh that the answer
/// started, short against a failover's election (~1-2 s with a 1 s node timeout).
const CLUSTER_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Longest a cluster command keeps being sent again while it certainly did not run: the
/// callers' own bound on one command, so a failover under way looks like a slow command, and
/// one that does not end in time is reported unavailable as before.
const CLUSTER_RETRY_WINDOW: Duration = RESPONSE_TIMEOUT;

/// A cluster connection that is rebuilt (a fresh slot map from the seeds) when a command got no
/// reply in time. Why: the redis crate's cluster driver (0.32) can wedge during a failover — a
/// request that followed a redirect to a newly promoted node waits for the connection map's
/// write lock while the driver, which no longer polls that request, refreshes the slot map
/// behind the same lock — and then answers nothing until it is replaced. The client is built
/// with no retries of its own, which avoids that path (see [`connect`]); the rebuild remains
/// the backstop.
#[derive(Clone)]
struct ClusterLink {
    client: ClusterClient,
    conn: Arc<std::sync::RwLock<ClusterConnection>>,
    /// When the connection was last rebuilt (or made).
    rebuilt: Arc<tokio::sync::Mutex<tokio::time::Instant>>,
}

impl ClusterLink {
    fn current(&self) -> ClusterConnection {
        self.conn.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Rebuilds the connection in a task of its own (a caller's timeout cannot cancel it half
    /// way), unless it was rebuilt within [`CLUSTER_REBUILD_PAUSE`] or is being rebuilt now.
    fn rebuild_soon(&self) {
        let link = self.clone();
        tokio::spawn(async move { link.rebuild().await });
    }

    async fn rebuild(&self) {
        let Ok(mut last) = self.rebuilt.try_lock() else { return };
        if last.elapsed() < CLUSTER_REBUILD_PAUSE {
            return;
        }
        *last = tokio::time::Instant::now();
        match tokio::time::timeout(CONNECT_TIMEOUT * 2, self.client.get_async_connection()).await {
            Ok(Ok(fresh)) => {
                *self.conn.write().unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
                tracing::info!("cluster connection rebuilt after a command got no reply");
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "rebuilding the cluster connection failed"),
            Err(_) => tracing::debug!("rebuilding the cluster connection timed out"),
        }
    }

    /// Runs `send` on the current connection, sending it again while the answer says it
    /// certainly did not run ([`not_run`]), within [`CLUSTER_RETRY_WINDOW`]. A command that may
    /// have run (its connection broke after it was sent) is never sent again here: a script
    /// applied on the old master and replicated would be applied twice.
    async fn send<T, F, Fut>(&self, send: F) -> redis::RedisResult<T>
    where
        F: Fn(ClusterConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let deadline = tokio::time::Instant::now() + CLUSTER_RETRY_WINDOW;
        loop {
            let r = send(self.current()).await;
            match &r {
                Err(e)
                    if not_run(e)
                        && tokio::time::Instant::now() + CLUSTER_RETRY_PAUSE < deadline =>
                {
                    tokio::time::sleep(CLUSTER_RETRY_PAUSE).await;
                }
                _ => return r,
            }
        }
    }
}

/// Whether a cluster command's error says it was not run anywhere: a redirection (the cluster
/// client follows none itself, see [`connect`]), a slot without a live master yet, or no
/// connection made at all.
fn not_run(e: &redis::RedisError) -> bool {
    use redis::ErrorKind as K;
    matches!(
        e.kind(),
        K::Moved | K::TryAgain | K::ClusterDown | K::MasterDown | K::ClusterConnectionNotFound
    ) || e.is_connection_refusal()
}

/// Whether `e` says the connection broke (or was refused, or stopped answering) rather than
/// that Redis answered with an error.
fn is_break(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

/// `fut`, counting into `breaks` when it fails on a broken connection.
fn counted<'a, T: Send + 'a>(
    breaks: Arc<AtomicU64>,
    fut: RedisFuture<'a, T>,
) -> RedisFuture<'a, T> {
    Box::pin(async move {
        let r = fut.await;
        if let Err(e) = &r
            && is_break(e)
        {
            breaks.fetch_add(1, Ordering::SeqCst);
        }
        r
    })
}

impl Conn {
    /// A command got no reply in time (its caller gave up on it): counted as a break, and a
    /// cluster connection is rebuilt in the background, since a wedged cluster driver answers
    /// nothing until it is replaced.
    pub fn stalled(&self) {
        self.breaks.fetch_add(1, Ordering::SeqCst);
        if let Link::Cluster(link) = &self.link {
            link.rebuild_soon();
        }
    }
}

impl Conn {
    /// A command of a background check is slow to answer: a cluster connection is rebuilt in
    /// the background (nothing is counted as a break; on a single server nothing happens). A
    /// wedged cluster driver is thus replaced within [`crate::epoch::STALLED_AFTER`] of the
    /// fence's next check, not after a caller's whole [`RESPONSE_TIMEOUT`].
    pub(crate) fn nudge(&self) {
        if let Link::Cluster(link) = &self.link {
            link.rebuild_soon();
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let fut = match &mut self.link {
            Link::Single(c) => c.req_packed_command(cmd),
            Link::Cluster(link) => {
                let link = link.clone();
                Box::pin(async move {
                    let r = link.send(|mut c| async move { c.req_packed_command(cmd).await }).await;
                    if let Err(e) = &r
                        && e.is_timeout()
                    {
                        link.rebuild_soon();
                    }
                    r
                })
            }
        };
        counted(self.breaks.clone(), fut)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let fut = match &mut self.link {
            Link::Single(c) => c.req_packed_commands(cmd, offset, count),
            Link::Cluster(link) => {
                let link = link.clone();
                Box::pin(async move {
                    let r = link
                        .send(
                            |mut c| async move { c.req_packed_commands(cmd, offset, count).await },
                        )
                        .await;
                    if let Err(e) = &r
                        && e.is_timeout()
                    {
                        link.rebuild_soon();
                    }
                    r
                })
            }
        };
        counted(self.breaks.clone(), fut)
    }

    fn get_db(&self) -> i64 {
        match &self.link {
            Link::Single(c) => c.get_db(),
            Link::Cluster(link) => link.current().get_db(),
        }
    }
}

/// Opens a connection to `target`. `response_timeout` bounds each command (blocking pops need
/// more than their own timeout).
pub async fn connect(target: &RedisTarget, response_timeout: Duration) -> Result<Conn, WqError> {
    if !target.cluster {
        let node = &target.nodes[0];
        let addr = node.addr.to_string();
        let client = target.client(node)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(CONNECT_TIMEOUT)
            .set_response_timeout(response_timeout)
            // Reconnect attempts happen on later commands; keep each one short so a dead
            // Redis turns into UNAVAILABLE quickly instead of a long stall.
            .set_number_of_retries(1)
            .set_max_delay(500);
        let conn = tokio::time::timeout(
            CONNECT_TIMEOUT + Duration::from_secs(1),
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| WqError::Unavailable(format!("connecting to {addr} timed out")))?
        .map_err(|e| connect_error(&addr, e))?;
        return Ok(Conn { link: Link::Single(conn), breaks: target.breaks.clone() });
    }
    // The seeds' credentials and TLS mode become the cluster's, for every node it names.
    // No retries inside the cluster client: it would send again a script whose connection
    // broke after it was sent (applied twice if the old master had replicated it), and
    // following a MOVED to a newly promoted master is the path on which its driver can wedge
    // (see [`ClusterLink`]). [`ClusterLink::send`] sends again what certainly did not run.
    let mut builder = ClusterClientBuilder::new(target.nodes.clone())
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(response_timeout)
        .retries(0);
    if let Some(certs) = &target.certs {
        builder = builder.certs(certs.clone());
    }
    let client = builder.build()?;
    let conn = tokio::time::timeout(CONNECT_TIMEOUT * 2, client.get_async_connection())
        .await
        .map_err(|_| WqError::Unavailable("connecting to the cluster timed out".into()))?
        .map_err(|e| connect_error("the cluster", e))?;
    let link = ClusterLink {
        client,
        conn: Arc::new(std::sync::RwLock::new(conn)),
        rebuilt: Arc::new(tokio::sync::Mutex::new(tokio::time::Instant::now())),
    };
    Ok(Conn { link: Link::Cluster(Box::new(link)), breaks: target.breaks.clone() })
}

/// Refuses to run on a Redis that may evict keys: an evicted lease or dirty mark would lose or
/// duplicate work silently. Checks every node named by the target that answers. A Cluster's
/// seed that does not answer is skipped (a node may be down while its replica serves: that must
/// not keep kjob-queue from starting), as long as one seed answers; a single server must answer.
pub async fn check_noeviction(target: &RedisTarget) -> Result<(), WqError> {
    let mut checked = 0;
    let mut unreachable = None;
    for node in &target.nodes {
        let addr = node.addr.to_string();
        let policy = match node_policy(target, node, &addr).await {
            Ok(p) => p,
            Err(e) if target.cluster && e.is_unavailable() => {
                tracing::warn!(node = addr, error = %e, "cluster seed not answering; skipped");
                unreachable = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        if policy != "noeviction" {
            return Err(WqError::Config(format!(
                "redis {addr} has maxmemory-policy {policy:?}; kjob-queue needs \"noeviction\" \
                 (an evicted key would silently lose or duplicate work): set \
                 `maxmemory-policy noeviction` in redis.conf or with CONFIG SET"
            )));
        }
        checked += 1;
    }
    match unreachable {
        Some(e) if checked == 0 => Err(e),
        _ => Ok(()),
    }
}

/// `node`'s `maxmemory-policy`.
async fn node_policy(
    target: &RedisTarget,
    node: &ConnectionInfo,
    addr: &str,
) -> Result<String, WqError> {
    let client = target.client(node)?;
    let mut c = tokio::time::timeout(CONNECT_TIMEOUT, client.get_multiplexed_async_connection())
        .await
        .map_err(|_| WqError::Unavailable(format!("connecting to {addr} timed out")))?
        .map_err(|e| connect_error(addr, e))?;
    let res: Vec<String> = tokio::time::timeout(
        RESPONSE_TIMEOUT,
        redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").query_async(&mut c),
    )
    .await
    .map_err(|_| WqError::Unavailable(format!("CONFIG GET on {addr} timed out")))??;
    Ok(res.get(1).cloned().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = RedisTarget::parse("redis://127.0.0.1:6379").unwrap();
        assert!(!t.is_cluster() && !t.is_tls());
        assert_eq!(t.node_addrs(), ["127.0.0.1:6379"]);
        let t = RedisTarget::parse("redis+cluster://a:1,b:2").unwrap();
        assert!(t.is_cluster() && !t.is_tls());
        assert_eq!(t.node_addrs(), ["a:1", "b:2"]);
        for bad in ["", "http://x:1", "redis+cluster://", "redis+cluster://,"] {
            assert!(RedisTarget::parse(bad).is_err(), "{bad}");
        }
    }

    /// A TLS cluster keeps TLS and the credentials for every seed node.
    #[test]
    fn cluster_nodes_keep_scheme_and_credentials() {
        let t = RedisTarget::parse("rediss+cluster://kjob:s3cret@a:1,b:2").unwrap();
        assert!(t.is_cluster() && t.is_tls());
        for n in &t.nodes {
            assert!(matches!(n.addr, ConnectionAddr::TcpTls { .. }), "{:?}", n.addr);
            assert_eq!(n.redis.username.as_deref(), Some("kjob"));
            assert_eq!(n.redis.password.as_deref(), Some("s3cret"));
        }
        // Options override the URL's credentials.
        let o = RedisOptions {
            username: Some("other".into()),
            password: Some("pw".into()),
            ..Default::default()
        };
        let t = RedisTarget::new("rediss://kjob:s3cret@a:1", &o).unwrap();
        assert_eq!(t.nodes[0].redis.username.as_deref(), Some("other"));
        assert_eq!(t.nodes[0].redis.password.as_deref(), Some("pw"));
    }

    #[test]
    fn tls_files_need_a_tls_url() {
        let o = RedisOptions {
            tls: RedisTls { ca_file: Some("/nonexistent".into()), ..Default::default() },
            ..Default::default()
        };
        let e = RedisTarget::new("redis://kjob:s3cret@a:1", &o).unwrap_err().to_string();
        assert!(e.contains("rediss://") && !e.contains("s3cret"), "{e}");
    }

    #[test]
    fn passwords_never_show() {
        for (url, shown) in [
            ("rediss://kjob:s3cret@host:6380", "rediss://kjob:***@host:6380"),
            ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
            ("redis://kjob@host:6379", "redis://kjob@host:6379"),
            ("redis://host:6379", "redis://host:6379"),
            ("rediss+cluster://kjob:p@ss@a:1,b:2", "rediss+cluster://kjob:***@a:1,b:2"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact(url), shown);
        }
        let t = RedisTarget::parse("rediss://kjob:s3cret@host:6380").unwrap();
        assert!(!format!("{t} {t:?}").contains("s3cret"));
        let e = RedisTarget::parse("redis://kjob:s3cret@").map(|_| ()).unwrap_err().to_string();
        assert!(!e.contains("s3cret"), "{e}");
        let o = RedisOptions { password: Some("s3cret".into()), ..Default::default() };
        assert!(!format!("{o:?}").contains("s3cret"));
    }
}
