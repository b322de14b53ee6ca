//go:build tools

// Package tools pins the Kubernetes binaries the test environment builds from this module:
// the control plane, the node's kubelet, scheduler and kube-proxy, and kubectl. `go build` them by
// import path with the version stamped through -ldflags.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
