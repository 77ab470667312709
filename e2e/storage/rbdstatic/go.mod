// This go.mod only keeps the Go testdriver out of the spindle module: it
// imports k8s.io/kubernetes/test/e2e, which cannot be required from the
// spindle module (k8s.io/kubernetes replaces its staging modules with
// ./staging paths), and `go mod tidy` of the spindle module would try to
// (build tags would not stop it: tidy reads files of every tag). The
// package is built in the scratch module hack/local-cluster/build.sh
// makes (spindle_storage_e2e), which copies its .go files there.
module example.local/spindle-rbdstatic

go 1.26.0
