//! The Redis ACL of kjob's user: exactly the commands kjob-queue sends (directly, and from its
//! Lua scripts, which Redis checks against the same ACL), on its own keys only.
//!
//! Written once here; `kjob-queue redis-acl` prints it, deploy/ builds Redis's aclfile from
//! it, and the integration tests run the whole workqueue as a user with exactly these rules.

/// Every key kjob writes or reads starts with this (the `{wq:<queue>}` hash tags, see `keys`,
/// `view` and `events`, and the API budget's `{wq:budget}`).
pub const KEY_PATTERN: &str = "{wq:*";

/// The rules of kjob's Redis user, after `user <name> on <password>`:
/// * `ping` (readiness), `info` (scripts read `INFO server`'s run id; the memory gauges read
///   `INFO memory`), `config|get` (the `maxmemory-policy` check at start);
/// * `select` (sent by the redis crate on connect with a `/db` in the URL), `cluster|slots` and
///   `asking` (Cluster topology and redirections). The redis crate's `CLIENT SETINFO` on
///   connect is left out: its refusal is ignored, and Redis 7.0 does not know the command;
/// * `evalsha`, `script|load`, `multi`, `exec`, `discard` (every operation is a script, some in
///   a transaction with the reads after it), `blpop` (wake-ups), `hvals` (view reads);
/// * the data commands the scripts call.
///
/// Not allowed: everything else, notably `FLUSHALL`, `FLUSHDB`, `KEYS`, `CONFIG SET`, `DEBUG`,
/// `SHUTDOWN`, `MODULE`, `ACL`, `EVAL` (only known scripts run), and any key outside
/// [`KEY_PATTERN`] or any pub/sub channel.
pub const ACL_RULES: &str = concat!(
    "resetchannels ~{wq:* -@all",
    " +ping +info +config|get +select +cluster|slots +asking",
    " +evalsha +script|load +multi +exec +discard +blpop",
    " +del +exists +get +set +pexpire +time",
    // The one-time move of the unsharded layout's keys (`migrate`): SCAN finds them (names
    // only; a user allowed SCAN can list every key's name), DUMP/RESTORE/PTTL move them.
    " +scan +dump +restore +pttl",
    " +hdel +hget +hgetall +hincrby +hlen +hmget +hscan +hset +hvals",
    " +lindex +llen +lrange +ltrim +rpush",
    " +sadd +sismember",
    " +zadd +zcard +zcount +zpopmin +zrange +zrank +zrem +zremrangebyscore +zscore",
);

/// The aclfile line (or `ACL SETUSER` arguments after the name) of user `name`: enabled, with
/// `password` (the redis `>password` form; give `#<sha256 hex>` to store only its hash), and
/// [`ACL_RULES`].
pub fn acl_user_line(name: &str, password: &str) -> String {
    format!("user {name} on {password} {ACL_RULES}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_name_the_key_pattern_and_no_dangerous_command() {
        assert!(ACL_RULES.contains(&format!("~{KEY_PATTERN} ")));
        for bad in ["flushall", "flushdb", "keys", "config|set", "+config ", "debug", "+eval "] {
            assert!(!ACL_RULES.contains(bad), "{bad}");
        }
        assert_eq!(acl_user_line("kjob", ">pw"), format!("user kjob on >pw {ACL_RULES}"));
    }
}
