//go:build tools

// Package tools pins Helm, built from its module by the test environment.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
