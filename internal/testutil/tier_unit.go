//go:build !root

package testutil

// rootTier: without -tags root, the unit tier that `go test ./...` runs on
// any machine as any user: fakes only, so a test that asks for root or a
// program is in the wrong file.
const rootTier = false
