package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/store"
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
//   - QueryExecModeCacheStatement: the statements of qs that name
//     idempotency_keys are prepared by name ([pgx.Conn.Prepare], with the
//     SQL as the name, so a batch that queues the SQL runs the prepared
//     statement). Prepare is idempotent, and a statement prepared so stays
//     on the connection until it closes (a failed batch and the statement
//     cache's capacity leave it), so only a connection's first use of a
//     statement prepares it, outside any transaction: that wait is bounded
//     by a context of the lock timeout ([Store.prepare]). The batch is then
//     sent whole; the statements that name no table (BEGIN, the lock
//     timeout, COMMIT) go through pgx's statement cache, whose preparing
//     waits for nothing.
//   - QueryExecModeCacheDescribe and QueryExecModeDescribeExec describe
//     a statement whose description pgx does not hold in a round trip
//     before the batch, and keep no statement on the server that idem
//     could prepare instead (a transaction-mode pooler may run each round
//     trip on another server connection). So the transaction is begun and
//     the lock timeout set first, in a round trip of their own, and qs
//     sent after: whatever pgx describes, it describes inside the
//     transaction, under the lock timeout.
func (s *Store) sendBounded(ctx context.Context, conn *pgx.Conn, mode pgx.QueryExecMode, waits bool, qs []*pgx.QueuedQuery) (pgx.BatchResults, pgx.Tx, error) {
	switch mode {
	case pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec:
		// One simple query, one round trip, nothing to describe.
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN; " + s.setLockTimeout})
		if err != nil {
			return nil, nil, err
		}
		b := &pgx.Batch{QueuedQueries: qs}
		if !waits {
			// Read, and discarded, by the caller's Close.
			b.Queue(restoreLockTimeout)
		}
		return conn.SendBatch(ctx, b), tx, nil
	case pgx.QueryExecModeCacheStatement:
		if err := s.prepare(ctx, conn, qs); err != nil {
			return nil, nil, err
		}
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

// restoreLockTimeout puts back the session's lock_timeout, which
// setLockTimeout kept in idem.lock_timeout.
const restoreLockTimeout = "SELECT set_config('lock_timeout', current_setting('idem.lock_timeout'), true)"

// prepare prepares on conn, by name, the statements of qs that name
// idempotency_keys, each with its SQL as its name. A statement conn has
// prepared already costs nothing: pgx answers from what it holds. One it
// has not is prepared outside any transaction, so the wait for a lock on
// the table is bounded by a context of the lock timeout: when it runs out,
// pgx ends the wait as it ends any wait whose context ended (by default it
// closes the connection, which the pool then replaces), and prepare fails
// with an error that wraps [store.ErrInUse], as a claim behind the table's
// lock does.
func (s *Store) prepare(ctx context.Context, conn *pgx.Conn, qs []*pgx.QueuedQuery) error {
	pctx, cancel := context.WithTimeout(ctx, s.lockTimeout)
	defer cancel()
	for _, q := range qs {
		if !strings.Contains(q.SQL, "idempotency_keys") {
			continue
		}
		if _, err := conn.Prepare(pctx, q.SQL, q.SQL); err != nil {
			if ctx.Err() == nil && errors.Is(pctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%w: %w", errPrepareTimedOut, err)
			}
			return err
		}
	}
	return nil
}

// errPrepareTimedOut reports a statement of idem's whose preparing waited
// the lock timeout for a lock on idempotency_keys.
var errPrepareTimedOut = fmt.Errorf("%w: preparing a statement waited the lock timeout for a lock on idempotency_keys", store.ErrInUse)
