-- Rate limits and concurrency caps (docs/functions.md#configure_limit): a key's pops take
-- at most the tokens its bucket holds; other keys are not held back; a changed limit
-- applies from the next pop; every limit NULL removes it. (The cap on lanes in flight is
-- the isolation spec limit_in_flight; the rate over ten seconds is tests/tests/rate_limits.rs.)
-- It runs with the library preloaded (buckets in shared memory) and without it (buckets in
-- queen.limit_buckets), with the same results.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN 'no error';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$;

-- Bad input changes nothing.
SELECT pg_temp.err($$SELECT queen.configure_limit('lq', 'g', NULL, rate => 1)$$);
SELECT pg_temp.err($$SELECT queen.configure_limit('lq', 'g', '', rate => 1)$$);
SELECT pg_temp.err($$SELECT queen.configure_limit('lq', 'g', '*', rate => 0)$$);
SELECT pg_temp.err($$SELECT queen.configure_limit('lq', 'g', '*', rate => 1e-15)$$);
SELECT pg_temp.err($$SELECT queen.configure_limit('lq', 'g', '*', rate => -2.5)$$);
SELECT pg_temp.err($$SELECT queen.configure_limit('lq', 'g', '*', burst => 5)$$);
SELECT pg_temp.err($$SELECT queen.configure_limit('lq', 'g', '*', rate => 1, burst => 0)$$);
SELECT pg_temp.err($$SELECT queen.configure_limit('lq', 'g', 'k:', max_in_flight => 0)$$);
SELECT pg_temp.err($$SELECT queen.configure_limit('lq', 'g', 'k:', max_in_flight => 33)$$);
SELECT pg_temp.err($$SELECT queen.configure_limit('lq', 'g', '*', max_in_flight => 2)$$);
SELECT pg_temp.err($$SELECT queen.configure_limit('lq', 'g', 'a b', rate => 1)$$);
SELECT pg_temp.err($$SELECT queen.configure_limit('lq', 'bad name!', '*', rate => 1)$$);
SELECT count(*) AS queues FROM queen.queues;

SELECT count(*) FROM generate_series(1, 40) i,
  queen.push('lq', i::text::jsonb, partition => CASE WHEN i % 2 = 0 THEN 'k1:a' ELSE 'free' END);
SELECT queen.configure_limit('lq', 'g', 'k1:', rate => 0.5, burst => 3) - 'queue' AS k1;
SELECT key, rate, burst, max_in_flight FROM queen.limits;
-- The burst, then nothing until a token is due; the free key is not held back.
SELECT partition, count(*) FROM queen.pop('lq', 'g', batch => 100, max_partitions => 10, auto_ack => true) GROUP BY 1 ORDER BY 1;
SELECT partition, count(*) FROM queen.pop('lq', 'g', batch => 100, max_partitions => 10, auto_ack => true) GROUP BY 1 ORDER BY 1;
-- A long-poll sleeps until the next token (2 s at 0.5 a second), not for its whole wait.
SELECT clock_timestamp() AS t0 \gset
SELECT partition, count(*) FROM queen.pop('lq', 'g', batch => 100, wait_ms => 10000, auto_ack => true) GROUP BY 1;
SELECT clock_timestamp() - :'t0' < interval '5 s' AS woke_for_the_token;
-- A changed limit applies from the next pop (its bucket starts full).
SELECT queen.configure_limit('lq', 'g', 'k1:', rate => 100, burst => 10) ->> 'burst' AS burst;
SELECT partition, count(*) FROM queen.pop('lq', 'g', batch => 100, auto_ack => true) GROUP BY 1;
-- Every limit NULL removes it; another group was never limited.
SELECT queen.configure_limit('lq', 'g', 'k1:') - 'queue' AS removed;
SELECT queen.configure_limit('lq', 'g', 'k1:') ->> 'removed' AS again;
SELECT count(*) FROM queen.limits;
SELECT partition, count(*) FROM queen.pop('lq', 'g', batch => 100, auto_ack => true) GROUP BY 1;
SELECT partition, count(*) FROM queen.pop('lq', 'h', batch => 100, max_partitions => 10, auto_ack => true) GROUP BY 1 ORDER BY 1;

-- '*': each partition a bucket of its own.
SELECT count(*) FROM generate_series(1, 30) i, queen.push('each', i::text::jsonb, partition => 'p' || (i % 3));
SELECT queen.configure_limit('each', 'g', '*', rate => 0.001, burst => 2) ->> 'key' AS key;
SELECT partition, count(*) FROM queen.pop('each', 'g', batch => 100, max_partitions => 10, auto_ack => true) GROUP BY 1 ORDER BY 1;
SELECT count(*) AS none_left FROM queen.pop('each', 'g', batch => 100, max_partitions => 10, auto_ack => true);
-- A pop takes tokens for the messages a lane holds, no more: two partitions of one message
-- each spend 2 of the key's burst of 4, and 2 are left.
SELECT count(*) FROM generate_series(1, 2) i, queen.push('cap', '1', partition => 'c:' || i);
SELECT queen.configure_limit('cap', 'g', 'c:', rate => 0.001, burst => 4) ->> 'burst' AS burst;
SELECT count(*) FROM queen.pop('cap', 'g', batch => 100, max_partitions => 10, auto_ack => true);
SELECT count(*) FROM generate_series(1, 5) i, queen.push('cap', i::text::jsonb, partition => 'c:1');
SELECT count(*) AS the_two_left FROM queen.pop('cap', 'g', batch => 100, max_partitions => 10, auto_ack => true);
-- Dropping the group drops its limits.
SELECT queen.drop_group('each', 'g') ->> 'dropped' AS dropped;
SELECT key FROM queen.limits ORDER BY 1;
-- Even with the foreign keys' cascades off (a superuser's session_replication_role =
-- replica): a group created again under the name must not find the old limits.
SET session_replication_role = replica;
SELECT queen.drop_group('cap', 'g', force => true) ->> 'dropped' AS dropped;
RESET session_replication_role;
SELECT (SELECT count(*) FROM queen.limits JOIN queen.queues USING (queue_id) WHERE name = 'cap') AS limits,
       (SELECT count(*) FROM queen.limit_buckets JOIN queen.queues USING (queue_id) WHERE name = 'cap') AS buckets;

-- More keys than shared memory has buckets (1,536): a '*' limit over 1,600 partitions. The
-- buckets that do not fit go to queen.limit_buckets (all of them without preloading), and
-- every partition still delivers its burst, once.
SELECT count(*) FROM generate_series(1, 3200) i,
  queen.push('wide', i::text::jsonb, partition => 'w' || (i % 1600));
SELECT queen.configure_limit('wide', 'g', '*', rate => 0.001, burst => 1) ->> 'key' AS key;
CREATE TEMP TABLE wide_got (partition text, msg_offset bigint);
DO $$
BEGIN
  FOR i IN 1..6 LOOP
    INSERT INTO wide_got SELECT partition, msg_offset FROM queen.pop('wide', 'g', batch => 1000, max_partitions => 1000, auto_ack => true);
  END LOOP;
END $$;
SELECT count(*) AS delivered, count(DISTINCT partition) AS partitions, min(msg_offset) AS first_only_min,
       max(msg_offset) AS first_only_max FROM wide_got;
SELECT count(*) > 0 AS some_buckets_in_the_table FROM queen.limit_buckets
 WHERE queue_id = (SELECT queue_id FROM queen.queues WHERE name = 'wide');
-- A prefix key over the same partitions keeps one bucket, wherever the partitions' own
-- '*' buckets live: a burst of 100 delivers 100 in all (the '*' buckets, changed, start
-- full: 2 tokens each).
SELECT queen.configure_limit('wide', 'g', '*', rate => 0.001, burst => 2) ->> 'key' AS key;
SELECT queen.configure_limit('wide', 'g', 'w', rate => 0.001, burst => 100) ->> 'key' AS key;
DELETE FROM wide_got;
DO $$
BEGIN
  FOR i IN 1..4 LOOP
    INSERT INTO wide_got SELECT partition, msg_offset FROM queen.pop('wide', 'g', batch => 1000, max_partitions => 1000, auto_ack => true);
  END LOOP;
END $$;
SELECT count(*) AS delivered_under_the_prefix_burst, count(DISTINCT partition) AS partitions FROM wide_got;
SELECT queen.configure_limit('wide', 'g', 'w') ->> 'removed' AS removed;
-- Removing the limit drops its table buckets too.
SELECT queen.configure_limit('wide', 'g', '*') ->> 'removed' AS removed;
SELECT count(*) AS buckets_left FROM queen.limit_buckets
 WHERE queue_id = (SELECT queue_id FROM queen.queues WHERE name = 'wide');
