//go:build tools

// Package tools pins the control-plane binaries the test environment builds from this
// module: `go build` them by import path with the version stamped through -ldflags.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
