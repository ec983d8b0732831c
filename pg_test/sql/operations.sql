-- Spec §2 delete_queue and §10 status.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;

SELECT count(*) FROM queen.push_batch('[{"queue": "ops", "partition": "a", "payload": 1},
                                        {"queue": "ops", "partition": "a", "payload": 2},
                                        {"queue": "ops", "partition": "b", "payload": 3},
                                        {"queue": "other", "payload": 4}]');
SELECT count(*) FROM queen.pop('ops', batch => 1, partition => 'a', lease_seconds => 30);
SELECT count(*) FROM queen.pop('ops', 'audit', batch => 10, max_partitions => 2, auto_ack => true);
CREATE TEMP TABLE b AS SELECT * FROM queen.pop('ops', batch => 1, partition => 'b');
SELECT queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'bad') -> 'items' -> 0 -> 'dlq' AS dlq FROM b;

SELECT queue, partition, head, consumer_group, committed, lag, lease_id IS NOT NULL AS leased,
       batch_end, retry_count, attempt_count, dead_letters
  FROM queen.status('ops');
SELECT count(*) AS all_lanes FROM queen.status();
-- Totals per queue and group: ops has 2 partitions, 3 messages; the default group has
-- committed 1 (b's dead letter) and leases a; audit read everything; other has no group.
SELECT * FROM queen.totals();
SELECT * FROM queen.totals('ops');
SELECT * FROM queen.totals('nope');

-- \df+ queen.* explains itself: every function and table of the schema has a comment.
SELECT p.oid::regprocedure::text AS uncommented FROM pg_proc p
 WHERE p.pronamespace = 'queen'::regnamespace AND obj_description(p.oid, 'pg_proc') IS NULL
UNION ALL
SELECT c.oid::regclass::text FROM pg_class c
 WHERE c.relnamespace = 'queen'::regnamespace AND c.relkind = 'r' AND obj_description(c.oid, 'pg_class') IS NULL;

-- delete_queue removes everything of the queue, dead letters included, and nothing else.
SELECT queen.delete_queue('ops') - 'queue' AS deleted;
SELECT queen.delete_queue('ops') AS again;
SELECT (SELECT count(*) FROM queen.queues) AS queues, (SELECT count(*) FROM queen.partitions) AS partitions,
       (SELECT count(*) FROM queen.segments) + (SELECT count(*) FROM queen.fresh_segments) AS segments, (SELECT count(*) FROM queen.lanes) AS lanes,
       (SELECT count(*) FROM queen.leases) AS leases, (SELECT count(*) FROM queen.log_dlq) AS dead_letters;
SELECT msg_offset, payload FROM queen.pop('other', auto_ack => true);
-- A deleted queue comes back empty on its next push.
SELECT msg_offset FROM queen.push('ops', '5');
-- queen.metrics: one row per metric and label set; kind picks one part.
SELECT metric, CASE WHEN metric = 'bytes' THEN value > 0 END AS some_bytes,
       CASE WHEN metric <> 'bytes' THEN value END AS value
  FROM queen.metrics('queue') WHERE queue = 'ops' ORDER BY 1;
SELECT count(*) > 0 AS groups_reported FROM queen.metrics('group');
SELECT (SELECT count(*) FROM queen.metrics())
       = (SELECT count(*) FROM unnest(ARRAY['queue', 'group', 'dead_letters', 'retention', 'maintenance']) k,
                               queen.metrics(k)) AS all_is_the_sum_of_the_parts;
\set VERBOSITY terse
SELECT * FROM queen.metrics('bogus');
\set VERBOSITY default
