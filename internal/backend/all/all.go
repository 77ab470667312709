// Package all registers every backend type Spindle ships (loop, iscsi,
// rbd) with internal/backend, for the programs that build drivers from a
// config file: import it for its side effect.
package all

import (
	_ "github.com/spindle-csi/spindle/internal/backend/iscsi"
	_ "github.com/spindle-csi/spindle/internal/backend/loop"
	_ "github.com/spindle-csi/spindle/internal/backend/rbd"
)
