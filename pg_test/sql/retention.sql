-- Retention: segments (of both tiers) that every consumer group has committed past
-- and that are older than the queue's retention are deleted whole; nothing else is.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;

SELECT queen.configure('ret', retention => 1) ->> 'retention' AS retention;
-- Partition a: three segments (offsets 1-2, 3-4, 5-6); b: one (1-2).
SELECT count(*) FROM queen.push_batch('[{"queue": "ret", "partition": "a", "payload": 1}, {"queue": "ret", "partition": "a", "payload": 2}]');
SELECT count(*) FROM queen.push_batch('[{"queue": "ret", "partition": "a", "payload": 3}, {"queue": "ret", "partition": "a", "payload": 4}]');
SELECT count(*) FROM queen.push_batch('[{"queue": "ret", "partition": "a", "payload": 5}, {"queue": "ret", "partition": "a", "payload": 6}]');
SELECT count(*) FROM queen.push_batch('[{"queue": "ret", "partition": "b", "payload": 1}, {"queue": "ret", "partition": "b", "payload": 2}]');
-- A queue without retention is never touched.
SELECT count(*) FROM queen.push('keep', '1');
SELECT count(*) FROM queen.pop('keep', auto_ack => true);
SELECT pg_sleep(1.1);

-- No consumer group yet: nobody has committed anything, so everything stays.
SELECT queen.retain('ret') - 'bytesDeleted' AS pass;

-- g1 reads everything; g2 reads 4 messages of a and nothing of b.
SELECT count(*) FROM queen.pop('ret', 'g1', batch => 10, max_partitions => 2, auto_ack => true);
SELECT count(*) FROM queen.pop('ret', 'g2', batch => 4, partition => 'a', auto_ack => true);
-- A dead letter of g1 on partition c (its segment is behind no cursor of g2).
SELECT count(*) FROM queen.push('ret', '"poison"', 'c');
SELECT queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'bad') -> 'items' -> 0 -> 'dlq' AS dlq
  FROM queen.pop('ret', 'g1', partition => 'c');
SELECT pg_sleep(1.1);

-- a: min(6, 4) = 4, so segments 1-2 and 3-4 go; b and c: g2 is at 0, so they stay.
SELECT queen.retain('ret') - 'bytesDeleted' AS pass;
SELECT p.name AS partition, s.first_offset, s.last_offset
  FROM (SELECT partition_id, first_offset, last_offset, data FROM queen.segments UNION ALL SELECT partition_id, first_offset, last_offset, data FROM queen.fresh_segments) s
  JOIN queen.partitions p USING (partition_id) ORDER BY 1, 2;
SELECT name, retained_through FROM queen.partitions ORDER BY queue_id, name;
SELECT count(*) AS dead_letters FROM queen.log_dlq;

-- A new group subscribing to 'all' starts after what retention deleted.
SELECT partition, msg_offset, payload FROM queen.pop('ret', 'g3', batch => 10, partition => 'a', auto_ack => true);
-- g2 goes on where it was.
SELECT msg_offset, payload FROM queen.pop('ret', 'g2', batch => 10, partition => 'a', auto_ack => true);

-- Every group is past 7 now: 5-6, older than the retention, goes; 7, younger, stays.
SELECT count(*) FROM queen.push('ret', '7', 'a');
SELECT count(*) FROM queen.pop('ret', 'g1', partition => 'a', auto_ack => true);
SELECT count(*) FROM queen.pop('ret', 'g2', partition => 'a', auto_ack => true);
SELECT count(*) FROM queen.pop('ret', 'g3', partition => 'a', auto_ack => true);
SELECT r - 'bytesDeleted' AS pass, (r ->> 'bytesDeleted')::int > 0 AS freed_bytes FROM queen.retain() r;
SELECT p.name AS partition, s.first_offset, s.last_offset
  FROM (SELECT partition_id, first_offset, last_offset, data FROM queen.segments UNION ALL SELECT partition_id, first_offset, last_offset, data FROM queen.fresh_segments) s
  JOIN queen.partitions p USING (partition_id) WHERE p.name = 'a' ORDER BY 2;

-- Segment generations: a retention pass over every queue also rotates them when that is
-- due. Here the other generation is empty, so with no minimum size the rotation only moves
-- writes on to it; the segments already written stay where they are and read the same.
SELECT current_generation, rotations FROM queen.generations;
-- A negative minimum turns rotation off.
SET queen.rotation_min_size = -1;
SELECT queen.retain() ->> 'generationRotated' AS rotated;
SET queen.rotation_min_size = 0;
SELECT queen.retain() ->> 'generationRotated' AS rotated;
SELECT current_generation, rotations FROM queen.generations;
SELECT count(*) FROM queen.push('ret', '8', 'a');
SELECT p.name AS partition, s.first_offset, s.last_offset, s.generation
  FROM (SELECT partition_id, first_offset, last_offset, generation FROM queen.segments UNION ALL SELECT partition_id, first_offset, last_offset, generation FROM queen.fresh_segments) s
  JOIN queen.partitions p USING (partition_id) WHERE p.name = 'a' ORDER BY 2;
SELECT msg_offset, payload FROM queen.pop('ret', 'g4', batch => 10, partition => 'a', subscription => 'all', auto_ack => true);
-- A rotation that rolls back leaves the committed generation current, for the session that
-- made it too: its next push writes there.
BEGIN;
SELECT queen.retain() ->> 'generationRotated' AS rotated_then_rolled_back;
ROLLBACK;
SELECT count(*) FROM queen.push('ret', '9', 'a');
SELECT s.generation = (SELECT current_generation FROM queen.generations) AS in_the_current_generation
  FROM (SELECT partition_id, last_offset, generation FROM queen.segments UNION ALL SELECT partition_id, last_offset, generation FROM queen.fresh_segments) s
  JOIN queen.partitions p USING (partition_id) JOIN queen.queues q USING (queue_id)
 WHERE q.name = 'ret' AND p.name = 'a' ORDER BY s.last_offset DESC LIMIT 1;
-- And rolled back to a savepoint, with the push in the same transaction after it.
BEGIN;
SAVEPOINT s;
SELECT queen.retain() ->> 'generationRotated' AS rotated_then_rolled_back_to_a_savepoint;
ROLLBACK TO SAVEPOINT s;
SELECT count(*) FROM queen.push('ret', '10', 'a');
COMMIT;
SELECT s.generation = (SELECT current_generation FROM queen.generations) AS still_in_the_current_generation
  FROM (SELECT partition_id, last_offset, generation FROM queen.segments UNION ALL SELECT partition_id, last_offset, generation FROM queen.fresh_segments) s
  JOIN queen.partitions p USING (partition_id) JOIN queen.queues q USING (queue_id)
 WHERE q.name = 'ret' AND p.name = 'a' ORDER BY s.last_offset DESC LIMIT 1;
RESET queen.rotation_min_size;

-- Compaction needs READ COMMITTED: a REPEATABLE READ snapshot may miss fresh segments
-- committed (or copied forward by a rotation) since it was taken.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT queen.compact();
ROLLBACK;

-- Bad input.
SELECT queen.retain('bad name!');
