//! kjob-sim: a simulated Kubernetes API server and kubelet for tests, demos and benchmarks
pub mod kubelet;
pub mod admission;
pub mod patch;
pub mod selector;
