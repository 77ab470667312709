//go:build root

package testutil

// rootTier: built with -tags root, the tier of tests that need root and the
// machine's own programs and devices (loop devices, mkfs, mounts, tgtd,
// qemu-storage-daemon). `make test` runs it, as root, after
// hack/install-deps.sh; what such a test needs and lacks fails it.
const rootTier = true
