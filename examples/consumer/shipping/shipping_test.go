package shipping_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/examples/consumer/shipping"
	"github.com/idemkit/idem/store/postgres/inbox"
	"github.com/idemkit/idem/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return nats.DefaultURL
}

// connect opens a connection to NATS with JetStream, or fails the test
// saying how to start one. It never skips: the consumer tests are the
// evidence that redeliveries are handled.
func connect(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(natsURL(), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("NATS is not reachable at %s (%v).\nThese tests need a NATS server with JetStream: start one with `nats-server -js`, or set NATS_URL to one.", natsURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Fatalf("NATS at %s has no JetStream (%v): start the server with `nats-server -js`.", natsURL(), err)
	}
	return nc, js
}

// newStream creates a stream of the test's own on a subject of its own,
// deleted when the test ends (other test runs share the server).
func newStream(t *testing.T, js jetstream.JetStream, duplicates time.Duration) (jetstream.StreamConfig, string) {
	t.Helper()
	suffix := rand.Text()[:10]
	subject := "idemtest." + suffix + ".orders"
	cfg := shipping.StreamConfig("IDEMTEST_"+suffix, subject)
	cfg.MaxAge = time.Hour
	if duplicates > 0 {
		cfg.Duplicates = duplicates
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), cfg.Name) })
	return cfg, subject
}

func newDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.NewPool(t)
	if err := shipping.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func fetchOne(t *testing.T, cons jetstream.Consumer, wait time.Duration) jetstream.Msg {
	t.Helper()
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(wait))
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		return msg
	}
	t.Fatalf("no message within %v (%v)", wait, batch.Error())
	return nil
}

// TestCrashAfterCommitBeforeAck: the consumer commits the shipment and
// dies before acknowledging. JetStream delivers the message again after the
// ack wait; the next consumer finds its id, skips the side effect and
// acknowledges it.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := newDB(t)
	_, js := connect(t)
	stream, subject := newStream(t, js, 0)
	const ackWait = time.Second
	ev := shipping.NewOrderPlaced("order-1", "sku-1", 2)
	if _, err := shipping.Publish(ctx, js, subject, ev); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, stream.Name, shipping.ConsumerConfig("shipping", ackWait)); err != nil {
		t.Fatal(err)
	}

	// The first consumer process: commit, then crash without acking.
	crashing, crashingJS := connect(t)
	cons, err := crashingJS.Consumer(ctx, stream.Name, "shipping")
	if err != nil {
		t.Fatal(err)
	}
	msg := fetchOne(t, cons, 10*time.Second)
	if dup, err := shipping.NewConsumer(pool).Apply(ctx, msg); err != nil || dup {
		t.Fatalf("first delivery: duplicate=%v err=%v", dup, err)
	}
	crashing.Close()

	// Its replacement gets the message again.
	_, js2 := connect(t)
	cons, err = js2.Consumer(ctx, stream.Name, "shipping")
	if err != nil {
		t.Fatal(err)
	}
	again := fetchOne(t, cons, 10*ackWait)
	meta, err := again.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if meta.NumDelivered != 2 {
		t.Fatalf("redelivery has NumDelivered %d, want 2", meta.NumDelivered)
	}
	dup, err := shipping.NewConsumer(pool).Handle(ctx, again)
	if err != nil || !dup {
		t.Fatalf("redelivery: duplicate=%v err=%v, want it skipped and acked", dup, err)
	}

	if n := count(t, pool, `SELECT count(*) FROM shipments WHERE event_id = $1`, ev.ID); n != 1 {
		t.Fatalf("%d shipments for the event, want 1", n)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.AckFloor.Stream != meta.Sequence.Stream {
		t.Fatalf("after the ack: %d pending, ack floor %d; want 0 pending and floor %d", info.NumAckPending, info.AckFloor.Stream, meta.Sequence.Stream)
	}
	// Acknowledged for good: no third delivery after another ack wait.
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(3*ackWait))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		t.Fatalf("message delivered again after its ack: %s", m.Headers().Get(jetstream.MsgIDHeader))
	}
}

// TestBurstOfDuplicatePublishes: a producer publishes each event several
// times, in bursts (which JetStream's duplicate window drops) and again
// after the window (which it stores and delivers). Three consumer
// instances share the work; every event ships once.
func TestBurstOfDuplicatePublishes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := newDB(t)
	_, js := connect(t)
	const window = 100 * time.Millisecond // the shortest JetStream accepts
	stream, subject := newStream(t, js, window)
	if _, err := js.CreateOrUpdateConsumer(ctx, stream.Name, shipping.ConsumerConfig("shipping", 5*time.Second)); err != nil {
		t.Fatal(err)
	}

	const events, rounds, copies = 10, 3, 3
	var evs []shipping.OrderPlaced
	for i := range events {
		evs = append(evs, shipping.NewOrderPlaced(fmt.Sprintf("order-%d", i), "sku", 1))
	}
	var stored, dropped atomic.Int32
	for r := range rounds {
		if r > 0 {
			time.Sleep(4 * window) // past the duplicate window: the broker stores the next copies
		}
		var wg sync.WaitGroup
		for _, ev := range evs {
			for range copies {
				wg.Go(func() {
					ack, err := shipping.Publish(ctx, js, subject, ev)
					if err != nil {
						t.Error(err)
						return
					}
					if ack.Duplicate {
						dropped.Add(1)
					} else {
						stored.Add(1)
					}
				})
			}
		}
		wg.Wait()
	}
	if stored.Load() <= events {
		t.Fatalf("the broker stored %d messages for %d events: no duplicate reached the consumer, so this run tested nothing", stored.Load(), events)
	}

	var handled, duplicates atomic.Int32
	consumer := shipping.NewConsumer(pool)
	for range 3 {
		_, js := connect(t)
		cons, err := js.Consumer(ctx, stream.Name, "shipping")
		if err != nil {
			t.Fatal(err)
		}
		cc, err := cons.Consume(func(msg jetstream.Msg) {
			dup, err := consumer.Handle(ctx, msg)
			if err != nil {
				t.Error(err)
				return
			}
			if dup {
				duplicates.Add(1)
			}
			handled.Add(1)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cc.Stop)
	}
	for handled.Load() < stored.Load() {
		if ctx.Err() != nil {
			t.Fatalf("handled %d of %d stored messages", handled.Load(), stored.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}

	t.Logf("%d publishes: %d dropped by the broker, %d delivered, %d skipped by the inbox",
		events*rounds*copies, dropped.Load(), stored.Load(), duplicates.Load())
	if want := stored.Load() - events; duplicates.Load() != want {
		t.Errorf("%d duplicates skipped, want %d", duplicates.Load(), want)
	}
	for _, ev := range evs {
		if n := count(t, pool, `SELECT count(*) FROM shipments WHERE event_id = $1`, ev.ID); n != 1 {
			t.Errorf("%d shipments for %s, want 1", n, ev.OrderID)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM shipments`); n != events {
		t.Errorf("%d shipments, want %d", n, events)
	}
}

// TestRetentionOutlastsRedelivery: processed ids are kept past the longest
// time the broker, as configured on the server, could redeliver.
func TestRetentionOutlastsRedelivery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := newDB(t)
	_, js := connect(t)
	streamCfg, subject := newStream(t, js, 0)
	cons, err := js.CreateOrUpdateConsumer(ctx, streamCfg.Name, shipping.ConsumerConfig("shipping", 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ev := shipping.NewOrderPlaced("order-1", "sku", 1)
	if _, err := shipping.Publish(ctx, js, subject, ev); err != nil {
		t.Fatal(err)
	}
	if _, err := shipping.NewConsumer(pool).Handle(ctx, fetchOne(t, cons, 10*time.Second)); err != nil {
		t.Fatal(err)
	}

	// The configurations as the broker holds them.
	stream, err := js.Stream(ctx, streamCfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	sInfo, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cInfo, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	window, err := shipping.RedeliveryWindow(sInfo.Config, cInfo.Config)
	if err != nil {
		t.Fatal(err)
	}
	var kept time.Duration
	if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - processed_at)::float8 * interval '1 second' FROM processed_messages WHERE consumer = $1 AND message_id = $2`,
		shipping.ConsumerName, ev.ID).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	if kept != shipping.Retention || kept <= window {
		t.Fatalf("id kept for %v; want %v, longer than the redelivery window %v", kept, shipping.Retention, window)
	}
	if err := shipping.CheckRetention(sInfo.Config, cInfo.Config, shipping.Retention); err != nil {
		t.Fatal(err)
	}
	if err := shipping.CheckRetention(sInfo.Config, cInfo.Config, window/2); err == nil {
		t.Fatal("CheckRetention accepted a retention shorter than the redelivery window")
	}
	unbounded := sInfo.Config
	unbounded.MaxAge = 0
	forever := cInfo.Config
	forever.MaxDeliver = -1
	if err := shipping.CheckRetention(unbounded, forever, shipping.Retention); err == nil {
		t.Fatal("CheckRetention accepted a broker that redelivers forever")
	}
}

// TestMessageWithUnstorableID: a message published without Nats-Msg-Id
// cannot be deduplicated, and one whose id is longer than the inbox can
// store never could be; each is refused and terminated (dead-lettered),
// not applied and not redelivered for ever.
func TestMessageWithUnstorableID(t *testing.T) {
	for name, id := range map[string]string{
		"no id":        "",
		"2 KB id":      strings.Repeat("i", 2<<10),
		"longest id+1": strings.Repeat("i", inbox.MaxMessageIDLength+1),
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pool := newDB(t)
			_, js := connect(t)
			stream, subject := newStream(t, js, 0)
			var opts []jetstream.PublishOpt
			if id != "" {
				opts = append(opts, jetstream.WithMsgID(id))
			}
			ack, err := js.Publish(ctx, subject, []byte(`{"order_id":"order-1","sku":"sku","quantity":1}`), opts...)
			if err != nil {
				t.Fatal(err)
			}
			cons, err := js.CreateOrUpdateConsumer(ctx, stream.Name, shipping.ConsumerConfig("shipping", 30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			_, err = shipping.NewConsumer(pool).Handle(ctx, fetchOne(t, cons, 10*time.Second))
			if !errors.Is(err, inbox.ErrInvalidMessageID) || (id == "") != errors.Is(err, inbox.ErrNoMessageID) {
				t.Fatalf("err = %v, want ErrInvalidMessageID (ErrNoMessageID without an id)", err)
			}
			if n := count(t, pool, `SELECT count(*) FROM shipments`) + count(t, pool, `SELECT count(*) FROM processed_messages`); n != 0 {
				t.Fatalf("%d rows written for a message with an unstorable id, want 0", n)
			}
			// Terminated: the consumer's ack floor passes the message and
			// nothing awaits redelivery (Term is not confirmed, so wait for
			// the server to apply it). A Nak would leave it pending.
			deadline := time.Now().Add(10 * time.Second)
			for {
				info, err := cons.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if info.AckFloor.Stream >= ack.Sequence && info.NumAckPending == 0 && info.NumPending == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the message was not terminated: ack floor %d, %d pending acks, %d pending", info.AckFloor.Stream, info.NumAckPending, info.NumPending)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
