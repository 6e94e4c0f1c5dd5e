// Command bundle generates workspace-gc's OLM registry+v1 bundle from the kustomize base and
// validates a bundle as `operator-sdk bundle validate --select-optional suite=operatorframework`
// does. scripts/bundle runs it; scripts/control-plane build-bundle builds and caches it.
// operator-sdk itself cannot be built here: the Go module proxy refuses its go.mod.
package main

import (
	"fmt"
	"os"
)

func main() {
	switch {
	case len(os.Args) >= 2 && os.Args[1] == "generate":
		if err := generate(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "bundle generate: %v\n", err)
			os.Exit(1)
		}
	case len(os.Args) == 3 && os.Args[1] == "validate":
		validate(os.Args[2])
	default:
		fmt.Fprintln(os.Stderr, "usage: bundle generate ... | bundle validate DIR")
		os.Exit(2)
	}
}
