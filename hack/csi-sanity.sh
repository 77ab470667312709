#!/usr/bin/env bash
# Installs the stock csi-sanity binary (kubernetes-csi/csi-test) with
# `go install` at the pinned version into the cache and prints its path.
# Cached: a second run only checks the version. CSI_SANITY_VERSION
# overrides the pin; it should match the csi-test module in go.mod, which
# the in-process sanity runs use.
#
#   hack/csi-sanity.sh      # prints e.g. ~/.cache/spindle/tools/csi-sanity-v5.6.0/csi-sanity
set -euo pipefail
CSI_SANITY_VERSION=${CSI_SANITY_VERSION:-v5.6.0}
TOOLS=${TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/spindle/tools}
export PATH="$PATH:/usr/local/go/bin"
dir=$TOOLS/csi-sanity-$CSI_SANITY_VERSION
if [ ! -x "$dir/csi-sanity" ]; then
  echo "csi-sanity: installing csi-sanity $CSI_SANITY_VERSION into $dir" >&2
  mkdir -p "$dir"
  GOBIN=$dir GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath \
    go install "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$CSI_SANITY_VERSION" >&2
fi
echo "$dir/csi-sanity"
