package postgres

import (
	"errors"
	"fmt"

	"github.com/idemkit/idem/store"
)

// readKept fills in c from the kept request's method and metadata as a row
// of abandoned holds them (the metadata in names and values), and returns
// why they cannot be read, if they cannot: c then has no metadata. The
// error never quotes what was kept.
func readKept(c *store.Call, method *string, names []*string, values [][]byte) error {
	if method == nil {
		return errors.New("postgres: the kept request has no method (request_method is NULL)")
	}
	c.Method = *method
	var err error
	if c.Metadata, err = readHeaders(names, values); err != nil {
		c.Metadata = nil
		return fmt.Errorf("postgres: the kept request metadata cannot be read: %w", err)
	}
	return nil
}
