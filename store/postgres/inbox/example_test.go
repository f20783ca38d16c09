package inbox_test

import (
	"context"
	"errors"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/inbox"
)

func ExampleInbox_ProcessOnce() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := postgres.Migrate(ctx, pool); err != nil { // processed_messages
		log.Fatal(err)
	}
	// The broker redelivers for at most a day; keep ids for a week.
	in := inbox.New(pool, "shipping", inbox.WithRetention(7*24*time.Hour))

	// For each delivery: the id is the one the producer assigned (for NATS
	// JetStream, the Nats-Msg-Id header), never a broker sequence number.
	handle := func(ctx context.Context, msgID, orderID string, ack, deadLetter func() error) error {
		_, err := in.ProcessOnce(ctx, msgID, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, orderID)
			return err
		})
		switch {
		case errors.Is(err, inbox.ErrInvalidMessageID):
			return deadLetter() // no delivery can store this id (JetStream: Term)
		case err != nil:
			return err // no ack: the broker redelivers
		}
		return ack() // after commit, processed now or before
	}
	_ = handle
}
