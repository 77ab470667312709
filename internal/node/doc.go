// Package node owns the node side of every volume (Volumes): stage (attach
// through the volume's backend, format at most once, mount at the staging
// path, undo it all on failure), publish (bind mounts, read-only device
// views), unpublish, unstage, expansion, stats, health and the node's
// inventory. Every request first asks Locate what is at its path and whose
// it is, and acts only on what belongs to the volume it names. Everything
// it touches on the machine goes through Host: LinuxHost for real,
// FakeHost in memory for tests. internal/driver translates CSI to it; this
// package knows nothing of gRPC.
package node
