package loop

import (
	"context"
	"errors"
)

// Refresh implements backend.Attacher (being built; this file goes away).
func (a *Attacher) Refresh(context.Context, string, string) (int64, error) {
	return 0, errors.New("not implemented yet")
}
