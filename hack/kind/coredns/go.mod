// A module of its own, outside Spindle's: hack/kind/node-image.sh copies
// this directory, requires github.com/coredns/coredns at the version
// kubeadm deploys and builds it there.
module spindle.local/kind/coredns

go 1.26
