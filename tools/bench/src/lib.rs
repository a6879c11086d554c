//! kjob-bench: the shared parts of the whole-stack benchmark and of the side-by-side benchmark
//! against upstream — statistics, parsers for the text the processes expose (Prometheus
//! counters, kube-apiserver's `/metrics`, Redis `INFO commandstats`, `/proc`), the Markdown
//! reports and the PNG plots, and the harness both measure with (Job creators, the Job and Pod
//! watches). The binaries (`src/main.rs`, `src/bin/kjob-bench-upstream`) do the rest of the
//! I/O around them.

pub mod apiserver;
pub mod audit;
pub mod chart;
pub mod cli;
pub mod explain;
pub mod harness;
pub mod plot;
pub mod pprof;
pub mod procfs;
pub mod promtext;
pub mod redisinfo;
pub mod report;
pub mod stats;
pub mod upstream;
