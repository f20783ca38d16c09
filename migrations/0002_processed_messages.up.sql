-- processed_messages records which messages a consumer has applied, keyed by
-- the id the producer assigned (never a broker offset or delivery tag). The
-- row is inserted in the same transaction as the message's side effect, so a
-- redelivered message finds it and is skipped.
CREATE TABLE IF NOT EXISTS processed_messages (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    -- expires_at: past it the row may be deleted. Keep ids longer than the
    -- broker can redeliver a message.
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX IF NOT EXISTS processed_messages_expires_at_idx ON processed_messages (expires_at);
