#!/usr/bin/env bash
# Builds HashiCorp Vault from its Go module (the version pinned below) into
# the cache and prints its path; the KMS tests (internal/kms) start it in dev
# mode on 127.0.0.1. Vault's own go.mod has replace directives (its api and
# sdk from its own tree), so `go install vault@version` refuses it: it is
# built as a dependency of a throwaway module instead. v1.21.4's go.mod
# requires sdk v0.21.0, whose framework.ActivationFunc takes one argument
# more than v1.21.4's own tree passes, so sdk is pinned to v0.20.0, the
# published version that matches the tree. Cached: a second run only checks
# the binary.
#
#   hack/vault.sh      # prints e.g. ~/.cache/spindle/tools/vault-v1.21.4/vault
set -euo pipefail
VAULT_VERSION=${VAULT_VERSION:-v1.21.4}
VAULT_SDK_VERSION=${VAULT_SDK_VERSION:-v0.20.0}
TOOLS=${TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/spindle/tools}
export PATH="$PATH:/usr/local/go/bin"
dir=$TOOLS/vault-$VAULT_VERSION
if [ ! -x "$dir/vault" ]; then
  echo "vault: building Vault $VAULT_VERSION into $dir" >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$dir"
  (
    cd "$work"
    printf 'module vaultbuild\n\ngo 1.26\n' >go.mod
    printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/hashicorp/vault"\n' >tools.go
    GOTOOLCHAIN=local go get "github.com/hashicorp/vault@$VAULT_VERSION" >&2
    go mod edit -replace "github.com/hashicorp/vault/sdk=github.com/hashicorp/vault/sdk@$VAULT_SDK_VERSION"
    GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=mod" go build -o "$dir/vault.tmp" github.com/hashicorp/vault >&2
  )
  mv "$dir/vault.tmp" "$dir/vault"
fi
echo "$dir/vault"
