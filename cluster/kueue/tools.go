//go:build tools

// Package tools pins Kueue's manager, started beside the real control plane by `make cluster-up
// ADDONS=kueue`. Nothing here is compiled into kjob; `go build` of the command uses this go.sum.
// The CRDs and webhook configurations come from the same module zip (config/components/).
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
