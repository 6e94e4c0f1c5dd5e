//go:build tools

// Package tools pins the Tekton Pipelines controller the lifecycle tests run
// (scripts/control-plane build-tekton).
package tools

import (
	_ "github.com/tektoncd/pipeline/cmd/controller"
)
