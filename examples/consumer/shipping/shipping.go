// Package shipping is the consumer example of idem: a NATS JetStream
// consumer that creates one shipment per OrderPlaced event, however often
// the broker delivers it. The producer gives each event an id and sends it
// as the Nats-Msg-Id header; the consumer records the id with
// inbox.Inbox in the transaction that inserts the shipment, and
// acknowledges the message only after that transaction commits.
package shipping

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/inbox"
)

//go:embed schema.sql
var schema string

// Migrate applies idem's migrations (processed_messages) and the shipments
// table to db.
func Migrate(ctx context.Context, db *pgxpool.Pool) error {
	if err := postgres.Migrate(ctx, db); err != nil {
		return err
	}
	_, err := db.Exec(ctx, schema)
	return err
}

// ConsumerName scopes the consumer's message ids in processed_messages.
const ConsumerName = "shipping"

// Retention is how long the consumer's inbox keeps a processed message's
// id (inbox.WithRetention): 7 days, which must outlast the broker's
// redelivery window (see CheckRetention).
const Retention = 7 * 24 * time.Hour

// OrderPlaced is the event the consumer applies.
type OrderPlaced struct {
	// ID is assigned by the producer when it creates the event and sent as
	// Nats-Msg-Id; every publish of the event, retries included, carries it.
	ID       string `json:"id"`
	OrderID  string `json:"order_id"`
	SKU      string `json:"sku"`
	Quantity int32  `json:"quantity"`
}

// NewOrderPlaced returns an event with a new id.
func NewOrderPlaced(orderID, sku string, quantity int32) OrderPlaced {
	return OrderPlaced{ID: uuid.Must(uuid.NewV7()).String(), OrderID: orderID, SKU: sku, Quantity: quantity}
}

// Publish publishes ev to subject with Nats-Msg-Id set to ev.ID. Within
// the stream's duplicate window JetStream drops a second publish with the
// same id (the PubAck says Duplicate); after it, the consumer's inbox does.
func Publish(ctx context.Context, js jetstream.JetStream, subject string, ev OrderPlaced) (*jetstream.PubAck, error) {
	data, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	return js.Publish(ctx, subject, data, jetstream.WithMsgID(ev.ID))
}

// StreamConfig returns the stream the example uses: messages are kept for
// a day, and JetStream drops re-published ids for two minutes.
func StreamConfig(name string, subjects ...string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       name,
		Subjects:   subjects,
		MaxAge:     24 * time.Hour,
		Duplicates: 2 * time.Minute,
	}
}

// ConsumerConfig returns a durable consumer with explicit acks: a message
// not acknowledged within ackWait is delivered again, up to 20 times.
func ConsumerConfig(durable string, ackWait time.Duration) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:    durable,
		AckPolicy:  jetstream.AckExplicitPolicy,
		AckWait:    ackWait,
		MaxDeliver: 20,
	}
}

// RedeliveryWindow returns how long after its first delivery a message
// can be delivered again: until the consumer gives up on it (ack wait, or
// its backoff steps, times the deliveries left) or the stream drops it
// (max age), whichever comes first. It fails when neither bounds it.
func RedeliveryWindow(s jetstream.StreamConfig, c jetstream.ConsumerConfig) (time.Duration, error) {
	var window time.Duration
	if c.MaxDeliver > 0 {
		ackWait := c.AckWait
		if ackWait == 0 {
			ackWait = 30 * time.Second // JetStream's default
		}
		for i := range c.MaxDeliver {
			if i < len(c.BackOff) {
				window += c.BackOff[i]
			} else {
				window += ackWait
			}
		}
	}
	if s.MaxAge > 0 && (window == 0 || s.MaxAge < window) {
		window = s.MaxAge
	}
	if window == 0 {
		return 0, errors.New("shipping: the stream keeps messages forever and the consumer redelivers them forever; set MaxAge or MaxDeliver")
	}
	return window, nil
}

// CheckRetention fails unless the inbox keeps ids longer than the
// consumer can redeliver a message.
func CheckRetention(s jetstream.StreamConfig, c jetstream.ConsumerConfig, retention time.Duration) error {
	window, err := RedeliveryWindow(s, c)
	if err != nil {
		return err
	}
	if retention <= window {
		return fmt.Errorf("shipping: message ids are kept for %v, but the broker may redeliver for %v", retention, window)
	}
	return nil
}

// Consumer applies OrderPlaced events.
type Consumer struct {
	inbox *inbox.Inbox
}

// NewConsumer returns a consumer that records shipments and processed
// message ids in db, keeping the ids for Retention unless opts say
// otherwise.
func NewConsumer(db *pgxpool.Pool, opts ...inbox.Option) *Consumer {
	opts = append([]inbox.Option{inbox.WithRetention(Retention)}, opts...)
	return &Consumer{inbox: inbox.New(db, ConsumerName, opts...)}
}

// Apply inserts the shipment of msg and records its id, in one
// transaction, unless the id was recorded before (duplicate). It does not
// acknowledge msg.
func (c *Consumer) Apply(ctx context.Context, msg jetstream.Msg) (duplicate bool, err error) {
	var ev OrderPlaced
	if err := json.Unmarshal(msg.Data(), &ev); err != nil {
		return false, fmt.Errorf("shipping: decoding %s: %w", msg.Subject(), err)
	}
	// The id is the producer's, from the header; the stream sequence and the
	// delivery count in msg.Metadata() change between deliveries.
	id := msg.Headers().Get(jetstream.MsgIDHeader)
	return c.inbox.ProcessOnce(ctx, id, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx,
			`INSERT INTO shipments (event_id, order_id, sku, quantity) VALUES ($1, $2, $3, $4)`,
			id, ev.OrderID, ev.SKU, ev.Quantity)
		return err
	})
}

// Handle applies msg and then acknowledges it, waiting for the server to
// confirm the ack. A message that fails is negatively acknowledged and
// delivered again, unless its id is one the inbox can never store
// (inbox.ErrInvalidMessageID, a missing id included): every delivery of
// it would fail alike, so it is terminated instead, which JetStream never
// redelivers and reports in a MSG_TERMINATED advisory, a dead letter.
func (c *Consumer) Handle(ctx context.Context, msg jetstream.Msg) (duplicate bool, err error) {
	duplicate, err = c.Apply(ctx, msg)
	switch {
	case errors.Is(err, inbox.ErrInvalidMessageID):
		return false, errors.Join(err, msg.Term())
	case err != nil:
		return false, errors.Join(err, msg.Nak())
	}
	return duplicate, msg.DoubleAck(ctx)
}
