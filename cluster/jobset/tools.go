//go:build tools

// Package tools pins JobSet's manager, started beside the real control plane by `make cluster-up
// ADDONS=jobset`. Nothing here is compiled into kjob; `go build` of the command uses this go.sum.
// The CRDs and webhook configurations come from the same module zip (config/components/).
package tools

import (
	_ "sigs.k8s.io/jobset"
)
