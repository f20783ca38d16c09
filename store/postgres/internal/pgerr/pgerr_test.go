package pgerr

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/store"
)

func TestInterpret(t *testing.T) {
	for code, want := range map[string]error{
		lockNotAvailable:     store.ErrInUse,
		serializationFailure: store.ErrConflict,
		deadlockDetected:     store.ErrConflict,
	} {
		pgErr := &pgconn.PgError{Code: code}
		got := Interpret(fmt.Errorf("batch: %w", pgErr))
		if !errors.Is(got, want) || !errors.Is(got, pgErr) {
			t.Errorf("SQLSTATE %s: %v, want %v wrapping the original", code, got, want)
		}
	}
	ours := &pgconn.PgError{Code: UniqueViolation, ConstraintName: "idempotency_keys_pkey"}
	if got := Interpret(ours); !errors.Is(got, store.ErrConflict) {
		t.Errorf("unique violation of the key table's primary key: %v, want ErrConflict", got)
	}
	other := &pgconn.PgError{Code: UniqueViolation, ConstraintName: "payments_pkey"}
	if got := Interpret(other); got != error(other) {
		t.Errorf("unique violation of %s: %v, want it unchanged", other.ConstraintName, got)
	}
}
