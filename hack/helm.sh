#!/usr/bin/env bash
# Builds helm from source with the Go toolchain (there is no helm package
# here) into the cache and prints its path. Cached: a second run only checks
# the version. HELM_VERSION overrides the pin.
#
#   hack/helm.sh            # prints e.g. ~/.cache/spindle/tools/helm-v3.21.4/helm
set -euo pipefail
HELM_VERSION=${HELM_VERSION:-v3.21.4}
TOOLS=${TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/spindle/tools}
export PATH="$PATH:/usr/local/go/bin"
dir=$TOOLS/helm-$HELM_VERSION
if [ ! -x "$dir/helm" ]; then
  echo "helm: building helm $HELM_VERSION into $dir" >&2
  mkdir -p "$dir"
  GOBIN=$dir GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath \
    go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
fi
echo "$dir/helm"
