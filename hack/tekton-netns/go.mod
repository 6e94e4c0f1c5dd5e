// tekton-netns: runs the Tekton controller in a network namespace of its own (see main.go).
module workspace-gc/hack/tekton-netns

go 1.22.3

require golang.org/x/sys v0.29.0
