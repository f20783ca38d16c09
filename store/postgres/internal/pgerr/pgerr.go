// Package pgerr translates PostgreSQL's errors into the sentinel errors of
// package store, for the key store and the inbox of store/postgres alike.
package pgerr

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/store"
)

// SQLSTATE codes idem reacts to, named as in github.com/jackc/pgerrcode.
const (
	UniqueViolation      = "23505"
	lockNotAvailable     = "55P03"
	serializationFailure = "40001"
	deadlockDetected     = "40P01"

	InvalidTextRepresentation = "22P02"

	// A schema older than the store's statements: a table, a column or the
	// primary key an ON CONFLICT names is not there, or the status
	// constraint refuses the status the store writes.
	undefinedTable         = "42P01"
	undefinedColumn        = "42703"
	invalidColumnReference = "42P10"
	checkViolation         = "23514"
)

// statusCheck is the name of the constraint on the status of
// idempotency_keys, which refuses 'recorded' before migration 0008.
const statusCheck = "idempotency_keys_status_check"

// Code returns the SQLSTATE of err, or "" if err is not from PostgreSQL.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// keyTablePrimaryKey is the name of the primary key of idempotency_keys.
const keyTablePrimaryKey = "idempotency_keys_pkey"

// Interpret translates PostgreSQL errors into the sentinel errors of
// package store by SQLSTATE, keeping the original error in the chain. A
// lock_not_available is a wait of idem's that the lock timeout ended (for
// another claim of the key, a key's row someone holds, a table lock) or a
// NOWAIT that found the table locked: the key is in use. A unique
// violation counts as a conflict only on the key table's primary key: a
// claim that got past the key's lock met the row another request
// committed.
func Interpret(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case lockNotAvailable:
		return fmt.Errorf("%w: %w", store.ErrInUse, err)
	case serializationFailure, deadlockDetected:
		return fmt.Errorf("%w: %w", store.ErrConflict, err)
	case UniqueViolation:
		if pgErr.ConstraintName == keyTablePrimaryKey {
			return fmt.Errorf("%w: %w", store.ErrConflict, err)
		}
	case undefinedTable, undefinedColumn, invalidColumnReference:
		return fmt.Errorf("%w: %w", ErrSchema, err)
	case checkViolation:
		if pgErr.ConstraintName == statusCheck {
			return fmt.Errorf("%w: %w", ErrSchema, err)
		}
	}
	return err
}

// ErrSchema is the store.ErrNotReady of a database whose schema is missing
// or outdated.
var ErrSchema = fmt.Errorf("%w: idem's tables are missing or outdated in this database; apply them with postgres.Migrate (see Store.Check)", store.ErrNotReady)
