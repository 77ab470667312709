//go:build root

package mount

import (
	"testing"

	"github.com/spindle-csi/spindle/e2e/sanity"
)

func TestSanityMount(t *testing.T) {
	sanity.Run(t, sanity.Config{AccessType: "mount", NodeLocal: true})
}
