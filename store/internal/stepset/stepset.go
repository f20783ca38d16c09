// Package stepset merges a saved step into the steps of an entry, by the rule
// the documentation of store.Lease states, for idem's own stores.
package stepset

import (
	"fmt"

	"github.com/idemkit/idem/store"
)

// Merge returns steps with p saved among them: in place of the step of the
// same name, or else appended. It refuses, with an error wrapping
// store.ErrInvalidStep, a step that fails Validate and one that would make
// the steps more than store.MaxSteps or store.MaxStepsBytes. steps is not
// modified.
func Merge(steps []store.Step, p store.Step) ([]store.Step, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	out := make([]store.Step, 0, len(steps)+1)
	size, found := 0, false
	for _, q := range steps {
		if q.Name == p.Name {
			q, found = p, true
		}
		size += len(q.Name) + len(q.Result)
		out = append(out, q)
	}
	if !found {
		out = append(out, p)
		size += len(p.Name) + len(p.Result)
	}
	switch {
	case len(out) > store.MaxSteps:
		return nil, fmt.Errorf("%w: a key keeps at most %d steps", store.ErrInvalidStep, store.MaxSteps)
	case size > store.MaxStepsBytes:
		return nil, fmt.Errorf("%w: the steps of a key hold at most %d bytes, this one would make them %d", store.ErrInvalidStep, store.MaxStepsBytes, size)
	}
	return out, nil
}
