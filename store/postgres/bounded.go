package postgres

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
)

// sendBounded begins a transaction on conn and sends qs in it, with every
// lock wait bounded. It returns the transaction, as pgx began it, and the
// results of qs alone, which the caller must close. mode is the
// QueryExecMode of conn's pool ([Store.modeOf]).
//
// With waits set, qs may wait for locks, and the transaction's
// lock_timeout is the store's ([Store.setLockTimeout]) for all of them.
// Without, qs bound their own waits (a NOWAIT, a try-lock), and the lock
// timeout matters only while the server parses them, see below; where it
// is set for that, it is put back to the session's before sendBounded
// returns, so the handler's statements run under the session's setting.
//
// Why it exists: a claim's batch begins its transaction itself, to save a
// round trip. Parsing a statement locks the tables it names, so a
// statement parsed before the batch's BEGIN and lock timeout would wait
// behind a LOCK TABLE or a migration's ALTER TABLE with no bound but the
// caller's deadline. How each QueryExecMode avoids that, relying only on
// what pgx documents:
//
//   - QueryExecModeExec and QueryExecModeSimpleProtocol send each statement
//     with the batch, and the server parses it after the ones before it
//     ran: the batch is sent whole, one round trip.
//   - QueryExecModeCacheStatement: the statements of qs whose parsing
//     locks idempotency_keys are prepared by name ([pgx.Conn.Prepare], the
//     SQL as the name, so that a batch that queues the SQL runs the
//     prepared statement), inside a transaction under the lock timeout. A
//     statement prepared so stays on the connection until it closes (a
//     failed batch and the statement cache's capacity leave it), and pgx,
//     not idem, knows which it holds ([preparedOn]): when it holds them
//     all, the batch is sent whole; the others (BEGIN, the lock timeout, a
//     try-lock, COMMIT) go through pgx's statement cache, whose preparing
//     waits for nothing.
//   - QueryExecModeCacheDescribe and QueryExecModeDescribeExec describe a
//     statement whose description pgx does not hold in a round trip before
//     the batch, and keep no statement on the server that idem could
//     prepare instead (a transaction-mode pooler may run each round trip
//     on another server connection).
//
// Where a statement may be parsed before the batch (the last case, and the
// first use of a statement on a connection in the one before), the
// transaction is begun and the lock timeout set first, in a round trip of
// their own, and qs sent after: whatever is prepared or described, it is
// inside the transaction, under the lock timeout.
func (s *Store) sendBounded(ctx context.Context, conn *pgx.Conn, mode pgx.QueryExecMode, waits bool, qs []*pgx.QueuedQuery) (pgx.BatchResults, pgx.Tx, error) {
	switch {
	case mode == pgx.QueryExecModeCacheDescribe, mode == pgx.QueryExecModeDescribeExec:
		return s.beginFirst(ctx, conn, waits, qs, nil)
	case mode == pgx.QueryExecModeCacheStatement && !preparedOn(conn, qs, parseLocksTable):
		return s.beginFirst(ctx, conn, waits, qs, func() error {
			return prepare(ctx, conn, qs, parseLocksTable)
		})
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	head := 1
	if waits {
		b.Queue(s.setLockTimeout)
		head++
	}
	b.QueuedQueries = append(b.QueuedQueries, qs...)
	br := conn.SendBatch(ctx, b)
	for range head {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, nil, err
		}
	}
	return br, br.Tx(), nil
}

// beginFirst begins a transaction on conn and sets the lock timeout, in one
// simple query, one round trip with nothing to prepare or describe; then
// it calls prepare, if not nil, and sends qs. On an error the transaction
// is left open, as a failed batch leaves it: the caller rolls it back or
// closes the connection.
func (s *Store) beginFirst(ctx context.Context, conn *pgx.Conn, waits bool, qs []*pgx.QueuedQuery, prepare func() error) (pgx.BatchResults, pgx.Tx, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN; " + s.setLockTimeout})
	if err != nil {
		return nil, nil, err
	}
	if prepare != nil {
		if err := prepare(); err != nil {
			return nil, nil, err
		}
	}
	b := &pgx.Batch{QueuedQueries: qs}
	if !waits {
		// Read, and discarded, by the caller's Close.
		b.Queue(restoreLockTimeout)
	}
	return conn.SendBatch(ctx, b), tx, nil
}

// sendInTx sends qs in the transaction open on conn, with the store's lock
// timeout set first for what is left of it, so that every wait of qs is
// bounded, their parsing included: as in sendBounded, a statement is sent
// with the lock timeout in one round trip only where pgx sends it whole
// (QueryExecModeExec, QueryExecModeSimpleProtocol, or
// QueryExecModeCacheStatement with every statement prepared on conn);
// otherwise the lock timeout is set in a round trip of its own, the
// statements prepared under it, and qs sent after. It returns the results
// of qs alone, which the caller must close.
//
// In QueryExecModeCacheStatement every statement, the lock timeout and
// COMMIT too, is prepared by name, not left to pgx's statement cache: a
// batch that fails makes pgx drop its statements from that cache, and
// the records sent so fail by design (an optimistic claim's on a key
// already recorded), so that each failure would cost the connection's
// next record a round trip to deallocate them and one to prepare them
// again.
func (s *Store) sendInTx(ctx context.Context, conn *pgx.Conn, mode pgx.QueryExecMode, qs []*pgx.QueuedQuery) (pgx.BatchResults, error) {
	all := append([]*pgx.QueuedQuery{{SQL: s.setLockTimeout}}, qs...)
	whole := mode == pgx.QueryExecModeExec || mode == pgx.QueryExecModeSimpleProtocol ||
		mode == pgx.QueryExecModeCacheStatement && preparedOn(conn, all, everyStatement)
	if whole {
		br := conn.SendBatch(ctx, &pgx.Batch{QueuedQueries: all})
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, err
		}
		return br, nil
	}
	// No arguments: pgx sends it with the simple protocol, nothing to
	// prepare.
	if _, err := conn.Exec(ctx, s.setLockTimeout); err != nil {
		return nil, err
	}
	if mode == pgx.QueryExecModeCacheStatement {
		if err := prepare(ctx, conn, all, everyStatement); err != nil {
			return nil, err
		}
	}
	return conn.SendBatch(ctx, &pgx.Batch{QueuedQueries: qs}), nil
}

// restoreLockTimeout puts back the session's lock_timeout, which
// setLockTimeout kept in idem.lock_timeout.
const restoreLockTimeout = "SELECT set_config('lock_timeout', current_setting('idem.lock_timeout'), true)"

// parseLocksTable reports whether parsing sql, one of idem's statements,
// locks idempotency_keys: every statement that names it but LOCK TABLE,
// which locks it when it runs.
func parseLocksTable(sql string) bool {
	return strings.Contains(sql, "idempotency_keys") && !strings.HasPrefix(sql, "LOCK TABLE")
}

// everyStatement selects every statement, for prepare and preparedOn.
func everyStatement(string) bool { return true }

// prepare prepares on conn, by name (its SQL), every statement of qs that
// which selects.
func prepare(ctx context.Context, conn *pgx.Conn, qs []*pgx.QueuedQuery, which func(sql string) bool) error {
	for _, q := range qs {
		if which(q.SQL) {
			if _, err := conn.Prepare(ctx, q.SQL, q.SQL); err != nil {
				return err
			}
		}
	}
	return nil
}

// preparedOn reports whether conn holds, prepared by name, every statement
// of qs that which selects. It asks pgx, through prepare with a context
// that has ended: Conn.Prepare of a statement already prepared with the
// same name and SQL returns it, and one given a context that has ended
// sends nothing and fails at once. A pgx that answered otherwise would
// cost a claim or a record a round trip more (the lock timeout set first
// every time), never an unbounded wait; TestClaimRoundTrips and
// TestOptimisticRoundTrips would see it.
func preparedOn(conn *pgx.Conn, qs []*pgx.QueuedQuery, which func(sql string) bool) bool {
	return prepare(endedContext, conn, qs, which) == nil
}

// endedContext is a context that has ended.
var endedContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
