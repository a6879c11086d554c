//go:build tools

// Package tools pins the etcd server kjob's real control plane stores its objects in.
package tools

import _ "go.etcd.io/etcd/server/v3"
