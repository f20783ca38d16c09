package postgres

import (
	"fmt"
	"slices"

	"github.com/idemkit/idem/store"
)

// A key's steps are kept in step_names and step_results, and a kept call's
// metadata in request_header_names and request_header_values (migration
// 0007): parallel arrays, which pgx encodes and decodes. Steps are in the
// order they were first saved; metadata has one element per value, sorted
// by name, a name repeated for each of its values.

// stepArrays returns steps as the values of step_names and step_results.
func stepArrays(steps []store.Step) (names []string, results [][]byte) {
	names = make([]string, len(steps))
	results = make([][]byte, len(steps))
	for i, p := range steps {
		names[i], results[i] = p.Name, p.Result
	}
	return names, results
}

// readSteps returns the steps a row keeps in its step_names and
// step_results.
func readSteps(names []*string, results [][]byte) ([]store.Step, error) {
	if len(names) != len(results) {
		return nil, fmt.Errorf("postgres: step_names holds %d steps and step_results %d", len(names), len(results))
	}
	steps := make([]store.Step, len(names))
	for i, name := range names {
		if name == nil {
			return nil, fmt.Errorf("postgres: step %d of step_names is NULL", i+1)
		}
		steps[i] = store.Step{Name: *name, Result: results[i]}
	}
	return steps, nil
}

// headerArrays returns md as the values of request_header_names and
// request_header_values: never NULL, so that a takeover's kept call
// replaces the metadata an earlier one kept.
func headerArrays(md map[string][]string) (names []string, values [][]byte) {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	names, values = []string{}, [][]byte{}
	for _, k := range keys {
		for _, v := range md[k] {
			names = append(names, k)
			values = append(values, []byte(v))
		}
	}
	return names, values
}

// readHeaders returns the metadata a row keeps in its
// request_header_names and request_header_values. The error names the
// column it could not read, never what it holds.
func readHeaders(names []*string, values [][]byte) (map[string][]string, error) {
	if len(names) != len(values) {
		return nil, fmt.Errorf("request_header_names holds %d values and request_header_values %d", len(names), len(values))
	}
	md := map[string][]string{}
	for i, name := range names {
		switch {
		case name == nil:
			return nil, fmt.Errorf("element %d of request_header_names is NULL", i+1)
		case values[i] == nil:
			return nil, fmt.Errorf("element %d of request_header_values is NULL", i+1)
		}
		md[*name] = append(md[*name], string(values[i]))
	}
	return md, nil
}
