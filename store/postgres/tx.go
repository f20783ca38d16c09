package postgres

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// ErrTxOwned is returned by Commit and Rollback of the transaction from
// [TxFromContext]: the interceptor commits it, together with the recorded
// response, when the handler returns.
var ErrTxOwned = errors.New("postgres: the transaction holds the idempotency key and commits when the handler returns; return an error to discard its writes")

// tx is the handler's view of the claim's transaction. The transaction was
// opened by the claim's batch rather than by conn.Begin, so pgx has no Tx for
// it; tx provides one.
type tx struct {
	conn   *pgx.Conn
	closed atomic.Bool // set once the claim is finished and conn returned
	depth  int         // savepoints handed out by Begin
}

var _ pgx.Tx = (*tx)(nil)

// Begin starts a pseudo nested transaction on a savepoint.
func (t *tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	t.depth++
	sp := &nestedTx{parent: t, name: "idem_sp_" + strconv.Itoa(t.depth)}
	if _, err := t.conn.Exec(ctx, "SAVEPOINT "+sp.name); err != nil {
		return nil, err
	}
	return sp, nil
}

// Commit returns ErrTxOwned: the interceptor commits.
func (t *tx) Commit(context.Context) error { return ErrTxOwned }

// Rollback returns ErrTxOwned: return an error from the handler instead.
// Deferring it, as pgx code usually does, is harmless.
func (t *tx) Rollback(context.Context) error { return ErrTxOwned }

func (t *tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.closed.Load() {
		return 0, pgx.ErrTxClosed
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed.Load() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects returns the large objects of the transaction. pgx builds them
// only on a Tx of its own, so the first call asks the connection for one
// with an empty statement: one extra round trip, taken only by handlers that
// use large objects.
func (t *tx) LargeObjects() pgx.LargeObjects {
	inner, err := t.conn.BeginTx(context.Background(), pgx.TxOptions{BeginQuery: ";"})
	if err != nil {
		return pgx.LargeObjects{}
	}
	return inner.LargeObjects()
}

func (t *tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Prepare(ctx, name, sql)
}

func (t *tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.conn.Exec(ctx, sql, args...)
}

func (t *tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed.Load() {
		return errRows{err: pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return t.conn.Query(ctx, sql, args...)
}

func (t *tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed.Load() {
		return errRow{pgx.ErrTxClosed}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *tx) Conn() *pgx.Conn { return t.conn }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// nestedTx is a savepoint inside the claim's transaction.
type nestedTx struct {
	parent *tx
	name   string
	done   bool
}

var _ pgx.Tx = (*nestedTx)(nil)

func (n *nestedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if n.done {
		return nil, pgx.ErrTxClosed
	}
	return n.parent.Begin(ctx)
}

// Commit releases the savepoint, keeping its writes in the claim's
// transaction.
func (n *nestedTx) Commit(ctx context.Context) error {
	if n.done {
		return pgx.ErrTxClosed
	}
	_, err := n.parent.Exec(ctx, "RELEASE SAVEPOINT "+n.name)
	n.done = true
	return err
}

// Rollback undoes the writes made since the savepoint.
func (n *nestedTx) Rollback(ctx context.Context) error {
	if n.done {
		return pgx.ErrTxClosed
	}
	_, err := n.parent.Exec(ctx, "ROLLBACK TO SAVEPOINT "+n.name)
	n.done = true
	return err
}

func (n *nestedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if n.done {
		return 0, pgx.ErrTxClosed
	}
	return n.parent.CopyFrom(ctx, table, columns, src)
}

func (n *nestedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if n.done {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return n.parent.SendBatch(ctx, b)
}

func (n *nestedTx) LargeObjects() pgx.LargeObjects { return n.parent.LargeObjects() }

func (n *nestedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if n.done {
		return nil, pgx.ErrTxClosed
	}
	return n.parent.Prepare(ctx, name, sql)
}

func (n *nestedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if n.done {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return n.parent.Exec(ctx, sql, args...)
}

func (n *nestedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if n.done {
		return errRows{err: pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return n.parent.Query(ctx, sql, args...)
}

func (n *nestedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if n.done {
		return errRow{pgx.ErrTxClosed}
	}
	return n.parent.QueryRow(ctx, sql, args...)
}

func (n *nestedTx) Conn() *pgx.Conn { return n.parent.Conn() }

// errRows is what Query returns once the claim has finished, so that callers
// that defer rows.Close before checking the error do not panic. The embedded
// interface keeps it a pgx.Rows if pgx adds methods.
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
