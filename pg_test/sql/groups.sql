-- Consumer groups made, moved and removed on purpose: queen.create_group, queen.seek,
-- queen.drop_group (README, "Consumer groups").
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

SELECT count(*) FROM queen.push_batch(
  (SELECT jsonb_agg(jsonb_build_object('queue', 'gq', 'partition', p, 'payload', g))
     FROM generate_series(1, 5) g, (VALUES ('a'), ('b')) v(p)));

-- create_group: before any consumer. 'new' starts at the end, 'all' at the start; a second
-- call changes nothing; a queue that does not exist yet is created, as a push would.
SELECT queen.create_group('gq', 'late', 'new');
SELECT queen.create_group('gq', 'early');
SELECT queen.create_group('gq', 'late', 'all') ->> 'created' AS created_again,
       queen.create_group('gq', 'late', 'all') ->> 'subscription' AS kept;
SELECT queen.create_group('brand-new', 'g') - 'lanes' AS on_a_new_queue;
SELECT count(*) FROM queen.pop('gq', 'late', batch => 100, max_partitions => 2, auto_ack => true);
SELECT count(*) FROM queen.pop('gq', 'early', batch => 100, max_partitions => 2, auto_ack => true);
SELECT pg_temp.err($$SELECT queen.create_group('gq', 'x', 'some')$$);
SELECT pg_temp.err($$SELECT queen.create_group('gq', NULL)$$);

-- seek by offset: the next pop delivers that offset, in every partition or in one.
SELECT jsonb_path_query_array(queen.seek('gq', 'early', to_offset => 4), '$.lanes[*].committed') AS committed;
SELECT partition, msg_offset FROM queen.pop('gq', 'early', batch => 100, max_partitions => 2, auto_ack => true)
 ORDER BY 1, 2;
SELECT (queen.seek('gq', 'early', partition => 'b', to_offset => 2) -> 'lanes' -> 0) - 'partitionId' AS moved;
SELECT partition, msg_offset FROM queen.pop('gq', 'early', batch => 100, max_partitions => 2, auto_ack => true);
-- Clamped to what exists: below 1 is the start, past the end is the end.
SELECT jsonb_path_query_array(queen.seek('gq', 'early', to_offset => -5), '$.lanes[*].committed') AS start,
       jsonb_path_query_array(queen.seek('gq', 'early', to_offset => 1000), '$.lanes[*].committed') AS "end";

-- seek by time: the first message pushed at or after it.
SELECT pg_sleep(0.05);
CREATE TEMP TABLE mark AS SELECT clock_timestamp() AS at;
SELECT pg_sleep(0.05);
SELECT count(*) FROM queen.push('gq', '"after the mark"', 'a');
SELECT jsonb_path_query_array(queen.seek('gq', 'early', to_time => (SELECT at FROM mark)), '$.lanes[*].committed') AS committed;
SELECT partition, msg_offset, payload FROM queen.pop('gq', 'early', batch => 100, max_partitions => 2, auto_ack => true);
SELECT jsonb_path_query_array(queen.seek('gq', 'early', to_time => '2000-01-01'), '$.lanes[*].committed') AS from_the_start,
       jsonb_path_query_array(queen.seek('gq', 'early', to_time => now() + interval '1 day'), '$.lanes[*].committed') AS at_the_end;

-- A lane under a live lease is refused, unless force (which ends the lease: its ack then
-- applies nothing).
SELECT queen.seek('gq', 'early', partition => 'a', to_offset => 1) -> 'lanes' -> 0 ->> 'committed' AS committed;
CREATE TEMP TABLE held AS SELECT * FROM queen.pop('gq', 'early', partition => 'a', batch => 1);
SELECT msg_offset FROM held;
SELECT pg_temp.err($$SELECT queen.seek('gq', 'early', to_offset => 3)$$);
SELECT queen.seek('gq', 'early', partition => 'a', to_offset => 3, force => true) -> 'lanes' -> 0 ->> 'leaseEnded' AS lease_ended;
SELECT queen.ack(lease_id) -> 'lanes' AS ack_after_force FROM held;
SELECT msg_offset FROM queen.pop('gq', 'early', partition => 'a', auto_ack => true);

-- Bad arguments.
SELECT pg_temp.err($$SELECT queen.seek('gq', 'early')$$);
SELECT pg_temp.err($$SELECT queen.seek('gq', 'early', to_offset => 1, to_time => now())$$);
SELECT pg_temp.err($$SELECT queen.seek('gq', 'nobody', to_offset => 1)$$);
SELECT pg_temp.err($$SELECT queen.seek('nope', 'early', to_offset => 1)$$);
SELECT pg_temp.err($$SELECT queen.seek('gq', 'early', partition => 'zz', to_offset => 1)$$);
SELECT pg_temp.err($$SELECT queen.seek('gq', 'early', to_time => 'infinity')$$);

-- drop_group: refused under a live lease, unless force; a group that does not exist is
-- not an error.
SELECT queen.create_group('gq', 'dropme') ->> 'created' AS created;
SELECT count(*) FROM queen.pop('gq', 'dropme', partition => 'a', batch => 100, auto_ack => true);
DROP TABLE held;
CREATE TEMP TABLE held AS SELECT * FROM queen.pop('gq', 'dropme', partition => 'b', batch => 1);
SELECT count(*) FROM held;
SELECT pg_temp.err($$SELECT queen.drop_group('gq', 'dropme')$$);
SELECT queen.drop_group('gq', 'dropme', force => true);
SELECT queen.drop_group('gq', 'dropme');
SELECT consumer_group FROM queen.groups ORDER BY 1;
SELECT count(*) AS lanes_left FROM queen.lanes WHERE consumer_group = 'dropme';
-- Its lease is gone with it.
SELECT queen.ack(lease_id) -> 'lanes' AS ack_after_drop FROM held;
-- A group created again under the same name starts afresh: nothing of the old cursors
-- (all 11 messages, not only b's).
SELECT count(*) FROM queen.pop('gq', 'dropme', batch => 100, max_partitions => 2, auto_ack => true);
SELECT pg_temp.err($$SELECT queen.drop_group(NULL, 'dropme')$$);

-- Retention: an abandoned group holds every segment back; once dropped, it holds nothing.
SELECT queen.configure('rq', retention => 1) ->> 'retention' AS retention;
SELECT count(*) FROM queen.push_batch(
  (SELECT jsonb_agg(jsonb_build_object('queue', 'rq', 'payload', g)) FROM generate_series(1, 3) g));
SELECT queen.create_group('rq', 'stuck') ->> 'created' AS created;
SELECT count(*) FROM queen.pop('rq', 'fast', batch => 10, auto_ack => true);
SELECT pg_sleep(1.1);
SELECT queen.retain('rq') -> 'segmentsDeleted' AS deleted_while_stuck_holds;
SELECT queen.drop_group('rq', 'stuck') ->> 'dropped' AS dropped;
SELECT (queen.retain('rq') -> 'segmentsDeleted')::int > 0 AS deleted_once_dropped;
SELECT (SELECT count(*) FROM queen.segments) + (SELECT count(*) FROM queen.fresh_segments) > 0 AS gq_segments_kept;

-- configure(create_groups => false): consumers may not create a group by popping; an
-- admin creates it with create_group, and pops then work.
SELECT queen.configure('closed', create_groups => false) ->> 'createGroups' AS create_groups;
SELECT count(*) FROM queen.push('closed', '1');
\set VERBOSITY sqlstate
SELECT count(*) FROM queen.pop('closed', 'newcomer');
-- Nor do an operator's calls that name a group (a typo would make a group that holds
-- retention back); configure_group does.
SELECT queen.pause('closed', 'newcomr');
SELECT queen.resume('closed', 'newcomr');
SELECT queen.configure_limit('closed', 'newcomr', '*', rate => 1);
\set VERBOSITY default
SELECT count(*) AS groups_of_closed FROM queen.groups g JOIN queen.queues q USING (queue_id) WHERE q.name = 'closed';
SELECT queen.create_group('closed', 'newcomer') ->> 'created' AS created;
SELECT msg_offset FROM queen.pop('closed', 'newcomer', auto_ack => true);
-- A group dropped in the same transaction is not there for them either (42704).
BEGIN;
SELECT queen.drop_group('closed', 'newcomer') ->> 'dropped' AS dropped;
\set VERBOSITY sqlstate
SELECT queen.pause('closed', 'newcomer');
\set VERBOSITY default
ROLLBACK;

-- A group whose creation rolled back leaves nothing behind, even when its transaction read
-- the new lanes (a pop, a status): created again from the start ('all'), it starts there,
-- and retention does not pass what it has not consumed.
SELECT count(*) FROM generate_series(1, 5) i, queen.push('back', i::text::jsonb);
BEGIN;
SELECT count(*) AS none_new FROM queen.pop('back', 'late', subscription => 'new');
SELECT committed FROM queen.status('back') WHERE consumer_group = 'late';
ROLLBACK;
SELECT queen.create_group('back', 'late', 'all') ->> 'created' AS created;
SELECT committed, lag FROM queen.status('back') WHERE consumer_group = 'late';
-- The same within one transaction, through a savepoint.
BEGIN;
SAVEPOINT s;
SELECT queen.create_group('back', 'sp', 'new') ->> 'created' AS created;
SELECT committed FROM queen.status('back') WHERE consumer_group = 'sp';
ROLLBACK TO SAVEPOINT s;
SELECT count(*) AS all_five FROM queen.pop('back', 'sp', batch => 10, auto_ack => true);
COMMIT;
SELECT count(*) AS all_five FROM queen.pop('back', 'late', batch => 10, auto_ack => true);
-- A group dropped in a transaction is not created again in it (until the drop commits,
-- the old cursors still stand for its lanes): refused, 55000. A drop rolled back to a
-- savepoint does not count.
BEGIN;
SELECT queen.drop_group('back', 'late') ->> 'dropped' AS dropped;
\set VERBOSITY sqlstate
SELECT count(*) FROM queen.pop('back', 'late', auto_ack => true);
\set VERBOSITY default
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT queen.drop_group('back', 'late') ->> 'dropped' AS dropped;
ROLLBACK TO SAVEPOINT s;
SELECT count(*) AS nothing_left FROM queen.pop('back', 'late', auto_ack => true);
COMMIT;
SELECT queen.drop_group('back', 'late') ->> 'dropped' AS dropped;
SELECT count(*) AS all_five_again FROM queen.pop('back', 'late', batch => 10, auto_ack => true);
