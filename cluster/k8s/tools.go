//go:build tools

// Package tools pins the upstream Kubernetes binaries kjob's tests and benchmarks run against.
// Nothing here is compiled into kjob; `go build` of the listed commands uses this module's go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
