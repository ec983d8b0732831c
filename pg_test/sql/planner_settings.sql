-- pop, ack and extend_lease run their statements with plan_cache_mode =
-- force_generic_plan and enable_seqscan = off, set in the library for the length of the
-- call (src/pg/spi.rs, with_queen_plan_settings) instead of by SET clauses: the caller's
-- values are back after every call, after a call that raised, and whatever the caller
-- had set.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
CREATE FUNCTION pg_temp.settings() RETURNS text LANGUAGE sql AS $$
  SELECT current_setting('enable_seqscan') || ', ' || current_setting('plan_cache_mode') $$;

-- No SET clause on the consumer's calls.
SELECT p.oid::regprocedure AS function, p.proconfig
  FROM pg_proc p
 WHERE p.pronamespace = 'queen'::regnamespace AND p.proname IN ('pop', 'ack', 'extend_lease', 'push', 'send')
 ORDER BY 1::text;

SELECT pg_temp.settings() AS before;
-- One message in each of four partitions: each pop below claims its own lane.
SELECT count(*) FROM queen.push_batch('[{"queue": "ps", "partition": "a", "payload": 1},
                                         {"queue": "ps", "partition": "b", "payload": 2},
                                         {"queue": "ps", "partition": "c", "payload": 3},
                                         {"queue": "ps", "partition": "d", "payload": 4}]');
SELECT msg_offset FROM queen.pop('ps', batch => 1);
SELECT pg_temp.settings() AS after_pop;
SELECT queen.ack(lease_id) -> 'lanes' -> 0 ->> 'committed' AS committed FROM queen.pop('ps', batch => 1);
SELECT pg_temp.settings() AS after_ack;
SELECT queen.extend_lease(lease_id, 30) ->> 'renewed' AS renewed FROM queen.pop('ps', batch => 1);
SELECT pg_temp.settings() AS after_extend;

-- A call that raises inside (after the settings were set) leaves them as they were.
SELECT pg_temp.err($$SELECT queen.extend_lease(gen_random_uuid(), -1)$$);
SELECT pg_temp.settings() AS after_extend_error;
SELECT pg_temp.err($$SELECT * FROM queen.pop('ps', lease_seconds => -1)$$);
SELECT pg_temp.settings() AS after_pop_error;
BEGIN;
SELECT pg_temp.err($$SELECT * FROM queen.pop('ps', max_partitions => 0)$$);
SELECT pg_temp.settings() AS after_pop_error_in_a_transaction;
ROLLBACK;
-- An ERROR that PostgreSQL raises inside the call (a statement timeout during a
-- long-poll) too.
CREATE FUNCTION pg_temp.canceled(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'not canceled';
EXCEPTION WHEN query_canceled THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
SELECT count(*) FROM queen.configure('ps-empty');
SET statement_timeout = '200ms';
SELECT pg_temp.canceled($$SELECT * FROM queen.pop('ps-empty', wait_ms => 5000)$$);
RESET statement_timeout;
SELECT pg_temp.settings() AS after_a_timeout;

-- The caller's own values come back too.
SET plan_cache_mode = force_custom_plan;
SELECT count(*) AS the_last_one FROM queen.pop('ps', batch => 10, max_partitions => 4, auto_ack => true);
SELECT pg_temp.settings() AS callers_own;
RESET plan_cache_mode;
SELECT pg_temp.settings() AS reset;
