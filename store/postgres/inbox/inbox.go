package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/store/postgres"
	"github.com/idemkit/idem/store/postgres/internal/pgerr"
)

// MaxMessageIDLength is the longest message id, in bytes, that an [Inbox]
// accepts. With the longest consumer name (255 bytes) it still fits the
// primary key's index of processed_messages, whose rows PostgreSQL limits
// to about 2.7 kB, however incompressible the id.
const MaxMessageIDLength = 1024

// maxConsumerNameLength is the longest consumer name, in bytes, that an
// [Inbox] accepts.
const maxConsumerNameLength = 255

// The errors of a message id no delivery can be processed with.
var (
	// ErrInvalidMessageID is returned by [Inbox.ProcessOnce] for a message
	// id that processed_messages can never hold: empty, longer than
	// [MaxMessageIDLength] bytes, not valid UTF-8, or with a NUL byte.
	// Every delivery of the message fails the same way, so dead-letter it
	// (for NATS JetStream, Term) rather than have it redelivered (Nak).
	// Nothing was written.
	ErrInvalidMessageID = errors.New("inbox: invalid message id")

	// ErrNoMessageID is returned by [Inbox.ProcessOnce] for a message
	// without an id. It is an [ErrInvalidMessageID]: errors.Is(err,
	// ErrInvalidMessageID) is true for it too.
	ErrNoMessageID = fmt.Errorf("%w: a message needs the id its producer assigned; broker offsets and delivery tags are not ids", ErrInvalidMessageID)
)

// checkText reports why s cannot be stored in a text column of the primary
// key of processed_messages with at most limit bytes, or "" if it can.
func checkText(s string, limit int) string {
	switch {
	case len(s) > limit:
		return fmt.Sprintf("%d bytes, longer than %d", len(s), limit)
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "has a NUL byte"
	}
	return ""
}

// Inbox makes the side effects of an at-least-once message consumer happen
// once per message: it records each processed message's id in the table
// processed_messages, in the transaction that applies the message. Create
// it with [New]; it is safe for concurrent use.
type Inbox struct {
	db        postgres.Beginner
	consumer  string
	retention float64 // seconds
	err       error   // why consumer cannot be stored, if it cannot
	obs       *observer
}

// New returns the inbox of the named consumer on db, usually a
// *pgxpool.Pool that [postgres.Migrate] has set up. Message ids are kept
// per consumer name: consumers that each apply every message (a mailer and a ledger
// reading the same stream) need distinct names, while replicas of one
// consumer share theirs. The name follows the rule of message ids (see
// [ErrInvalidMessageID]) with at most 255 bytes; with any other, every
// ProcessOnce fails with an error that says so, and that is not an
// ErrInvalidMessageID, since the messages are not at fault.
func New(db postgres.Beginner, consumer string, opts ...Option) *Inbox {
	o := defaultOptions
	for _, opt := range opts {
		opt(&o)
	}
	in := &Inbox{db: db, consumer: consumer, retention: o.retention.Seconds(), obs: newObserver(o, consumer)}
	if consumer == "" {
		in.err = errors.New("inbox: the inbox needs a consumer name")
	} else if why := checkText(consumer, maxConsumerNameLength); why != "" {
		in.err = fmt.Errorf("inbox: the consumer name cannot be stored: %s", why)
	}
	return in
}

// errDuplicate rolls back the transaction of a message processed before.
var errDuplicate = errors.New("inbox: message already processed")

const insertProcessed = `INSERT INTO processed_messages (consumer, message_id, expires_at)
VALUES ($1, $2, now() + $3 * interval '1 second')
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING true`

// processedBefore confirms, on the rare path where insertProcessed wrote no
// row, that the id is there: a trigger or rule that drops the row would
// otherwise pass for a duplicate and the message be acknowledged unapplied.
// It is a statement of its own so that, under READ COMMITTED, its snapshot
// sees the row of a concurrent delivery the insert waited for.
const processedBefore = `SELECT EXISTS (SELECT FROM processed_messages WHERE consumer = $1 AND message_id = $2)`

// errIDNotRecorded reports an insert into processed_messages that neither
// wrote the row nor met an existing one.
var errIDNotRecorded = errors.New("inbox: the insert into processed_messages wrote no row and none is there (a trigger or rule on the table drops it?); the message is not processed")

// ProcessOnce applies the message whose producer-assigned id is messageID,
// unless this consumer already has. In one transaction it inserts the id
// into processed_messages and runs fn with that transaction, so the id and
// fn's writes commit together or not at all; fn must not commit or roll
// the transaction back itself. An id that is already there means the
// message was processed: ProcessOnce rolls back without running fn and
// reports duplicate. A duplicate delivered while the first is still being
// processed waits on the first one's uncommitted row, then either sees it
// committed (duplicate) or, if the first rolled back, processes the
// message itself: fn never runs twice for one id.
//
// Acknowledge the message to the broker only after ProcessOnce returns a
// nil error, whether the message was processed now or before. On an error
// (fn's, a failed commit, a serialization failure) do not acknowledge it:
// the broker redelivers it, and a commit that did happen shows up as a
// duplicate then. The exception is an [ErrInvalidMessageID], which no
// redelivery can cure: dead-letter that message.
//
// messageID must be the id the producer assigned to the message, which
// every redelivery and every republish of it carries; a broker's offsets,
// sequence numbers and delivery tags change between deliveries and are not
// ids. It must be 1 to [MaxMessageIDLength] bytes of valid UTF-8 without a
// NUL byte. Any other id fails, before anything is sent to the database,
// with an error for which errors.Is(err, ErrInvalidMessageID) is true
// ([ErrNoMessageID] for an empty id): dead-letter such a message rather
// than Nak it, since every delivery would fail alike.
func (in *Inbox) ProcessOnce(ctx context.Context, messageID string, fn func(pgx.Tx) error) (duplicate bool, err error) {
	if in.err != nil {
		return false, in.err
	}
	if messageID == "" {
		return false, ErrNoMessageID
	}
	if why := checkText(messageID, MaxMessageIDLength); why != "" {
		return false, fmt.Errorf("%w: %s", ErrInvalidMessageID, why)
	}
	ctx, span := in.obs.start(ctx)
	defer func() { in.obs.end(ctx, span, duplicate, err) }()
	err = pgx.BeginFunc(ctx, in.db, func(tx pgx.Tx) error {
		var inserted bool
		err := tx.QueryRow(ctx, insertProcessed, in.consumer, messageID, in.retention).Scan(&inserted)
		if errors.Is(err, pgx.ErrNoRows) {
			var there bool
			if err := tx.QueryRow(ctx, processedBefore, in.consumer, messageID).Scan(&there); err != nil {
				return err
			}
			if !there {
				return errIDNotRecorded
			}
			return errDuplicate
		}
		if err != nil {
			return err
		}
		return fn(tx)
	})
	if errors.Is(err, errDuplicate) {
		return true, nil
	}
	if err != nil {
		return false, pgerr.Interpret(err)
	}
	return false, nil
}
