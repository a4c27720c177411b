-- The statements of jobsd.testing, the pytest plugin: a migrated database of its own
-- per test session, put back to its just-migrated state before each test.
--
-- {database}, {table}, {rows}, {sequence}, {value}, {called} and {triggers} are
-- filled in by jobsd.store.testing as quoted identifiers or literals, never from
-- input. Blocks without placeholders take bind parameters instead.

-- name: testing_create_database
CREATE DATABASE {database};

-- name: testing_drop_database
DROP DATABASE IF EXISTS {database} WITH (FORCE);

-- name: testing_tables
-- The tables of schema jobsd a reset empties: every one but the migrations' ledger
-- (a partitioned table's partitions are emptied with it).
SELECT c.relname AS name
FROM pg_class AS c
WHERE c.relnamespace = 'jobsd'::regnamespace AND c.relkind IN ('r', 'p')
  AND NOT c.relispartition AND c.relname <> 'schema_migrations'
ORDER BY c.relname;

-- name: testing_table_rows
-- A table's rows as a JSON array (most tables are empty after the migrations).
SELECT coalesce(json_agg(t), '[]')::text AS rows FROM {table} AS t;

-- name: testing_sequences
-- The sequences of schema jobsd (identity columns' included) as the migrations left them.
SELECT format('%I.%I', s.schemaname, s.sequencename) AS name,
       coalesce(s.last_value, s.start_value) AS value, s.last_value IS NOT NULL AS called
FROM pg_sequences AS s
WHERE s.schemaname = 'jobsd'
ORDER BY s.sequencename;

-- name: testing_enabled_triggers
-- The triggers of schema jobsd that are on (`jobsd notify off` turns two of them off),
-- as table.trigger.
SELECT c.relname || '.' || g.tgname AS name
FROM pg_trigger AS g JOIN pg_class AS c ON c.oid = g.tgrelid
WHERE c.relnamespace = 'jobsd'::regnamespace AND NOT g.tgisinternal AND g.tgenabled <> 'D'
ORDER BY 1;

-- name: testing_reset_begin
-- The reset's first statement, in its transaction: no trigger fires and no foreign key
-- is checked while every table is emptied (replica mode: a superuser's), and a lock
-- held by a session a test left behind is an error rather than a hang.
SET LOCAL session_replication_role = replica;
SET LOCAL lock_timeout = '10s';

-- name: testing_reset_table
DELETE FROM {table};

-- name: testing_reset_rows
INSERT INTO {table} OVERRIDING SYSTEM VALUE
SELECT * FROM json_populate_recordset(NULL::{table}, {rows}::json);

-- name: testing_reset_sequence
SELECT setval({sequence}::regclass, {value}, {called});

-- name: testing_reset_triggers
-- Turn back on the triggers that were on after the migrations and are off now.
DO $$
DECLARE
  t record;
BEGIN
  FOR t IN
    SELECT c.relname, g.tgname
    FROM pg_trigger AS g JOIN pg_class AS c ON c.oid = g.tgrelid
    WHERE c.relnamespace = 'jobsd'::regnamespace AND NOT g.tgisinternal
      AND g.tgenabled = 'D' AND c.relname || '.' || g.tgname = ANY({triggers}::text[])
  LOOP
    EXECUTE format('ALTER TABLE jobsd.%I ENABLE TRIGGER %I', t.relname, t.tgname);
  END LOOP;
END
$$;

-- name: testing_jobs
-- Every job of the database, open or archived, oldest first.
SELECT * FROM jobsd.all_jobs ORDER BY created_at, id;

-- name: testing_jobs_by_id
SELECT * FROM jobsd.all_jobs WHERE id = ANY(%(ids)s::uuid[]);
