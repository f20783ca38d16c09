package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"

	"github.com/idemkit/idem/migrations"
	"github.com/idemkit/idem/store/postgres"
)

// templateName returns the name of the template database for the current
// migrations: idem_template_ and a hash of the migration files' names and
// contents.
func templateName() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		// Length-prefix both parts so that no two file sets hash alike.
		fmt.Fprintf(h, "%d:%s%d:", len(path), path, len(data))
		h.Write(data)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hash migrations: %w", err)
	}
	return "idem_template_" + hex.EncodeToString(h.Sum(nil))[:12], nil
}

// template returns the name of the server's template database, creating it
// on first use.
func (s *Server) template(ctx context.Context) (string, error) {
	s.templateMu.Lock()
	defer s.templateMu.Unlock()
	if !s.templateDone {
		if err := s.createTemplate(ctx); err != nil {
			return "", fmt.Errorf("create template database %s: %w", s.templateName, err)
		}
		s.templateDone = true
	}
	return s.templateName, nil
}

// createTemplate makes sure the template database exists. Other processes
// may be doing the same at the same time (go test runs packages in
// parallel), so the template is built under a name of its own and renamed
// only when complete; of several processes that race, the first rename wins
// and the others drop their copies.
func (s *Server) createTemplate(ctx context.Context) error {
	exists, err := s.databaseExists(ctx, s.templateName)
	if err != nil || exists {
		return err
	}

	tmp := s.templateName + "_" + randomHex(4)
	if _, err := s.admin.Exec(ctx, "CREATE DATABASE "+quoteIdent(tmp)+" TEMPLATE template0"); err != nil {
		return err
	}
	if err := s.buildTemplate(ctx, tmp); err != nil {
		if dropErr := dropDatabase(ctx, s.admin, tmp); dropErr != nil {
			err = fmt.Errorf("%w (and dropping %s: %v)", err, tmp, dropErr)
		}
		return err
	}

	rename := "ALTER DATABASE " + quoteIdent(tmp) + " RENAME TO " + quoteIdent(s.templateName)
	err = retryInUse(ctx, func() error {
		_, err := s.admin.Exec(ctx, rename)
		return err
	})
	if err == nil {
		return nil
	}
	// Another process may have finished first; then its template serves.
	// A rename that loses the race to a concurrent one fails in the
	// catalog's unique index rather than with duplicate_database.
	code := pgErrorCode(err)
	if code == duplicateDatabase || code == uniqueViolation {
		err = nil
	}
	_, dropErr := s.admin.Exec(ctx, "ALTER DATABASE "+quoteIdent(tmp)+" IS_TEMPLATE false")
	if dropErr == nil {
		dropErr = dropDatabase(ctx, s.admin, tmp)
	}
	if dropErr != nil {
		dropErr = fmt.Errorf("drop %s: %w", tmp, dropErr)
	}
	return errors.Join(err, dropErr)
}

// buildTemplate applies idem's migrations to the database tmp and closes it
// to connections: nobody needs to connect to a template, and a connection
// would make CREATE DATABASE from it fail.
func (s *Server) buildTemplate(ctx context.Context, tmp string) error {
	connString, err := withDatabase(s.connString, tmp)
	if err != nil {
		return err
	}
	conn, err := connect(ctx, connString, urlProbeTimeout)
	if err != nil {
		return err
	}
	err = postgres.Migrate(ctx, conn)
	if closeErr := conn.Close(ctx); err == nil {
		err = closeErr
	}
	if err != nil {
		return err
	}
	_, err = s.admin.Exec(ctx, "ALTER DATABASE "+quoteIdent(tmp)+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false")
	return err
}

func (s *Server) databaseExists(ctx context.Context, name string) (bool, error) {
	var exists bool
	err := s.admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	return exists, err
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails
	return hex.EncodeToString(b)
}
