-- The schema takes the words of the API: a key whose outcome is recorded
-- has status 'recorded' (it was 'completed'), and the columns that
-- migration 0007 superseded go: recovery_point and recovery_data (the last
-- step of a leased call, as versions before migration 0005 kept it),
-- recovery_steps and request_metadata (a leased call's steps and a kept
-- call's metadata in a binary encoding of idem's, as versions before
-- migration 0007 wrote them). Their data moves first to step_names,
-- step_results, request_header_names and request_header_values, where a
-- row still holds it only there: a row written by a server of an earlier
-- version after migration 0007 ran, or before it and not written since.
-- A list that cannot be decoded is kept as damaged (a NULL element), so
-- that the store reports the key as it did before: its steps unreadable
-- (every claim fails with store.ErrCorrupt until an operator forgets the
-- key), or its kept call unreadable (a finisher records it as failed).
--
-- The first statement takes an ACCESS EXCLUSIVE lock on idempotency_keys,
-- which a single transaction (Migrate, golang-migrate) holds until it
-- commits: claims give up at once meanwhile (ABORTED, retried). The
-- UPDATE of the status writes a new version of every recorded row, which
-- takes about as long as copying the table; the new CHECK constraints
-- read it once more; dropping columns rewrites nothing. Servers of an
-- earlier version cannot claim keys once it has run (their statements name
-- the dropped columns and the old status), and servers of this version
-- cannot before it has: replace them together (see the Upgrading notes).
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_status_check;
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_check;

DO $$
DECLARE
    r         record;
    b         bytea;   -- the list being read
    pos       int;     -- the offset of its next byte
    tag       int;
    len       bigint;  -- a field's length, a varint
    shift     int;
    byte      int;
    entry_end int;     -- the end of the entry being read; -1 between entries
    name      text;    -- the entry's name, once read
    names     text[];
    vals      bytea[];
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute
                   WHERE attrelid = 'idempotency_keys'::regclass AND attname = 'recovery_steps' AND NOT attisdropped) THEN
        RETURN; -- run before: the columns are gone
    END IF;

    -- A step saved by a version before migration 0005, alone.
    UPDATE idempotency_keys
    SET step_names = ARRAY[recovery_point], step_results = ARRAY[recovery_data]
    WHERE recovery_point IS NOT NULL AND recovery_steps IS NULL AND step_names IS NULL;

    -- The lists of versions before migration 0007: entries (protobuf field
    -- 1, length-delimited) of a name (field 1) and a value (field 2).
    FOR r IN SELECT id, 'steps' AS list, recovery_steps AS data FROM idempotency_keys WHERE recovery_steps IS NOT NULL
             UNION ALL
             SELECT id, 'metadata', request_metadata FROM idempotency_keys WHERE request_metadata IS NOT NULL
    LOOP
        b := r.data;
        pos := 0;
        entry_end := -1;
        names := '{}';
        vals := '{}';
        BEGIN
            WHILE pos < length(b) LOOP
                tag := get_byte(b, pos);
                pos := pos + 1;
                len := 0;
                shift := 0;
                LOOP
                    IF pos >= length(b) OR shift > 28 THEN
                        RAISE EXCEPTION USING ERRCODE = 'data_exception', MESSAGE = 'a length runs past the list';
                    END IF;
                    byte := get_byte(b, pos);
                    pos := pos + 1;
                    len := len | ((byte & 127)::bigint << shift);
                    EXIT WHEN byte < 128;
                    shift := shift + 7;
                END LOOP;
                IF entry_end < 0 THEN -- an entry
                    IF tag <> 10 OR pos + len > length(b) THEN
                        RAISE EXCEPTION USING ERRCODE = 'data_exception', MESSAGE = 'an entry is malformed';
                    END IF;
                    entry_end := pos + len;
                    name := NULL;
                ELSIF name IS NULL THEN -- its name
                    IF tag <> 10 OR pos + len > entry_end THEN
                        RAISE EXCEPTION USING ERRCODE = 'data_exception', MESSAGE = 'a name is malformed';
                    END IF;
                    name := convert_from(substring(b FROM pos + 1 FOR len::int), 'UTF8');
                    pos := pos + len;
                ELSE -- its value; what follows it in the entry is skipped
                    IF tag <> 18 OR pos + len > entry_end THEN
                        RAISE EXCEPTION USING ERRCODE = 'data_exception', MESSAGE = 'a value is malformed';
                    END IF;
                    names := names || name;
                    vals := vals || substring(b FROM pos + 1 FOR len::int);
                    pos := entry_end;
                    entry_end := -1;
                END IF;
            END LOOP;
            IF entry_end >= 0 THEN
                RAISE EXCEPTION USING ERRCODE = 'data_exception', MESSAGE = 'the last entry is cut short';
            END IF;
        EXCEPTION WHEN data_exception THEN
            RAISE WARNING 'idem: the % kept in idempotency_keys row % cannot be decoded (%); it is kept as damaged', r.list, r.id, SQLERRM;
            names := ARRAY[NULL::text];
            vals := ARRAY[NULL::bytea];
        END;
        IF r.list = 'steps' THEN
            UPDATE idempotency_keys SET step_names = names, step_results = vals, recovery_steps = NULL WHERE id = r.id;
        ELSE
            -- Sorted by name, each name's values in their order, as the store
            -- writes them.
            UPDATE idempotency_keys
            SET (request_header_names, request_header_values) = (
                    SELECT coalesce(array_agg(n ORDER BY n COLLATE "C", i), '{}'), coalesce(array_agg(v ORDER BY n COLLATE "C", i), '{}')
                    FROM unnest(names, vals) WITH ORDINALITY AS u(n, v, i)),
                request_metadata = NULL
            WHERE id = r.id;
        END IF;
    END LOOP;
END $$;

UPDATE idempotency_keys SET status = 'recorded' WHERE status = 'completed';
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_status_check;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_status_check CHECK (status IN ('in_progress', 'recorded'));
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_check;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_check CHECK (status <> 'recorded' OR response_code IS NOT NULL);
ALTER TABLE idempotency_keys
    DROP COLUMN IF EXISTS recovery_point,
    DROP COLUMN IF EXISTS recovery_data,
    DROP COLUMN IF EXISTS recovery_steps,
    DROP COLUMN IF EXISTS request_metadata;
