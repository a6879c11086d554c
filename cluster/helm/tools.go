//go:build tools

// Package tools pins Helm's command for cluster/build-helm.sh; kjob's product stays Rust.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
