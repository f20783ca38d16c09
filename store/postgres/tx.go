package postgres

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// guardedTx is the handler's view of the claim's transaction: the pgx.Tx
// that the claim's batch began (pgx.Batch.BeginTx), which the engine
// commits or rolls back itself. Commit and Rollback of the transaction
// itself are refused with ErrTxOwned; those of a nested transaction
// (Begin, on a savepoint) go to pgx.
//
// Once the claim has finished, the connection goes back to the pool, and a
// handler that kept the transaction (in a goroutine, say) must not reach
// it: every method that sends something checks closed first and returns
// pgx.ErrTxClosed. A method pgx adds to its Tx interface later is passed
// through without that check.
type guardedTx struct {
	pgx.Tx
	closed *atomic.Bool // shared with the nested transactions
	nested bool
}

var _ pgx.Tx = (*guardedTx)(nil)

// Begin starts a pseudo nested transaction on a savepoint.
func (t *guardedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	inner, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &guardedTx{Tx: inner, closed: t.closed, nested: true}, nil
}

// Commit returns ErrTxOwned, the engine commits; a nested transaction
// releases its savepoint.
func (t *guardedTx) Commit(ctx context.Context) error {
	if !t.nested {
		return ErrTxOwned
	}
	if t.closed.Load() {
		return pgx.ErrTxClosed
	}
	return t.Tx.Commit(ctx)
}

// Rollback returns ErrTxOwned: return an error from the handler instead.
// Deferring it, as pgx code usually does, is harmless. A nested transaction
// rolls back to its savepoint.
func (t *guardedTx) Rollback(ctx context.Context) error {
	if !t.nested {
		return ErrTxOwned
	}
	if t.closed.Load() {
		return pgx.ErrTxClosed
	}
	return t.Tx.Rollback(ctx)
}

func (t *guardedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.closed.Load() {
		return 0, pgx.ErrTxClosed
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *guardedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed.Load() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return t.Tx.SendBatch(ctx, b)
}

func (t *guardedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *guardedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *guardedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed.Load() {
		return errRows{err: pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return t.Tx.Query(ctx, sql, args...)
}

func (t *guardedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed.Load() {
		return errRow{pgx.ErrTxClosed}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errRows is what Query returns once the claim has finished, so that callers
// that defer rows.Close before checking the error do not panic, as with
// pgx's own Rows. The embedded interface keeps it a pgx.Rows if pgx adds
// methods.
type errRows struct {
	pgx.Rows
	err error
}

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return nil }
func (r errRows) TypeMap() *pgtype.Map                         { return nil }
