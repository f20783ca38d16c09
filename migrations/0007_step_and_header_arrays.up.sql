-- A leased call's steps and a kept call's metadata move to columns of
-- PostgreSQL's own types, which pgx encodes and operators can query:
-- step_names and step_results are parallel arrays, one element per step in
-- the order the steps were first saved (a NULL result is a step saved with
-- no data); request_header_names and request_header_values are parallel
-- arrays, one element per metadata value, sorted by name, a name repeated
-- for each of its values (bytea: the values of -bin names are binary).
--
-- They replace recovery_steps and request_metadata, which held the same
-- lists in a binary encoding of idem's. The store no longer writes those
-- two (it sets them to NULL where it writes the arrays) and reads them only
-- where they are set: in rows written before this migration, or by a
-- server of the previous version still running, until such a row is
-- written again or expires. They stay so that a server of the previous
-- version still runs against this schema; a later migration drops them.
--
-- A row with a recovery point and no steps (recovery_point and
-- recovery_data, as leased calls saved before migration 0005) gets that
-- point as its one step.
--
-- Adding columns without a default does not rewrite the table. The UPDATE
-- reads the whole table, under the ACCESS EXCLUSIVE lock the ALTER TABLEs
-- take until the migration commits, and writes only those rows.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS step_names text[];
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS step_results bytea[];
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS request_header_names text[];
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS request_header_values bytea[];
UPDATE idempotency_keys
SET step_names = ARRAY[recovery_point], step_results = ARRAY[recovery_data]
WHERE recovery_point IS NOT NULL AND recovery_steps IS NULL AND step_names IS NULL;
