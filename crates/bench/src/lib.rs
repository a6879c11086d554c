//! kjob-bench: the pure parts of the whole-stack benchmark — statistics, parsers for the
//! text the processes expose (Prometheus counters, Redis `INFO commandstats`, `/proc`), the
//! Markdown report and the PNG plots. The binary (`src/main.rs`) does the I/O around them.

pub mod plot;
pub mod procfs;
pub mod promtext;
pub mod redisinfo;
pub mod report;
pub mod stats;
