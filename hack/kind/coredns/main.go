// Command coredns is CoreDNS with only the plugins of the Corefile kubeadm
// deploys (errors, health, ready, kubernetes, prometheus, forward, cache,
// loop, reload, loadbalance) and log, for the kind node image that
// hack/kind/node-image.sh builds without a registry. CoreDNS's own main
// links every plugin and their cloud SDKs, which takes far longer to build.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() { coremain.Run() }
