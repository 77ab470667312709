//go:build root

package block

import (
	"testing"

	"github.com/spindle-csi/spindle/e2e/sanity"
)

func TestSanityBlock(t *testing.T) { sanity.Run(t, sanity.Config{AccessType: "block"}) }
