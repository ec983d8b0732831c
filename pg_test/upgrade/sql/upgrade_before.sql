-- Upgrade test, part 1 (scripts/upgrade_test.sh): the previous release (0.2.0), its
-- library and its install script, writes data. Then the server restarts on the current
-- library and upgrade_after.sql runs.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen VERSION '0.2.0';
RESET client_min_messages;
SELECT extversion FROM pg_extension WHERE extname = 'queen';

-- Data written by 0.2.0: a lease held across the upgrade, a group's cursor, a dead letter,
-- segments in format 1, partition heads kept by the partition row lock.
SELECT count(*) FROM queen.push_batch('[{"queue": "up", "partition": "a", "payload": 1},
                                        {"queue": "up", "partition": "a", "payload": 2},
                                        {"queue": "up", "partition": "b", "payload": 3}]');
CREATE TABLE held AS SELECT * FROM queen.pop('up', batch => 1, partition => 'a');
SELECT msg_offset, payload, lease_id IS NOT NULL AS leased FROM held;
SELECT count(*) FROM queen.pop('up', 'audit', batch => 1, partition => 'b', auto_ack => true);
SELECT queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'old') -> 'items' -> 0 -> 'dlq' AS dlq
  FROM queen.pop('up', batch => 1, partition => 'b');

-- A role that may pop and push: the upgrade replaces queen.pop (it gains max_bytes) and
-- queen.push (it gains headers) and keeps the grants.
CREATE ROLE queen_upgrade_app;
CREATE ROLE "Queen Upgrade-Ops";
GRANT EXECUTE ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text) TO queen_upgrade_app;
GRANT EXECUTE ON FUNCTION queen.pop(text, text, int, text, int, bool, int, int, text) TO "Queen Upgrade-Ops" WITH GRANT OPTION;
GRANT EXECUTE ON FUNCTION queen.push(text, jsonb, text, text) TO queen_upgrade_app;
GRANT EXECUTE ON FUNCTION queen.ack(uuid, uuid, bigint, text, text) TO queen_upgrade_app;
GRANT EXECUTE ON FUNCTION queen.configure(text, int, int, bool, bool, int, bool, int) TO "Queen Upgrade-Ops";
