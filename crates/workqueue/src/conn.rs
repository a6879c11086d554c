//! Redis connections: one URL syntax for a single server and for a Cluster, a shared
//! multiplexed connection for scripts, and dedicated connections for blocking pops.
//!
//! URL forms:
//! * `redis://host:port[/db]` — a single server (also `rediss://`).
//! * `redis+cluster://host:port,host:port,…` — a Redis Cluster, given by one or more seed nodes.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::WqError;

/// Connecting to a Redis node must not hang longer than this.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest a single command or script may take before we call Redis unavailable; scripts are
/// bounded, so a healthy server answers in milliseconds.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server, by its `redis://` URL.
    Single(String),
    /// A Cluster, by the `redis://host:port` URLs of its seed nodes.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// Parses `redis://…`, `rediss://…` or `redis+cluster://h:p,h:p`.
    pub fn parse(url: &str) -> Result<Self, WqError> {
        if let Some(rest) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = rest
                .trim_end_matches('/')
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|hp| format!("redis://{hp}"))
                .collect();
            if nodes.is_empty() {
                return Err(WqError::Config(format!("{url:?}: no cluster nodes given")));
            }
            for n in &nodes {
                redis::parse_redis_url(n)
                    .ok_or_else(|| WqError::Config(format!("{url:?}: bad cluster node {n:?}")))?;
            }
            return Ok(Self::Cluster(nodes));
        }
        if url.starts_with("redis://") || url.starts_with("rediss://") {
            redis::parse_redis_url(url)
                .ok_or_else(|| WqError::Config(format!("{url:?} is not a valid redis URL")))?;
            return Ok(Self::Single(url.to_string()));
        }
        Err(WqError::Config(format!(
            "{url:?}: expected redis://host:port or redis+cluster://host:port,host:port"
        )))
    }

    /// The nodes named by the target (seed nodes for a Cluster).
    pub fn nodes(&self) -> Vec<String> {
        match self {
            Self::Single(u) => vec![u.clone()],
            Self::Cluster(n) => n.clone(),
        }
    }
}

/// A Redis connection that runs commands and scripts on a single server or a Cluster.
#[derive(Clone)]
pub enum Conn {
    /// Reconnecting multiplexed connection to one server.
    Single(ConnectionManager),
    /// Cluster connection (routes by key slot, follows redirections).
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Opens a connection to `target`. `response_timeout` bounds each command (blocking pops need
/// more than their own timeout).
pub async fn connect(target: &RedisTarget, response_timeout: Duration) -> Result<Conn, WqError> {
    match target {
        RedisTarget::Single(url) => {
            let client = redis::Client::open(url.as_str())?;
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
            .map_err(|_| WqError::Unavailable(format!("connecting to {url} timed out")))??;
            Ok(Conn::Single(conn))
        }
        RedisTarget::Cluster(nodes) => {
            let client = ClusterClientBuilder::new(nodes.clone())
                .connection_timeout(CONNECT_TIMEOUT)
                .response_timeout(response_timeout)
                .retries(2)
                .build()?;
            let conn = tokio::time::timeout(CONNECT_TIMEOUT * 2, client.get_async_connection())
                .await
                .map_err(|_| {
                    WqError::Unavailable("connecting to the cluster timed out".into())
                })??;
            Ok(Conn::Cluster(conn))
        }
    }
}

/// Refuses to run on a Redis that may evict keys: an evicted lease or dirty mark would lose or
/// duplicate work silently. Checks every node named by the target.
pub async fn check_noeviction(target: &RedisTarget) -> Result<(), WqError> {
    for node in target.nodes() {
        let client = redis::Client::open(node.as_str())?;
        let mut c =
            tokio::time::timeout(CONNECT_TIMEOUT, client.get_multiplexed_async_connection())
                .await
                .map_err(|_| WqError::Unavailable(format!("connecting to {node} timed out")))??;
        let res: Vec<String> = tokio::time::timeout(
            RESPONSE_TIMEOUT,
            redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").query_async(&mut c),
        )
        .await
        .map_err(|_| WqError::Unavailable(format!("CONFIG GET on {node} timed out")))??;
        let policy = res.get(1).cloned().unwrap_or_default();
        if policy != "noeviction" {
            return Err(WqError::Config(format!(
                "redis {node} has maxmemory-policy {policy:?}; kjob-queue needs \"noeviction\" \
                 (an evicted key would silently lose or duplicate work): set \
                 `maxmemory-policy noeviction` in redis.conf or with CONFIG SET"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        assert_eq!(
            RedisTarget::parse("redis://127.0.0.1:6379").unwrap(),
            RedisTarget::Single("redis://127.0.0.1:6379".into())
        );
        assert_eq!(
            RedisTarget::parse("redis+cluster://a:1,b:2").unwrap(),
            RedisTarget::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        for bad in ["", "http://x:1", "redis+cluster://", "redis+cluster://,"] {
            assert!(RedisTarget::parse(bad).is_err(), "{bad}");
        }
    }
}
