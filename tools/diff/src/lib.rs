//! The differential suite (`make diff-upstream`): every case runs under kube-controller-manager's
//! Job controller and under kjob on control planes without kubelet, a scripted kubelet gives
//! both runs the same pod fates, and the comparator reports what a user would see differ.

pub mod case;
pub mod compare;
pub mod jobset;
pub mod kubelet;
pub mod kueue;
pub mod report;
pub mod run;
