package main

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// counters count what a scenario's pool sent to PostgreSQL.
//
// A round trip is a flight of writes on a connection followed by reading the
// answer: the first write after a read (or the first write at all) starts
// one. pgx writes a whole pipelined batch before it reads, so a batch of
// eight statements is one round trip, as it is on the wire.
//
// Commits are the statements whose command tag is COMMIT (a COMMIT of an
// aborted transaction reports ROLLBACK and does not count), plus INSERT,
// UPDATE and DELETE run outside a transaction, which commit on their own.
type counters struct {
	roundTrips atomic.Int64
	statements atomic.Int64
	commits    atomic.Int64
	rollbacks  atomic.Int64
}

type counts struct {
	RoundTrips int64 `json:"round_trips"`
	Statements int64 `json:"statements"`
	Commits    int64 `json:"commits"`
	Rollbacks  int64 `json:"rollbacks"`
}

func (c *counters) reset() {
	c.roundTrips.Store(0)
	c.statements.Store(0)
	c.commits.Store(0)
	c.rollbacks.Store(0)
}

func (c *counters) snapshot() counts {
	return counts{
		RoundTrips: c.roundTrips.Load(),
		Statements: c.statements.Load(),
		Commits:    c.commits.Load(),
		Rollbacks:  c.rollbacks.Load(),
	}
}

// instrument makes cfg's connections count into c.
func (c *counters) instrument(cfg *pgxpool.Config) {
	cfg.ConnConfig.Tracer = c
	after := cfg.ConnConfig.AfterNetConnect
	cfg.ConnConfig.AfterNetConnect = func(ctx context.Context, pc *pgconn.Config, conn net.Conn) (net.Conn, error) {
		if after != nil {
			var err error
			if conn, err = after(ctx, pc, conn); err != nil {
				return nil, err
			}
		}
		return &countingConn{Conn: conn, c: c}, nil
	}
}

func (c *counters) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (c *counters) TraceQueryEnd(_ context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	c.statements.Add(1)
	if d.Err != nil {
		return
	}
	switch {
	case d.CommandTag.String() == "COMMIT":
		c.commits.Add(1)
	case d.CommandTag.String() == "ROLLBACK":
		c.rollbacks.Add(1)
	case (d.CommandTag.Insert() || d.CommandTag.Update() || d.CommandTag.Delete()) && conn.PgConn().TxStatus() == 'I':
		c.commits.Add(1)
	}
}

func (c *counters) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *counters) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.statements.Add(1)
	if d.Err != nil {
		return
	}
	switch d.CommandTag.String() {
	case "COMMIT":
		c.commits.Add(1)
	case "ROLLBACK":
		c.rollbacks.Add(1)
	}
}

func (c *counters) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// countingConn counts round trips on one connection to PostgreSQL.
type countingConn struct {
	net.Conn
	c     *counters
	wrote atomic.Bool // the last operation was a write
}

func (cc *countingConn) Write(p []byte) (int, error) {
	if !cc.wrote.Swap(true) {
		cc.c.roundTrips.Add(1)
	}
	return cc.Conn.Write(p)
}

func (cc *countingConn) Read(p []byte) (int, error) {
	n, err := cc.Conn.Read(p)
	if n > 0 {
		cc.wrote.Store(false)
	}
	return n, err
}
