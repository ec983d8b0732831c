-- Upgrade test, part 1 (scripts/upgrade_test.sh): the previous release (0.3.0), its
-- library and its install script, writes data. Then the server restarts on the current
-- library and upgrade_after.sql runs.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen VERSION '0.3.0';
RESET client_min_messages;
SELECT extversion FROM pg_extension WHERE extname = 'queen';

-- Data written by 0.3.0: a lease held across the restart (0.3.0 keeps leases in shared
-- memory only: it is lost), a group's cursor in the lane journal, a dead letter, segments
-- of both tiers, a producer transaction id (dedup entry).
SELECT count(*) FROM queen.push_batch('[{"queue": "up", "partition": "a", "payload": 1},
                                        {"queue": "up", "partition": "a", "payload": 2},
                                        {"queue": "up", "partition": "b", "payload": 3}]');
SELECT count(*) FROM queen.push('up', '4', 'a', transaction_id => 'once');
CREATE TABLE held AS SELECT * FROM queen.pop('up', batch => 1, partition => 'a');
SELECT msg_offset, payload, lease_id IS NOT NULL AS leased FROM held;
SELECT count(*) FROM queen.pop('up', 'audit', batch => 1, partition => 'b', auto_ack => true);
SELECT queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'old') -> 'items' -> 0 -> 'dlq' AS dlq
  FROM queen.pop('up', batch => 1, partition => 'b');
-- A second copy of that dead letter, filed later, as two pops under REPEATABLE READ could
-- file one in 0.3.0 (its check looked under the snapshot): the upgrade keeps the first.
INSERT INTO queen.log_dlq (id, queue_id, partition_id, consumer_group, msg_offset, message_id, transaction_id,
                           data, error_message, retry_count, failed_at, envelope, headers)
SELECT gen_random_uuid(), queue_id, partition_id, consumer_group, msg_offset, message_id, transaction_id,
       data, 'second copy', retry_count, failed_at + interval '1 second', envelope, headers
  FROM queen.log_dlq;
SELECT count(*) AS dead_letters FROM queen.log_dlq;
-- A budget allowance 0.4.0 refuses (over 365 days), which 0.3.0 stored wrapped around to
-- a negative interval, on a queue of its own.
SELECT queen.configure_group('up-huge', 'forever', handler_timeout => '106751992 days') IS NOT NULL AS configured;

-- Roles with the grants of 0.3.0: direct EXECUTE on functions (the "finer grants"). The
-- upgrade replaces queen.configure (it gains create_groups and partition_idle_ttl) and
-- queen.dlq_replay and queen.dlq_delete (they gain id), and keeps who may call them.
CREATE ROLE queen_upgrade_app;
CREATE ROLE "Queen Upgrade-Ops";
GRANT USAGE ON SCHEMA queen TO queen_upgrade_app;
GRANT EXECUTE ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text, bigint) TO queen_upgrade_app;
GRANT EXECUTE ON FUNCTION queen.push(text, jsonb, text, text, jsonb, timestamptz) TO queen_upgrade_app;
GRANT EXECUTE ON FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int, interval, interval, interval)
  TO "Queen Upgrade-Ops" WITH GRANT OPTION;
GRANT EXECUTE ON FUNCTION queen.configure_group(text, text, interval, interval, interval, interval) TO "Queen Upgrade-Ops";
GRANT EXECUTE ON FUNCTION queen.dlq_delete(uuid, text), queen.dlq_replay(uuid, text) TO "Queen Upgrade-Ops";
