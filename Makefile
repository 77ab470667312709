# Spindle — a block-device CSI driver for Kubernetes.
#
#   make demo    build the driver and take one volume through its whole
#                lifecycle on the embedded loop backend (root)
#   make test    every test: unit, backend conformance, csi-sanity,
#                lifecycle on real loop devices, the Helm chart (root)
#   make chart-test  the Helm chart's tests only (builds helm, cached)
#   make images  the driver and sidecar images as tarballs in build/images
#                (hack/images.sh; the sidecars need hack/local-cluster/build.sh)
#   make bench   driver vs plain commands, per-RPC latency, load; the data
#                path (fio) per backend and attach mode (root)
#   make e2e     a real local Kubernetes (hack/local-cluster) with Spindle and
#                its sidecars; the Kubernetes e2e tests against it (root)
#   make e2e-kind  the same tests in a three-node kind cluster (root; Docker
#                is set up if missing)
#   make bench-k8s  100 PVCs and 100 pods applied at once on the local
#                Kubernetes (the chart's deployment): time to Running,
#                attach/mount latency, time to delete (root)
#
# Each target installs the system packages it needs (hack/install-deps.sh).

GO      ?= go
BIN     ?= bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
LDFLAGS := -X main.version=$(VERSION)
REPORTS ?= build/reports
BENCH_ARGS ?=

export PATH := $(PATH):/usr/local/go/bin:/usr/sbin:/sbin

.PHONY: all build deps lint test test-ceph csi-sanity sanity-stock-rbd chart-test images helm demo bench bench-k8s e2e e2e-kind e2e-multinode e2e-storage vmtest vmtest-ci cluster-up cluster-down clean

all: build

# The driver's Ceph client (internal/ceph) is cgo over librados and librbd
# (go-ceph), built with the tags hack/go-tags.sh gives for this machine's
# librbd headers ("ceph", and go-ceph's tag of an older release: Debian
# 12's are Pacific's). Without them the binary has no Ceph client and says
# so at its first RBD call.
build:
	tags=$$(hack/go-tags.sh) && CGO_ENABLED=1 $(GO) build -tags "$$tags" -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/spindle ./cmd/spindle
	$(GO) build -trimpath -o $(BIN)/kubectl-spindle ./cmd/kubectl-spindle

deps:
	hack/install-deps.sh

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags "root cluster $$(hack/go-tags.sh)" ./...

# The packages that reach a real Ceph: built with the tag "ceph" and run
# inside a Ceph root (hack/ceph/run: the release's daemons, CLIs and client
# libraries, Tentacle 20 unless SPINDLE_CEPH_RELEASE says otherwise).
CEPH_PKGS := ./internal/ceph/... ./internal/backend/rbd/... ./e2e/sanity/rbd/ ./e2e/rbd/ ./hack/vm/cephproxy/
CEPH_EXEC  = $(CURDIR)/hack/ceph/run

# The test tiers (docs/testing.md): `go test ./...` alone is the unit tier
# (fakes only, any user, any machine); make test runs, as root, the unit
# and root tiers together (-tags root: real loop devices, mkfs, mounts,
# tgtd, helm, csi-sanity), then the Ceph tier (the tag "ceph": the Ceph
# packages in the Ceph root, its release printed first). A test of the
# root or Ceph tier fails, naming what is missing, where it cannot run.
# The cluster tier (-tags cluster) and the guests have targets of their
# own below. The csi-sanity runs write their spec counts to $(REPORTS),
# printed last. helm (hack/helm.sh) and the stock csi-sanity binary
# (hack/csi-sanity.sh) are built first, cached; csi-sanity runs against
# the spindle binary built here, as users run both. Each package's time
# limit is three times what it takes on an idle 2-core machine.
test: deps lint helm csi-sanity build
	@rm -rf $(REPORTS) && mkdir -p $(REPORTS)
	SPINDLE_HELM=$$(hack/helm.sh) SPINDLE_CSI_SANITY=$$(hack/csi-sanity.sh) SPINDLE_BINARY=$(CURDIR)/$(BIN)/spindle \
	SPINDLE_REPORT_DIR=$(CURDIR)/$(REPORTS) $(GO) test -race -count=1 -timeout 30m -tags root ./...
	@$(CEPH_EXEC) sh -c 'echo "make test: the Ceph packages on Ceph $$(ceph --version | cut -d" " -f3-), with its client"'
	SPINDLE_REPORT_DIR=$(CURDIR)/$(REPORTS) $(GO) test -race -count=1 -timeout 20m -tags "root $$(hack/go-tags.sh)" -exec $(CEPH_EXEC) $(CEPH_PKGS)
	@cat $(REPORTS)/*.txt 2>/dev/null || true

# The Ceph packages against the other releases Spindle supports: the
# contract suite with Reef 18's own client on a Reef cluster, and the
# contract, the store's cases and the lifecycle with the driver's client
# (Tentacle 20) on that Reef cluster, whose keys are of the old type
# (hack/ceph/test-releases.sh).
test-ceph: deps build
	hack/ceph/test-releases.sh

# The stock csi-sanity binary against RBD on a throw-away Ceph 20, then on
# Ceph 18 (Reef) with the driver's own client (long: csi-sanity's 10 GiB
# volumes; docs/testing.md).
sanity-stock-rbd: deps csi-sanity
	@rm -rf $(REPORTS) && mkdir -p $(REPORTS)
	SPINDLE_STOCK_SANITY_RBD=1 SPINDLE_CSI_SANITY=$$(hack/csi-sanity.sh) SPINDLE_REPORT_DIR=$(CURDIR)/$(REPORTS) \
	$(GO) test -count=1 -timeout 30m -tags "root $$(hack/go-tags.sh)" -exec $(CEPH_EXEC) -run TestStockSanityRBD ./e2e/sanity/rbd/
	SPINDLE_STOCK_SANITY_RBD=1 SPINDLE_CSI_SANITY=$$(hack/csi-sanity.sh) SPINDLE_REPORT_DIR=$(CURDIR)/$(REPORTS) \
	hack/ceph/test-releases.sh sanity
	@cat $(REPORTS)/*.txt

helm:
	@hack/helm.sh >/dev/null

csi-sanity:
	@hack/csi-sanity.sh >/dev/null

chart-test: helm
	SPINDLE_HELM=$$(hack/helm.sh) $(GO) test -race -count=1 -tags root ./e2e/chart/

images:
	hack/images.sh all

demo: deps build
	$(GO) run ./e2e/cmd/spindle-demo --driver $(BIN)/spindle

# The control path (spindle-bench), the RBD operations side by side with
# ceph-csi on one Ceph 20 cluster (spindle-bench-rbd: "rbd <op>: spindle X
# ms, ceph-csi Y ms"; CEPH_CSI names a cephcsi binary, built from its
# source as docs/benchmarks.md says; without it Spindle's figures only),
# RBD snapshots of a volume full of data and of a 10-deep chain
# (internal/backend/rbd BenchmarkSnapshotRBD), then the data path: fio on
# a published volume against the storage under it, one line per mode and
# workload (e2e/datapath; DATAPATH picks the backends, SPINDLE_BENCH_FIO_*
# the jobs). The Ceph clusters keep Ceph's default monitor commit interval
# (MON_PROPOSE_INTERVAL=1), as users' clusters do.
DATAPATH ?= loop iscsi rbd
CEPH_CSI ?=
bench: deps build
	$(GO) run ./e2e/cmd/spindle-bench --driver $(BIN)/spindle $(BENCH_ARGS)
	tags=$$(hack/go-tags.sh) && $(GO) build -tags "$$tags" -o $(BIN)/spindle-bench-rbd ./e2e/cmd/spindle-bench-rbd
	MON_PROPOSE_INTERVAL=1 $(CEPH_EXEC) $(BIN)/spindle-bench-rbd -driver $(BIN)/spindle $(if $(CEPH_CSI),-ceph-csi $(CEPH_CSI))
	MON_PROPOSE_INTERVAL=1 $(GO) test -count=1 -run '^$$' -bench SnapshotRBD -benchtime 1x -timeout 60m -tags "root $$(hack/go-tags.sh)" -exec $(CEPH_EXEC) ./internal/backend/rbd/
	MON_PROPOSE_INTERVAL=1 $(GO) test -count=1 -run '^$$' -bench DataPath -benchtime 1x -timeout 120m -tags "root $$(hack/go-tags.sh)" -exec $(CEPH_EXEC) $(addprefix ./e2e/datapath/,$(DATAPATH))

# Builds (cached), brings the cluster up with the chart (DEPLOY=helm), runs
# e2e/cmd/spindle-bench-k8s (BENCH_K8S_ARGS="-pods 50 -size 128Mi" tunes it),
# always brings it down; prints figures and asserts nothing about time.
BENCH_K8S_ARGS ?=
bench-k8s: deps
	hack/local-cluster/bench-k8s.sh $(BENCH_K8S_ARGS)

# Builds (cached), brings the cluster up, runs e2e/kubernetes, always brings
# it down; ends with "N passed, M failed".
e2e: deps
	hack/local-cluster/e2e.sh

# The same tests in a kind cluster (a control plane and two workers with the
# host's loop devices and a shared pool; hack/kind-e2e.sh): Docker set up
# if there is none, stock kind images where a registry answers, else built
# here; the cluster always deleted and the host checked unchanged; ends with
# "N passed, M failed".
e2e-kind:
	hack/kind-e2e.sh

# The multi-node tests (e2e/multinode): two worker nodes in qemu guests with
# their own kernels, Ceph and tgtd on this machine, Spindle from the chart.
e2e-multinode: deps
	hack/local-cluster/multinode.sh

# The Kubernetes external storage suite (e2e.test) for each StorageClass in
# e2e/storage, and its pre-provisioned PV patterns for RBD (rbd-static:
# spindle-storage.test, the Go testdriver in e2e/storage/rbdstatic); DRIVERS
# picks runs (default: loop-ext4 loop-xfs loop-block rbd rbd-static iscsi);
# too long for CI (its run time is in docs/testing.md).
e2e-storage: deps
	hack/local-cluster/e2e-storage.sh

# The kernel attach paths (iSCSI kernel initiator on tgt and LIO, krbd,
# rbd-nbd, online ext4 growth) in a qemu guest with Debian's kernel; ends
# with "N passed, M failed" (its run time is in docs/testing.md).
vmtest: deps
	hack/vm/vmtest.sh

# The part of vmtest that CI runs (.ci/run): on the real kernel, the driver
# loading its modules, csi-sanity in mount access and the lifecycle for
# iSCSI kernel/tgt and krbd, and the loop lifecycle with online ext4 growth.
VMTEST_CI_MODES ?= kernel/tgt krbd loop
VMTEST_CI_RUNS  ?= probe|sanity-mount|lifecycle
vmtest-ci: deps
	MODES="$(VMTEST_CI_MODES)" RUNS='$(VMTEST_CI_RUNS)' hack/vm/vmtest.sh

# For working on the e2e tests: a cluster that stays up
# (SPINDLE_E2E_CLUSTER_DIR=/var/tmp/spindle-local-cluster go test ./e2e/kubernetes/).
cluster-up: deps build
	hack/local-cluster/build.sh && hack/local-cluster/up.sh

cluster-down:
	hack/local-cluster/down.sh

clean:
	rm -rf $(BIN) build
