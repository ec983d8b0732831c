-- Offsets without a commit-long lock (with shared_preload_libraries = 'queen'): what a
-- push's msg_offset means, gaps, a transaction that reads its own pushes, savepoints, and
-- PREPARE TRANSACTION (COMMIT PREPARED, ROLLBACK PREPARED).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;

-- A push's msg_offset is the offset it reserved; a rolled-back push leaves its offset as a
-- gap that is never handed out again.
SELECT msg_offset FROM queen.push('o', '"one"');
BEGIN;
SELECT msg_offset FROM queen.push('o', '"rolled back"');
ROLLBACK;
SELECT msg_offset FROM queen.push('o', '"three"');
-- The head is the last offset holding a message; a pop steps over the gap.
SELECT messages FROM queen.totals('o');
SELECT msg_offset, payload FROM queen.pop('o', batch => 10, auto_ack => true);

-- Gaps count as offsets but deliver nothing: a pop of 6 that meets a lane of 3 messages
-- and 3 gaps fills the rest of its batch from the next lane.
SELECT msg_offset FROM queen.push('og', '1', partition => 'a');
BEGIN;
SELECT count(*) FROM queen.push_batch('[{"queue": "og", "partition": "a", "payload": "x"},
                                        {"queue": "og", "partition": "a", "payload": "x"},
                                        {"queue": "og", "partition": "a", "payload": "x"}]');
ROLLBACK;
SELECT count(*) FROM queen.push_batch('[{"queue": "og", "partition": "a", "payload": 5},
                                        {"queue": "og", "partition": "a", "payload": 6}]');
SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'og', 'partition', 'b', 'payload', i)) FROM generate_series(1, 6) i));
SELECT partition, msg_offset, payload FROM queen.pop('og', batch => 6, max_partitions => 2, auto_ack => true);

-- A transaction reads its own pushes, even before it commits.
BEGIN;
SELECT msg_offset FROM queen.push('o', '"mine"');
SELECT msg_offset, payload FROM queen.pop('o', batch => 10, auto_ack => true);
COMMIT;

-- A savepoint rolled back gives up its pushes (a gap); released, it keeps them.
BEGIN;
SAVEPOINT a;
SELECT msg_offset FROM queen.push('o', '"savepoint rolled back"');
ROLLBACK TO SAVEPOINT a;
SAVEPOINT b;
SELECT msg_offset FROM queen.push('o', '"savepoint released"');
RELEASE SAVEPOINT b;
COMMIT;
SELECT msg_offset, payload FROM queen.pop('o', batch => 10, auto_ack => true);

-- A PL/pgSQL block that pushes and then fails: its push is gone.
DO $$
BEGIN
  BEGIN
    PERFORM queen.push('o', '"in a failed block"');
    RAISE EXCEPTION 'boom';
  EXCEPTION WHEN OTHERS THEN NULL;
  END;
END $$;
SELECT msg_offset FROM queen.push('o', '"after the block"');
SELECT msg_offset, payload FROM queen.pop('o', batch => 10, auto_ack => true);

-- A transaction that pushed can be prepared (as Citus prepares a transaction that wrote on
-- two workers). Until COMMIT PREPARED its offset may still commit: a pop stops before it,
-- even after a later push has committed.
BEGIN;
SELECT msg_offset FROM queen.push('o', '"prepared"');
PREPARE TRANSACTION 'queen-offsets';
SELECT msg_offset FROM queen.push('o', '"after prepare"');
SELECT msg_offset, payload FROM queen.pop('o', batch => 10, auto_ack => true);
COMMIT PREPARED 'queen-offsets';
SELECT msg_offset, payload FROM queen.pop('o', batch => 10, auto_ack => true);
-- Rolled back, its offset is a gap that is never handed out again.
BEGIN;
SELECT msg_offset FROM queen.push('o', '"prepared, then rolled back"');
PREPARE TRANSACTION 'queen-offsets';
SELECT msg_offset FROM queen.push('o', '"after the second prepare"');
SELECT msg_offset, payload FROM queen.pop('o', batch => 10, auto_ack => true);
ROLLBACK PREPARED 'queen-offsets';
SELECT msg_offset, payload FROM queen.pop('o', batch => 10, auto_ack => true);
SELECT msg_offset FROM queen.push('o', '"after the rollback"');
SELECT count(*) AS prepared FROM pg_prepared_xacts;

-- A transaction that holds a lane (a pop that leased it, an ack) cannot be prepared (0A000):
-- the lane stays as it was.
SELECT msg_offset FROM queen.push('o', '"leased, then prepared?"');
BEGIN;
SELECT msg_offset, attempt FROM queen.pop('o', batch => 1);
\set VERBOSITY sqlstate
PREPARE TRANSACTION 'queen-lanes';
\set VERBOSITY default
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT msg_offset, payload FROM queen.pop('o', batch => 10, auto_ack => true);

-- COMMIT PREPARED runs queen's ProcessUtility hook, which looks the transaction up with
-- queen's own search path, never the session's: an operator a schema on the session's
-- path defines is not called.
CREATE SCHEMA trap;
CREATE FUNCTION trap.texteq(text, text) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'trap operator called';
END $$;
CREATE OPERATOR trap.= (LEFTARG = text, RIGHTARG = text, FUNCTION = trap.texteq);
BEGIN;
SELECT msg_offset FROM queen.push('o', '"prepared under a trap"');
PREPARE TRANSACTION 'queen-trap';
SET search_path = trap, pg_catalog;
COMMIT PREPARED 'queen-trap';
RESET search_path;
SELECT msg_offset, payload FROM queen.pop('o', batch => 10, auto_ack => true);
DROP SCHEMA trap CASCADE;

-- A gap of ten million offsets (as a rolled-back bulk push leaves; made here by a
-- partition row whose head the registry loads as the last offset reserved) is crossed in
-- one step: a pop of 1 reads on from the next stored offset, not one fetch per offset
-- (which took minutes, and did not answer a cancel meanwhile). The same under REPEATABLE
-- READ. (The timeout only keeps a regression from hanging the run.)
SELECT queen.configure('gapq') IS NOT NULL AS configured;
INSERT INTO queen.partitions (partition_id, queue_id, name, head)
  SELECT gen_random_uuid(), queue_id, p, 10000000 FROM queen.queues, (VALUES ('wide'), ('wide_rr')) v(p)
   WHERE name = 'gapq';
SELECT msg_offset FROM queen.push('gapq', '"after the gap"', partition => 'wide');
SELECT msg_offset FROM queen.push('gapq', '"after the gap"', partition => 'wide_rr');
SET statement_timeout = '60s';
SELECT msg_offset, payload FROM queen.pop('gapq', batch => 1, partition => 'wide', auto_ack => true);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT msg_offset, payload FROM queen.pop('gapq', batch => 1, partition => 'wide_rr', auto_ack => true);
COMMIT;
RESET statement_timeout;

-- The last offset (2^62 - 1): a partition whose head stands two below it takes two more
-- messages, then refuses a push with 54000, whole (a batch that would pass it stores
-- nothing), and the messages up to it are delivered.
SELECT queen.configure('topq') IS NOT NULL AS configured;
INSERT INTO queen.partitions (partition_id, queue_id, name, head)
  SELECT gen_random_uuid(), queue_id, 'top', 4611686018427387901 FROM queen.queues WHERE name = 'topq';
SELECT msg_offset FROM queen.push('topq', '"one below the top"', partition => 'top');
\set VERBOSITY sqlstate
SELECT count(*) FROM queen.push_batch('topq', '[{"payload": 1, "partition": "top"}, {"payload": 2, "partition": "top"}]');
\set VERBOSITY default
SELECT msg_offset FROM queen.push('topq', '"the top"', partition => 'top');
SELECT msg_offset FROM queen.push('topq', '"past the top"', partition => 'top');
SELECT msg_offset, payload FROM queen.pop('topq', batch => 10, partition => 'top', auto_ack => true);
SELECT msg_offset, payload FROM queen.pop('topq', batch => 10, partition => 'top', auto_ack => true);
SELECT lag FROM queen.status('topq');
