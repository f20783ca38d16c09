package inbox_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	internalpgtest "github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/store/postgres/inbox"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

var ctx = context.Background()

// count runs a query of one integer.
var count = internalpgtest.Count

// newInboxDB returns a pool on a fresh migrated database with a table for
// the consumer's side effects.
func newInboxDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.NewPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE shipments (order_id text, consumer text)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// ship is a side effect: one shipments row for the message.
func ship(id, consumer string) func(pgx.Tx) error {
	return func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id, consumer) VALUES ($1, $2)`, id, consumer)
		return err
	}
}

func TestInboxProcessesOnce(t *testing.T) {
	pool := newInboxDB(t)
	in := inbox.New(pool, "shipping")

	dup, err := in.ProcessOnce(ctx, "order-1", ship("order-1", "shipping"))
	if err != nil || dup {
		t.Fatalf("first delivery: duplicate=%v err=%v, want false, nil", dup, err)
	}
	var ran bool
	dup, err = in.ProcessOnce(ctx, "order-1", func(pgx.Tx) error { ran = true; return nil })
	if err != nil || !dup {
		t.Fatalf("redelivery: duplicate=%v err=%v, want true, nil", dup, err)
	}
	if ran {
		t.Fatal("the side effect of a redelivered message ran again")
	}
	if n := count(t, pool, `SELECT count(*) FROM shipments WHERE order_id = 'order-1'`); n != 1 {
		t.Fatalf("%d shipments, want 1", n)
	}

	// Another consumer of the same message applies it on its own.
	other := inbox.New(pool, "ledger")
	if dup, err := other.ProcessOnce(ctx, "order-1", ship("order-1", "ledger")); err != nil || dup {
		t.Fatalf("other consumer: duplicate=%v err=%v, want false, nil", dup, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages WHERE message_id = 'order-1'`); n != 2 {
		t.Fatalf("%d processed_messages rows, want one per consumer", n)
	}
}

func TestInboxFailureRecordsNothing(t *testing.T) {
	pool := newInboxDB(t)
	in := inbox.New(pool, "shipping")
	boom := errors.New("warehouse down")

	_, err := in.ProcessOnce(ctx, "order-2", func(tx pgx.Tx) error {
		if err := ship("order-2", "shipping")(tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the side effect's error", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("panic did not propagate")
			}
		}()
		_, _ = in.ProcessOnce(ctx, "order-2", func(tx pgx.Tx) error {
			_ = ship("order-2", "shipping")(tx)
			panic("handler bug")
		})
	}()
	if n := count(t, pool, `SELECT count(*) FROM processed_messages`) + count(t, pool, `SELECT count(*) FROM shipments`); n != 0 {
		t.Fatalf("a failed message left %d rows behind", n)
	}
	// The redelivery runs it.
	if dup, err := in.ProcessOnce(ctx, "order-2", ship("order-2", "shipping")); err != nil || dup {
		t.Fatalf("redelivery after failure: duplicate=%v err=%v, want false, nil", dup, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM shipments`); n != 1 {
		t.Fatalf("%d shipments, want 1", n)
	}
}

// TestInboxRefusesIDsItCannotStore: an id that PostgreSQL would refuse on
// every delivery (too long for the primary key's index, not UTF-8, with a
// NUL byte) is refused before the database, with ErrInvalidMessageID, so
// that the consumer dead-letters the message instead of having it
// redelivered for ever. Ids at the bound are stored, even alongside the
// longest consumer name.
func TestInboxRefusesIDsItCannotStore(t *testing.T) {
	pool := newInboxDB(t)
	longest := strings.Repeat("c", 255)
	for name, c := range map[string]struct {
		consumer, id string
		ok           bool
	}{
		"longest id, incompressible":                {"shipping", incompressible(inbox.MaxMessageIDLength), true},
		"longest id and consumer name":              {longest, incompressible(inbox.MaxMessageIDLength), true},
		"longest id, two-byte characters":           {"shipping", strings.Repeat("é", inbox.MaxMessageIDLength/2), true},
		"one byte too long":                         {"shipping", incompressible(inbox.MaxMessageIDLength + 1), false},
		"one byte too long, two-byte characters":    {"shipping", "x" + strings.Repeat("é", inbox.MaxMessageIDLength/2), false},
		"3 KB, incompressible":                      {"shipping", incompressible(3 << 10), false},
		"invalid UTF-8":                             {"shipping", "bad-\xff\xfe", false},
		"Latin-1, not UTF-8":                        {"shipping", "caf\xe9", false},
		"NUL byte":                                  {"shipping", "a\x00b", false},
		"valid UTF-8 with letters of other scripts": {"shipping", "заказ-1001-注文", true},
	} {
		t.Run(name, func(t *testing.T) {
			var ran bool
			rows := count(t, pool, `SELECT count(*) FROM processed_messages`)
			dup, err := inbox.New(pool, c.consumer).ProcessOnce(ctx, c.id, func(pgx.Tx) error { ran = true; return nil })
			if !c.ok {
				if !errors.Is(err, inbox.ErrInvalidMessageID) || ran || dup {
					t.Fatalf("err = %v, ran = %v, duplicate = %v; want ErrInvalidMessageID and no side effect", err, ran, dup)
				}
				if n := count(t, pool, `SELECT count(*) FROM processed_messages`); n != rows {
					t.Fatalf("%d rows recorded, want none", n-rows)
				}
				return
			}
			if err != nil || !ran || dup {
				t.Fatalf("err = %v, ran = %v, duplicate = %v; want the message processed", err, ran, dup)
			}
			if dup, err := inbox.New(pool, c.consumer).ProcessOnce(ctx, c.id, func(pgx.Tx) error { return nil }); err != nil || !dup {
				t.Fatalf("redelivery: duplicate = %v, err = %v; want a duplicate", dup, err)
			}
		})
	}
}

func TestInboxRequiresMessageID(t *testing.T) {
	pool := newInboxDB(t)
	var ran bool
	_, err := inbox.New(pool, "shipping").ProcessOnce(ctx, "", func(pgx.Tx) error { ran = true; return nil })
	if !errors.Is(err, inbox.ErrNoMessageID) || !errors.Is(err, inbox.ErrInvalidMessageID) || ran {
		t.Fatalf("err = %v, ran = %v; want ErrNoMessageID, an ErrInvalidMessageID, and no side effect", err, ran)
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("%d rows recorded, want 0", n)
	}
}

// TestInboxRefusesConsumerNamesItCannotStore: a consumer name follows the
// rule of message ids, with at most 255 bytes. An inbox with another fails
// every message, with an error that is not ErrInvalidMessageID: the
// messages are fine, the consumer is misconfigured, and dead-lettering
// them would lose them.
func TestInboxRefusesConsumerNamesItCannotStore(t *testing.T) {
	pool := newInboxDB(t)
	for name, consumer := range map[string]string{
		"empty":          "",
		"256 bytes":      strings.Repeat("c", 256),
		"invalid UTF-8":  "ship\xffping",
		"NUL byte":       "ship\x00ping",
		"1 KB, like ids": incompressible(inbox.MaxMessageIDLength),
	} {
		t.Run(name, func(t *testing.T) {
			in := inbox.New(pool, consumer)
			for _, id := range []string{"order-3", "", "bad-\xff"} {
				var ran bool
				_, err := in.ProcessOnce(ctx, id, func(pgx.Tx) error { ran = true; return nil })
				if err == nil || errors.Is(err, inbox.ErrInvalidMessageID) || ran {
					t.Fatalf("message %q: err = %v, ran = %v; want an error about the consumer name, not the id", id, err, ran)
				}
				if !strings.Contains(err.Error(), "consumer name") {
					t.Fatalf("message %q: err = %v; want it to say the consumer name is wrong", id, err)
				}
			}
		})
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("%d rows recorded, want 0", n)
	}
}

// incompressible returns n bytes of random letters and digits, which
// PostgreSQL cannot compress below the btree's row size limit.
func incompressible(n int) string {
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(rand.Text())
	}
	return b.String()[:n]
}

// TestInboxConcurrentDuplicates: copies of a message delivered at once to
// several workers are applied once; copies that arrive while the first is
// still open wait for it.
func TestInboxConcurrentDuplicates(t *testing.T) {
	pool := newInboxDB(t)
	in := inbox.New(pool, "shipping")
	const copies = 20
	var (
		wg, called sync.WaitGroup
		runs, dups atomic.Int32
		errs       = make(chan error, copies)
	)
	called.Add(copies)
	for range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			called.Done()
			dup, err := in.ProcessOnce(ctx, "order-4", func(tx pgx.Tx) error {
				runs.Add(1)
				called.Wait() // hold the row until every copy was delivered
				return ship("order-4", "shipping")(tx)
			})
			if err != nil {
				errs <- err
			}
			if dup {
				dups.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if runs.Load() != 1 || dups.Load() != copies-1 {
		t.Fatalf("side effect ran %d times with %d duplicates, want 1 and %d", runs.Load(), dups.Load(), copies-1)
	}
	if n := count(t, pool, `SELECT count(*) FROM shipments`); n != 1 {
		t.Fatalf("%d shipments, want 1", n)
	}
}

// TestInboxWaiterTakesOverAfterRollback: a duplicate waiting on a first
// delivery that then fails processes the message itself.
func TestInboxWaiterTakesOverAfterRollback(t *testing.T) {
	pool := newInboxDB(t)
	in := inbox.New(pool, "shipping")
	holding, fail := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := in.ProcessOnce(ctx, "order-5", func(pgx.Tx) error {
			close(holding)
			<-fail
			return errors.New("crashed")
		})
		first <- err
	}()
	<-holding

	second := make(chan bool, 1)
	var secondRan atomic.Bool
	go func() {
		dup, err := in.ProcessOnce(ctx, "order-5", func(tx pgx.Tx) error {
			secondRan.Store(true)
			return ship("order-5", "shipping")(tx)
		})
		if err != nil {
			t.Error(err)
		}
		second <- dup
	}()
	// Wait until the duplicate is blocked on the first one's row.
	internalpgtest.WaitForLockWait(t, pool, "the duplicate")
	close(fail)
	if err := <-first; err == nil {
		t.Fatal("first delivery succeeded, want its error")
	}
	if dup := <-second; dup || !secondRan.Load() {
		t.Fatalf("waiting duplicate: duplicate=%v ran=%v, want it to process the message", dup, secondRan.Load())
	}
	if n := count(t, pool, `SELECT count(*) FROM shipments`); n != 1 {
		t.Fatalf("%d shipments, want 1", n)
	}
}

func TestInboxRetention(t *testing.T) {
	pool := newInboxDB(t)
	const week = 7 * 24 * time.Hour // the default, as WithRetention documents it
	for _, c := range []struct {
		consumer string
		opts     []inbox.Option
		want     time.Duration
	}{
		{"default", nil, week},
		{"thirty-days", []inbox.Option{inbox.WithRetention(30 * 24 * time.Hour)}, 30 * 24 * time.Hour},
		{"non-positive", []inbox.Option{inbox.WithRetention(0)}, week},
	} {
		if _, err := inbox.New(pool, c.consumer, c.opts...).ProcessOnce(ctx, "m", func(pgx.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
		var processedAt, expiresAt time.Time
		if err := pool.QueryRow(ctx, `SELECT processed_at, expires_at FROM processed_messages WHERE consumer = $1`, c.consumer).Scan(&processedAt, &expiresAt); err != nil {
			t.Fatal(err)
		}
		if kept := expiresAt.Sub(processedAt); kept != c.want {
			t.Errorf("%s: expires_at - processed_at = %v, want %v", c.consumer, kept, c.want)
		}
	}
}

// TestInboxInsertSuppressedIsNotDuplicate: a BEFORE INSERT trigger (or a
// rule) that silently drops the processed_messages row must not make a new
// message look processed: the consumer would acknowledge a message whose
// side effects never ran. ProcessOnce fails instead, so that the broker
// redelivers the message.
func TestInboxInsertSuppressedIsNotDuplicate(t *testing.T) {
	pool := newInboxDB(t)
	if _, err := pool.Exec(ctx, `
CREATE FUNCTION drop_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER drop_row BEFORE INSERT ON processed_messages FOR EACH ROW EXECUTE FUNCTION drop_row()`); err != nil {
		t.Fatal(err)
	}
	in := inbox.New(pool, "shipping")
	var ran bool
	dup, err := in.ProcessOnce(ctx, "order-9", func(pgx.Tx) error { ran = true; return nil })
	if dup || err == nil {
		t.Fatalf("duplicate=%v err=%v, want false and an error", dup, err)
	}
	if !strings.Contains(err.Error(), "processed_messages") {
		t.Errorf("err = %v, want it to name processed_messages", err)
	}
	if ran {
		t.Error("the side effect ran although the message id was not recorded")
	}
}
