package backend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"sync"

	"github.com/spindle-csi/spindle/internal/command"
)

// Kind is one backend type as the driver knows it: how the section of its
// type in the config file decodes and is checked, and how an instance is
// built from it. Each backend package registers its Kind in an init
// function; the driver and the config parser find it by type name, so
// neither imports a backend package (cmd/spindle does, through
// internal/backend/all).
type Kind[C any] struct {
	// Type is the name in the config's "type" field and in volume IDs.
	Type string
	// Validate reports every problem of a decoded section; where is the
	// section's place in the file (e.g. "backends[1].loop"), for messages.
	// A method expression fits: Config.Validate.
	Validate func(cfg C, where string) []error
	// New builds the instance named name from a valid section.
	New func(name string, cfg C, run *command.Runner) (*Instance, error)
}

// Section is one decoded config section of a registered type.
type Section struct {
	typ      string
	settings any
	kind     registered
}

// Type is the section's backend type.
func (s *Section) Type() string { return s.typ }

// Settings is the decoded config of the section's type (a *loop.Config,
// ...), for callers that know the type.
func (s *Section) Settings() any { return s.settings }

// Validate reports every problem of the section.
func (s *Section) Validate(where string) []error { return s.kind.validate(where, s.settings) }

// New builds the instance named name.
func (s *Section) New(name string, run *command.Runner) (*Instance, error) {
	return s.kind.build(name, s.settings, run)
}

// MarshalJSON writes the section as it was configured.
func (s *Section) MarshalJSON() ([]byte, error) { return json.Marshal(s.settings) }

// registered is a Kind with its config type erased.
type registered struct {
	decode   func(raw []byte) (any, error)
	validate func(where string, cfg any) []error
	build    func(name string, cfg any, run *command.Runner) (*Instance, error)
}

var (
	registryMu sync.RWMutex
	registry   = map[string]registered{}
)

// Register makes a backend type known; a type registered twice is a
// programming error.
func Register[C any](k Kind[C]) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[k.Type]; dup {
		panic("backend type " + k.Type + " registered twice")
	}
	registry[k.Type] = registered{
		decode: func(raw []byte) (any, error) {
			cfg := new(C)
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(cfg); err != nil {
				return nil, err
			}
			return cfg, nil
		},
		validate: func(where string, cfg any) []error { return k.Validate(*cfg.(*C), where) },
		build: func(name string, cfg any, run *command.Runner) (*Instance, error) {
			return k.New(name, *cfg.(*C), run)
		},
	}
}

// Types lists the registered backend types, sorted.
func Types() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]string, 0, len(registry))
	for t := range registry {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// DecodeSection decodes the config section of backend type typ, strictly:
// an unknown field is an error, so a typo never falls back to a default.
func DecodeSection(typ string, raw []byte) (*Section, error) {
	registryMu.RLock()
	k, ok := registry[typ]
	registryMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("unknown backend type %q (known: %v)", typ, Types())
	}
	settings, err := k.decode(raw)
	if err != nil {
		return nil, err
	}
	return &Section{typ: typ, settings: settings, kind: k}, nil
}
