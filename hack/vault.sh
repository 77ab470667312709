#!/usr/bin/env bash
# Builds HashiCorp Vault from its Go module (the version pinned below) into
# the cache and prints its path; the KMS tests (internal/kms) start it in dev
# mode on 127.0.0.1. Vault's own go.mod has replace directives, so
# `go install vault@version` refuses it: it is built as a dependency of a
# throwaway module instead, with the versions its go.mod requires. Cached:
# a second run only checks the binary. About 12 minutes and 2 GB of module
# downloads on a 2-core machine the first time.
#
#   hack/vault.sh      # prints e.g. ~/.cache/spindle/tools/vault-v1.21.4/vault
set -euo pipefail
VAULT_VERSION=${VAULT_VERSION:-v1.21.4}
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
    GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath go build -o "$dir/vault.tmp" github.com/hashicorp/vault >&2
  )
  mv "$dir/vault.tmp" "$dir/vault"
fi
echo "$dir/vault"
