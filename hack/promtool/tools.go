//go:build tools

// Package tools pins the Prometheus commands built from this module: promtool checks the rules
// and the dashboard's queries, and the server scrapes the daemon in an integration test.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
