//go:build tools

// Package tools pins the release's tools (scripts/release, tests/release.rs): cosign signs and
// verifies the image, its SBOM attestation and the chart; crane assembles and pushes the image
// index and, as `crane registry serve`, is the local OCI registry the release test pushes to.
package tools

import (
	_ "github.com/google/go-containerregistry/cmd/crane"
	_ "github.com/sigstore/cosign/v2/cmd/cosign"
)
