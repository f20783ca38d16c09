// Package inbox makes the side effects of an at-least-once message consumer
// (NATS JetStream, Kafka, RabbitMQ, SQS) happen once per message, in
// PostgreSQL: an [Inbox] records the id the producer assigned to each
// message in the table processed_messages, in the transaction that applies
// the message, and skips a message whose id is already there.
//
// # Setup
//
// processed_messages is part of idem's schema: apply it with
// postgres.Migrate (package github.com/idemkit/idem/store/postgres), and run
// a postgres.Sweeper, which deletes the ids whose retention has passed from
// processed_messages as it deletes expired keys.
//
//	if err := postgres.Migrate(ctx, pool); err != nil { ... }
//	in := inbox.New(pool, "shipping")
//	duplicate, err := in.ProcessOnce(ctx, msgID, func(tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, orderID)
//		return err
//	})
//
// Acknowledge to the broker after [Inbox.ProcessOnce] returns nil, whether
// the message was processed now or before (duplicate). Ids are kept for
// [WithRetention] (7 days by default), which must exceed the broker's
// redelivery window. An id the table can never hold (empty, over
// [MaxMessageIDLength] bytes, not UTF-8, with a NUL byte) fails with
// [ErrInvalidMessageID] before the database is touched: dead-letter that
// message, since no redelivery would fare better.
//
// # Shards
//
// Where tenants' data lives in several databases, keep an inbox per
// database and record each message with the inbox of the database whose
// data it changes, so that its id and its side effects commit together.
//
// # Metrics and traces
//
// An inbox reports through the OpenTelemetry API, by default to the global
// providers: it counts the messages it processed or found processed before
// (idem.inbox.messages, by idem.consumer and idem.result: processed,
// duplicate) and records a span idem.inbox.process for each
// ([WithMeterProvider], [WithTracerProvider]). It does not log.
package inbox
