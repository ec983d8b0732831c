-- The demo `make run` shows: push, pop with a lease, ack.
\echo '-- push three messages to the queue demo'
SELECT idx, status, msg_offset FROM queen.push('demo', '{"hello": "world"}');
SELECT idx, status, msg_offset FROM queen.push_batch(
  '[{"queue": "demo", "payload": {"n": 2}}, {"queue": "demo", "payload": {"n": 3}}]');
\echo '-- pop two under a lease'
CREATE TEMP TABLE demo_batch AS SELECT * FROM queen.pop('demo', batch => 2);
SELECT msg_offset, payload, lease_expires_at - now() AS lease_left FROM demo_batch;
\echo '-- ack the lease: the cursor moves'
SELECT queen.ack(lease_id) FROM demo_batch LIMIT 1;
\echo '-- the rest, auto-acked'
SELECT msg_offset, payload FROM queen.pop('demo', batch => 10, auto_ack => true);
