//! CPU time and peak memory of a process from `/proc/<pid>/stat` and `/proc/<pid>/status`.

/// CPU ticks (user + system) from the text of `/proc/<pid>/stat`.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: fields restart after the
    // last ')'. Field 3 (state) is then index 0, so utime (14) and stime (15) are 11 and 12.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A `kB` field (`VmHWM`, `VmRSS`) of `/proc/<pid>/status`, in bytes.
pub fn status_bytes(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let v = l.strip_prefix(field)?.strip_prefix(':')?;
        let kb: u64 = v.trim().strip_suffix("kB")?.trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// `CLK_TCK` from getconf; 100 (the Linux default) if it cannot be asked.
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

/// One sample of a process's resource use.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// CPU seconds (user + system) so far.
    pub cpu_secs: f64,
    /// Peak resident set size so far, in bytes.
    pub peak_rss: u64,
}

/// Reads the usage of `pid`; `ticks_per_sec` is the kernel's `CLK_TCK`.
pub fn read_usage(pid: u32, ticks_per_sec: f64) -> std::io::Result<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "unparsable /proc entry");
    Ok(Usage {
        cpu_secs: cpu_ticks(&stat).ok_or_else(bad)? as f64 / ticks_per_sec,
        peak_rss: status_bytes(&status, "VmHWM").ok_or_else(bad)?,
    })
}

/// Busy CPU ticks of the whole machine from the text of `/proc/stat`: user, nice, system, irq
/// and softirq of the `cpu` line (idle, iowait and steal left out: time no process of this
/// machine spent).
pub fn machine_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line.split_whitespace().skip(1).map_while(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal …
    Some(f.first()? + f.get(1)? + f.get(2)? + f.get(5)? + f.get(6)?)
}

/// Busy CPU seconds of the whole machine so far (every core); `ticks_per_sec` is `CLK_TCK`.
pub fn machine_busy_secs(ticks_per_sec: f64) -> std::io::Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "unparsable /proc/stat");
    Ok(machine_busy_ticks(&stat).ok_or_else(bad)? as f64 / ticks_per_sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_busy_leaves_idle_iowait_and_steal_out() {
        let stat = "cpu  100 5 50 9000 40 3 2 70 0 0\ncpu0 50 2 25 4500 20 1 1 35 0 0\nintr 1\n";
        assert_eq!(machine_busy_ticks(stat), Some(160));
        assert_eq!(machine_busy_ticks("intr 1\n"), None);
    }

    #[test]
    fn parses_stat_with_odd_command_names() {
        let stat = "4242 (kjob (worker) 1) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 9 0 100 0 0";
        assert_eq!(cpu_ticks(stat), Some(325));
        assert_eq!(cpu_ticks("garbage"), None);
        assert_eq!(cpu_ticks("1 (x) S 1 2"), None);
    }

    #[test]
    fn parses_status_fields() {
        let status =
            "Name:\tkjob-sim\nVmPeak:\t  900 kB\nVmHWM:\t   51234 kB\nVmRSS:\t   40000 kB\n";
        assert_eq!(status_bytes(status, "VmHWM"), Some(51_234 * 1024));
        assert_eq!(status_bytes(status, "VmRSS"), Some(40_000 * 1024));
        assert_eq!(status_bytes(status, "VmSwap"), None);
    }

    #[test]
    fn reads_own_usage() {
        let u = read_usage(std::process::id(), 100.0).unwrap();
        assert!(u.peak_rss > 0);
        assert!(u.cpu_secs >= 0.0);
    }
}
