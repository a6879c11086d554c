//! kjob-sim: a simulated Kubernetes API server and kubelet for tests, demos and benchmarks
