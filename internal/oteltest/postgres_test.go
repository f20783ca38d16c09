package oteltest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/inbox"
)

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// TestSweeperMetrics: a pass counts the rows it deleted by table in
// idem.sweeper.deleted, and its duration in idem.sweeper.pass.duration,
// as a span idem.sweeper.pass says how many rows it deleted.
func TestSweeperMetrics(t *testing.T) {
	tel := newTelemetry(t)
	pool := pgtest.NewPool(t)
	exec(t, pool, `INSERT INTO idempotency_keys (id, tenant, method, key, request_hash, status, response_code, response, expires_at)
SELECT `+pgtest.KeyIDSQL("'"+tenant+"'", "'/svc/M'", "'key-"+secret+"-' || g")+`, '`+tenant+`', '/svc/M', 'key-`+secret+`-' || g,
       '\x01', 'recorded', 0, 'r', now() - interval '1 hour'
FROM generate_series(1, 25) g`)
	exec(t, pool, `INSERT INTO processed_messages (consumer, message_id, expires_at)
SELECT 'mailer', 'msg-`+secret+`-' || g, now() - interval '1 hour' FROM generate_series(1, 7) g`)
	// A live row stays, and is not counted.
	exec(t, pool, `INSERT INTO processed_messages (consumer, message_id, expires_at) VALUES ('mailer', 'live', now() + interval '1 hour')`)

	sw := postgres.NewSweeper(pool, postgres.WithBatchSize(10), postgres.WithPause(0),
		postgres.WithMeterProvider(tel.mp), postgres.WithTracerProvider(tel.tp))
	for range 2 { // the second pass finds nothing
		if _, err := sw.Sweep(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	m := tel.collect(t)
	for table, want := range map[string]int64{"idempotency_keys": 25, "processed_messages": 7} {
		if got := m["idem.sweeper.deleted"][attrs("idem.table", table)].value; got != want {
			t.Errorf("idem.sweeper.deleted{idem.table=%s} = %d, want %d", table, got, want)
		}
	}
	if p := m["idem.sweeper.pass.duration"][""]; p.count != 2 || p.sum <= 0 {
		t.Errorf("idem.sweeper.pass.duration: %d passes, %v s in all; want 2 passes timed", p.count, p.sum)
	}
	var deleted []int64
	for _, s := range tel.spans.Ended() {
		if s.Name() != "idem.sweeper.pass" {
			continue
		}
		for _, kv := range s.Attributes() {
			if kv.Key == "idem.deleted" {
				deleted = append(deleted, kv.Value.AsInt64())
			}
		}
	}
	if len(deleted) != 2 || deleted[0] != 32 || deleted[1] != 0 {
		t.Errorf("the passes' spans say they deleted %v rows, want [32 0]", deleted)
	}
	var left int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM idempotency_keys) + (SELECT count(*) FROM processed_messages)`).Scan(&left); err != nil || left != 1 {
		t.Errorf("%d rows left, %v; want the live one", left, err)
	}
	wantNoSecrets(t, tel, secret)
}

// TestInboxMetrics: the inbox counts processed messages and duplicates in
// idem.inbox.messages, by consumer, and records a span for each.
func TestInboxMetrics(t *testing.T) {
	tel := newTelemetry(t)
	pool := pgtest.NewPool(t)
	exec(t, pool, `CREATE TABLE shipments (message_id text PRIMARY KEY)`)
	in := inbox.New(pool, "shipper", inbox.WithMeterProvider(tel.mp), inbox.WithTracerProvider(tel.tp))
	ship := func(id string) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(context.Background(), `INSERT INTO shipments VALUES ($1)`, id)
			return err
		}
	}
	for _, id := range []string{"msg-" + secret + "-1", "msg-" + secret + "-2", "msg-" + secret + "-1", "msg-" + secret + "-1"} {
		if _, err := in.ProcessOnce(context.Background(), id, ship(id)); err != nil {
			t.Fatal(err)
		}
	}
	// An invalid id is neither processed nor a duplicate.
	if _, err := in.ProcessOnce(context.Background(), "", ship("")); err == nil {
		t.Fatal("ProcessOnce of an empty id succeeded")
	}
	m := tel.collect(t)["idem.inbox.messages"]
	for outcome, want := range map[string]int64{"processed": 2, "duplicate": 2} {
		if got := m[attrs("idem.consumer", "shipper", "idem.result", outcome)].value; got != want {
			t.Errorf("idem.inbox.messages{idem.result=%s} = %d, want %d", outcome, got, want)
		}
	}
	if len(m) != 2 {
		t.Errorf("idem.inbox.messages has %d series, want 2: %v", len(m), describe(m))
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM shipments`).Scan(&rows); err != nil || rows != 2 {
		t.Errorf("%d shipments, %v; want 2", rows, err)
	}
	outcomes := map[string]int{}
	for _, s := range tel.spans.Ended() {
		if s.Name() != "idem.inbox.process" {
			continue
		}
		for _, kv := range s.Attributes() {
			if kv.Key == "idem.result" {
				outcomes[kv.Value.AsString()]++
			}
		}
	}
	if outcomes["processed"] != 2 || outcomes["duplicate"] != 2 {
		t.Errorf("spans of idem.inbox.process by outcome: %v, want 2 and 2", outcomes)
	}
	wantNoSecrets(t, tel, secret)
}
