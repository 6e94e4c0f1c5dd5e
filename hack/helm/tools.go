//go:build tools

// Package tools pins the helm command built from this module: the chart tests (tests/helm.rs)
// lint, render, install, upgrade and uninstall charts/workspace-gc with it.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
