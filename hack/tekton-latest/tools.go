//go:build tools

// Package tools pins the newest Tekton Pipelines controller the Go module proxy serves, so that a
// Tekton upgrade is caught too (CONTROL_PLANE_TEKTON_MODULE=hack/tekton-latest).
package tools

import (
	_ "github.com/tektoncd/pipeline/cmd/controller"
)
