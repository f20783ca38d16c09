package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// sendBounded begins a transaction on conn and sends qs in it, with every
// lock wait bounded. It returns the transaction, as pgx began it, and the
// results of qs alone, which the caller must close.
//
// With waits set, qs may wait for locks, and the transaction's
// lock_timeout is the store's ([Store.setLockTimeout]) for all of them.
// Without, qs bound their own waits (a NOWAIT, a try-lock) and the lock
// timeout matters only while pgx prepares them, see below; it is then put
// back to the session's before sendBounded returns, so the handler's
// statements run under the session's setting.
//
// Why it exists: a claim's batch begins its transaction itself, to save a
// round trip. But in the QueryExecModes that prepare or describe statements
// (CacheStatement, pgx's default, CacheDescribe and DescribeExec), pgx
// first prepares every statement of a batch that it has not cached, in a
// round trip of its own, before any of the batch runs: outside the
// transaction, before the lock timeout is set. Preparing a statement locks
// the tables it names, so behind a LOCK TABLE or a migration's ALTER TABLE
// a connection that has not claimed before (a server just started, a
// reconnect, a new or recycled connection of the pool), or one whose claim
// statements pgx dropped from its cache after a failed batch, would wait
// with no bound but the caller's deadline.
//
// So each connection keeps, in its CustomData, the statements of idem's
// batches that pgx has cached on it ([prepared]). When qs has a statement
// not among them, sendBounded begins the transaction and sets the lock
// timeout first, in a round trip of its own, and then sends qs: pgx
// prepares them inside the transaction, under the lock timeout. When all
// are cached, BEGIN (and the lock timeout, with waits) travel with qs in
// one round trip. In QueryExecModeExec and QueryExecModeSimpleProtocol the
// server parses each statement in turn, after the ones before it ran, so
// the batch is always sent whole; in QueryExecModeDescribeExec pgx
// describes every statement of every batch, so the transaction is always
// begun first.
//
// pgx may still drop a statement from its cache without idem knowing: its
// cache holds the statements used last (StatementCacheCapacity, 512 by
// default), so a connection that runs more distinct statements than that
// between two claims prepares idem's again outside the transaction, and so
// does one whose statements the application deallocated
// (Conn.DeallocateAll).
func (s *Store) sendBounded(ctx context.Context, conn *pgx.Conn, waits bool, qs []*pgx.QueuedQuery) (pgx.BatchResults, pgx.Tx, error) {
	p := preparedOn(conn)
	if !p.cached(qs) {
		tx, err := s.begin(ctx, conn, p)
		if err != nil {
			return nil, nil, err
		}
		b := &pgx.Batch{QueuedQueries: qs}
		if !waits {
			// Read, and discarded, by the caller's Close.
			b.Queue(restoreLockTimeout)
		}
		br := &trackedResults{BatchResults: conn.SendBatch(ctx, b), p: p, qs: qs}
		return br, tx, nil
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	head := 1
	if waits {
		b.Queue(s.setLockTimeout)
		head++
	}
	b.QueuedQueries = append(b.QueuedQueries, qs...)
	br := &trackedResults{BatchResults: conn.SendBatch(ctx, b), p: p, qs: qs}
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

// begin begins a transaction on conn and sets the lock timeout, neither of
// which locks anything. Where pgx caches statements it sends them as a
// batch, so that the batches that carry them later find them cached; in
// QueryExecModeDescribeExec, which caches nothing, as one simple query, one
// round trip.
func (s *Store) begin(ctx context.Context, conn *pgx.Conn, p *prepared) (pgx.Tx, error) {
	if p.mode == pgx.QueryExecModeDescribeExec {
		return conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN; " + s.setLockTimeout})
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(s.setLockTimeout)
	br := conn.SendBatch(ctx, b)
	if err := br.Close(); err != nil {
		return nil, err
	}
	return br.Tx(), nil
}

// preparedKey is the key of a connection's *prepared in its CustomData.
const preparedKey = "github.com/idemkit/idem/store/postgres.prepared"

// prepared is what idem knows of a connection's statement cache: the
// statements of its batches that pgx has prepared (or described) and kept.
type prepared struct {
	mode  pgx.QueryExecMode
	stmts map[string]struct{}
}

// preparedOn returns what idem knows of conn's statement cache.
func preparedOn(conn *pgx.Conn) *prepared {
	data := conn.PgConn().CustomData()
	if p, ok := data[preparedKey].(*prepared); ok {
		return p
	}
	p := &prepared{mode: conn.Config().DefaultQueryExecMode, stmts: make(map[string]struct{})}
	data[preparedKey] = p
	return p
}

// cached reports whether pgx sends qs without a round trip of its own
// that prepares or describes some of them first.
func (p *prepared) cached(qs []*pgx.QueuedQuery) bool {
	switch p.mode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		return true
	case pgx.QueryExecModeDescribeExec:
		return false
	}
	for _, q := range qs {
		if _, ok := p.stmts[q.SQL]; !ok {
			return false
		}
	}
	return true
}

// sent records how a batch of qs ended: pgx keeps the statements of a batch
// that succeeded in its cache and drops all of them when it fails.
func (p *prepared) sent(qs []*pgx.QueuedQuery, err error) {
	for _, q := range qs {
		if err != nil {
			delete(p.stmts, q.SQL)
		} else {
			p.stmts[q.SQL] = struct{}{}
		}
	}
}

// trackedResults records in prepared how its batch ended, when closed.
type trackedResults struct {
	pgx.BatchResults
	p   *prepared
	qs  []*pgx.QueuedQuery
	err error // the first error of Close
}

func (r *trackedResults) Close() error {
	if r.p != nil {
		r.err = r.BatchResults.Close()
		r.p.sent(r.qs, r.err)
		r.p = nil
	}
	return r.err
}
