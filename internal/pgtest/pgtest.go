package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// startTimeout bounds finding a server, including initdb and starting a
	// throwaway cluster.
	startTimeout = 3 * time.Minute
	// createTimeout bounds creating one database, including the template
	// the first time.
	createTimeout = 2 * time.Minute
	// dropTimeout bounds dropping one database.
	dropTimeout = time.Minute
)

// shared is the process-wide server of NewDatabase and NewPool. A failure is
// kept too, so that every test reports it without trying again.
var shared struct {
	mu     sync.Mutex
	done   bool
	srv    *Server
	err    error
	logged bool
}

// sharedServer returns the process-wide server, finding it on first use. The
// bool reports whether this call found it.
func sharedServer() (*Server, bool, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.done {
		return shared.srv, false, shared.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	shared.srv, shared.err = Start(ctx)
	shared.done = true
	return shared.srv, true, shared.err
}

// closeShared closes the process-wide server, if it was started, and lets the
// next use find a server again.
func closeShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	srv := shared.srv
	shared.done, shared.srv, shared.err = false, nil, nil
	if srv == nil {
		return nil
	}
	return srv.Close()
}

// Run runs the tests of m and then closes the server that [NewDatabase] and
// [NewPool] found, which stops a throwaway cluster this process started. It
// returns the exit code for os.Exit, and is meant for TestMain:
//
//	func TestMain(m *testing.M) {
//		os.Exit(pgtest.Run(m))
//	}
//
// If stopping the cluster fails, Run reports it on standard error and turns
// a passing run into a failing one.
func Run(m *testing.M) int {
	code := m.Run()
	if err := closeShared(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// sharedServerFor returns the process's server for tb: it skips tb under
// go test -short, since tb needs what (PostgreSQL, say) and the quick run
// leaves out every test that does, and fails tb, never skips it, when no
// server can be had.
func sharedServerFor(tb testing.TB, what string) *Server {
	tb.Helper()
	if testing.Short() {
		tb.Skip("pgtest: needs " + what + ", so it runs without -short")
	}
	srv, found, err := sharedServer()
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if found {
		tb.Logf("pgtest: using PostgreSQL from %s", srv.source)
	}
	return srv
}

// NewDatabase creates a database for tb alone, with idem's migrations
// applied and no rows, and returns a connection string for it. The database
// is dropped, along with any connections still open to it, when tb and its
// subtests have finished.
//
// The server is found on first use in the process (see the package
// documentation). When no PostgreSQL can be had, NewDatabase fails tb with a
// message that says how to get it; it never skips for that. Under go test
// -short it skips tb, so that the quick run leaves out every test that
// needs a database.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	return createDatabaseFor(tb, sharedServerFor(tb, "PostgreSQL"))
}

// createDatabaseFor creates a database for tb alone on srv, dropped when
// tb and its subtests have finished, and returns its connection string.
func createDatabaseFor(tb testing.TB, srv *Server) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
	defer cancel()
	connString, drop, err := srv.CreateDatabase(ctx)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dropTimeout)
		defer cancel()
		if err := drop(ctx); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return connString
}

// NewPool is [NewDatabase] followed by pgxpool.New: it returns a pool on a
// new database of tb's own. The pool is closed when tb has finished, before
// the database is dropped.
func NewPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	connString := NewDatabase(tb)
	pool, err := pgxpool.New(context.Background(), connString)
	if err != nil {
		tb.Fatalf("pgtest: open pool: %v", err)
	}
	// Cleanups run last-registered first, so the pool closes before
	// NewDatabase's cleanup drops the database.
	tb.Cleanup(pool.Close)
	return pool
}
