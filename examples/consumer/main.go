// Binary consumer demonstrates exactly-once side effects on an
// at-least-once broker, NATS JetStream: a producer publishes OrderPlaced
// events with Nats-Msg-Id set to an id it assigns, and a consumer inserts a
// shipment and the id in one PostgreSQL transaction, acknowledging only
// after the commit. It publishes an event twice, crashes a consumer between
// its commit and its ack, prints every delivery and the shipments
// afterwards, and exits non-zero if an event shipped twice.
//
//	go run ./examples/consumer
//
// It needs NATS with JetStream at $NATS_URL (default nats://127.0.0.1:4222;
// start one with `nats-server -js`) and PostgreSQL at $DATABASE_URL, the
// libpq defaults, or a throwaway cluster (see package
// github.com/idemkit/idem/store/postgres/pgtest). The stream and the
// database it creates are deleted at the end.
package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/examples/consumer/shipping"
	"github.com/idemkit/idem/internal/pgtest"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
}

func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return nats.DefaultURL
}

// connect returns a JetStream context on a new connection, as a consumer
// process would have.
func connect() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(natsURL(), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, nil, fmt.Errorf("NATS is not reachable at %s (%w); start one with `nats-server -js` or set NATS_URL", natsURL(), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

func run(ctx context.Context, w io.Writer) error {
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	dsn, drop, err := pg.CreateDatabase(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = drop(context.WithoutCancel(ctx)) }()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := shipping.Migrate(ctx, pool); err != nil {
		return err
	}

	nc, js, err := connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	suffix := rand.Text()[:10]
	subject := "idemdemo." + suffix + ".orders"
	streamCfg := shipping.StreamConfig("IDEMDEMO_"+suffix, subject)
	// A short ack wait, so that the crashed consumer's message comes back
	// within the demo.
	consCfg := shipping.ConsumerConfig("shipping", time.Second)
	if err := shipping.CheckRetention(streamCfg, consCfg, shipping.Retention); err != nil {
		return err
	}
	if _, err := js.CreateStream(ctx, streamCfg); err != nil {
		return fmt.Errorf("creating the stream (is JetStream enabled? start nats-server with -js): %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), streamCfg.Name) }()
	if _, err := js.CreateOrUpdateConsumer(ctx, streamCfg.Name, consCfg); err != nil {
		return err
	}

	// The producer: three events, the second published twice (a retry
	// after a lost PubAck); JetStream drops the copy within its window.
	evs := []shipping.OrderPlaced{
		shipping.NewOrderPlaced("order-1001", "sku-espresso-beans", 2),
		shipping.NewOrderPlaced("order-1002", "sku-grinder", 1),
		shipping.NewOrderPlaced("order-1003", "sku-filters", 5),
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PUBLISHED\tNATS-MSG-ID\tSTREAM SEQ\tDROPPED AS DUPLICATE")
	for _, ev := range append(evs, evs[1]) {
		ack, err := shipping.Publish(ctx, js, subject, ev)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%v\n", ev.OrderID, ev.ID, ack.Sequence, ack.Duplicate)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	consumer := shipping.NewConsumer(pool)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nCONSUMER\tORDER\tDELIVERY\tOUTCOME")

	// Consumer A commits the first shipment and crashes before its ack.
	ncA, jsA, err := connect()
	if err != nil {
		return err
	}
	consA, err := jsA.Consumer(ctx, streamCfg.Name, "shipping")
	if err != nil {
		return err
	}
	batch, err := consA.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		return err
	}
	for msg := range batch.Messages() {
		if _, err := consumer.Apply(ctx, msg); err != nil {
			return err
		}
		meta, _ := msg.Metadata()
		fmt.Fprintf(tw, "A\t%s\t%d\tshipped, committed, crashed before ack\n", orderOf(evs, msg), meta.NumDelivered)
	}
	ncA.Close()

	// Consumer B takes over: the unacknowledged message comes back after
	// the ack wait and is skipped; the others ship.
	ncB, jsB, err := connect()
	if err != nil {
		return err
	}
	defer ncB.Close()
	consB, err := jsB.Consumer(ctx, streamCfg.Name, "shipping")
	if err != nil {
		return err
	}
	for handled := 0; handled < len(evs); {
		batch, err := consB.Fetch(len(evs), jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			return err
		}
		for msg := range batch.Messages() {
			dup, err := consumer.Handle(ctx, msg)
			if err != nil {
				return err
			}
			meta, _ := msg.Metadata()
			outcome := "shipped, committed, acked"
			if dup {
				outcome = "already processed: skipped, acked"
			}
			fmt.Fprintf(tw, "B\t%s\t%d\t%s\n", orderOf(evs, msg), meta.NumDelivered, outcome)
			handled++
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	var failed []string
	fmt.Fprintln(w)
	for _, ev := range evs {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM shipments WHERE event_id = $1`, ev.ID).Scan(&n); err != nil {
			return err
		}
		fmt.Fprintf(w, "shipments for %s: %d\n", ev.OrderID, n)
		if n != 1 {
			failed = append(failed, fmt.Sprintf("%d shipments for %s, want 1", n, ev.OrderID))
		}
	}
	window, err := shipping.RedeliveryWindow(streamCfg, consCfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "processed message ids are kept for %v; the broker redelivers for at most %v\n", shipping.Retention, window)
	if len(failed) > 0 {
		return fmt.Errorf("%s", strings.Join(failed, "; "))
	}
	fmt.Fprintln(w, "exactly once: every event shipped once")
	return nil
}

func orderOf(evs []shipping.OrderPlaced, msg jetstream.Msg) string {
	id := msg.Headers().Get(jetstream.MsgIDHeader)
	for _, ev := range evs {
		if ev.ID == id {
			return ev.OrderID
		}
	}
	return "?"
}
