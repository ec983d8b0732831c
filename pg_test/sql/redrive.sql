-- Bulk redrive (docs/functions.md#dlq_redrive): 10,000 dead letters of group billing go
-- back to billing only, each once, in the original partition order; audit sees none.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN 'no error';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$;

SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object(
  'queue', 'rd', 'partition', 'p' || (i % 2), 'payload', i, 'headers', jsonb_build_object('n', i)))
  FROM generate_series(1, 10000) i));
-- audit consumes everything; then billing's copies all expire (a 1 ms ttl), which files
-- 10,000 dead letters of billing.
SELECT count(*) AS audit_read FROM queen.pop('rd', 'audit', batch => 10000, max_partitions => 2, auto_ack => true);
SELECT queen.create_group('rd', 'billing') ->> 'created' AS billing_created;
SELECT queen.configure('rd', ttl => '1 millisecond') ->> 'ttl' AS ttl;
SELECT pg_sleep(0.05);
SELECT count(*) AS billing_got FROM queen.pop('rd', 'billing', batch => 10, max_partitions => 2, auto_ack => true);
SELECT queen.configure('rd') ->> 'ttl' AS ttl_off;
SELECT consumer_group, reason, count(*) FROM queen.log_dlq GROUP BY 1, 2;

-- Redrive in two calls: the first stops at max_messages and says there is more.
SELECT queen.dlq_redrive('rd', 'billing', max_messages => 4000) - 'last' AS first;
SELECT queen.dlq_redrive('rd', 'billing') - 'last' AS second;
SELECT queen.dlq_redrive('rd', 'billing') - 'last' AS nothing_left;
SELECT count(*) FILTER (WHERE redriven_at IS NOT NULL) AS marked, count(*) AS rows FROM queen.log_dlq;

-- audit passes over all 10,000 copies and gets nothing; its cursors reach the end.
SELECT count(*) AS audit_sees FROM queen.pop('rd', 'audit', batch => 100000, max_partitions => 2, auto_ack => true);
SELECT consumer_group, sum(lag) AS lag FROM queen.status('rd') WHERE consumer_group = 'audit' GROUP BY 1;
-- billing gets each once, in each partition's original order, with its headers and the
-- redrive header.
CREATE TEMP TABLE got AS SELECT * FROM queen.pop('rd', 'billing', batch => 100000, max_partitions => 2, auto_ack => true);
SELECT count(*) AS billing_got, count(DISTINCT payload) AS distinct_payloads FROM got;
SELECT partition, bool_and(ordered) AS in_original_order FROM (
  SELECT partition, (payload::int > lag(payload::int, 1, 0) OVER (PARTITION BY partition ORDER BY msg_offset)) AS ordered FROM got) x
 GROUP BY 1 ORDER BY 1;
SELECT headers FROM got ORDER BY partition, msg_offset LIMIT 1;

-- force redrives again; 'all' goes to every group (as dlq_replay). A filter narrows it.
SELECT (queen.dlq_redrive('rd', 'billing', error_like => 'expired%', max_messages => 3, deliver_to => 'all', force => true) ->> 'redriven')::int AS forced_to_all;
SELECT count(*) AS audit_gets_all_copies FROM queen.pop('rd', 'audit', batch => 100, max_partitions => 2, auto_ack => true);
SELECT count(*) AS billing_gets_all_copies FROM queen.pop('rd', 'billing', batch => 100, max_partitions => 2, auto_ack => true);
SELECT (queen.dlq_redrive('rd', 'billing', partition => 'p0', since => now() + interval '1 day') ->> 'redriven')::int AS none_since;

-- A copy that fails again keeps its redrive header in the DLQ; redriven to 'all', the
-- header is taken off and every group gets it.
SELECT (queen.dlq_redrive('rd', 'billing', max_messages => 1, force => true) ->> 'redriven')::int AS one_more;
CREATE TEMP TABLE again AS SELECT * FROM queen.pop('rd', 'billing', batch => 10, max_partitions => 2, lease_seconds => 60);
SELECT count(*) AS copies, min(headers ->> 'queen.redrive') AS for_group FROM again;
SELECT (queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'bad copy') -> 'items' -> 0 ->> 'success')::bool AS filed FROM again;
SELECT headers ->> 'queen.redrive' AS header_in_dlq FROM queen.dlq('rd', 'billing') WHERE error_message = 'bad copy';
SELECT (queen.dlq_redrive('rd', 'billing', error_like => 'bad copy', deliver_to => 'all') ->> 'redriven')::int AS to_all;
SELECT count(*) AS audit_gets_it, bool_or(headers ? 'queen.redrive') AS header_left
  FROM queen.pop('rd', 'audit', batch => 10, max_partitions => 2, auto_ack => true);
SELECT count(*) AS billing_gets_it FROM queen.pop('rd', 'billing', batch => 10, max_partitions => 2, auto_ack => true);

-- Span rows (purge) are not messages: never redriven.
SELECT count(*) FROM queen.push('rd', '1', partition => 'p0');
SELECT (queen.purge('rd', 'billing') ->> 'purged')::int AS purged;
SELECT (queen.dlq_redrive('rd', 'billing', force => true, max_messages => 100000) ->> 'redriven')::int AS redriven_without_spans;

-- Copies for billing that expire are never filed for audit: audit passes them over as
-- not its own (one pop passes at most 10,000, so two pops pass all 10,002).
SELECT queen.configure('rd', ttl => '1 millisecond') ->> 'ttl' AS short_ttl;
SELECT (queen.dlq_redrive('rd', 'billing', max_messages => 1, force => true) ->> 'redriven')::int AS copy;
SELECT pg_sleep(0.05);
SELECT count(*) AS audit_gets FROM queen.pop('rd', 'audit', batch => 10, max_partitions => 2, auto_ack => true);
SELECT count(*) AS audit_gets FROM queen.pop('rd', 'audit', batch => 10, max_partitions => 2, auto_ack => true);
SELECT sum(lag) AS audit_lag FROM queen.status('rd') WHERE consumer_group = 'audit';
-- (The one row: the plain message pushed before the purge, which audit never read, expired
-- for audit as any message does. No copy of billing's is among them.)
SELECT reason, data FROM queen.dlq('rd', 'audit');
SELECT queen.configure('rd') ->> 'ttl' AS ttl_off;

-- Bad input changes nothing.
-- The redrive header is queen's: a producer may not set it (it could hide a message).
SELECT pg_temp.err($$SELECT * FROM queen.push('rd', '1', headers => '{"queen.redrive": "nobody"}')$$);
SELECT pg_temp.err($$SELECT * FROM queen.push_batch('[{"queue": "rd", "payload": 1, "headers": {"queen.redrive": 5}}]')$$);
SELECT pg_temp.err($$SELECT queen.dlq_redrive(NULL)$$);
SELECT pg_temp.err($$SELECT queen.dlq_redrive('rd', max_messages => 0)$$);
SELECT pg_temp.err($$SELECT queen.dlq_redrive('rd', max_messages => 100001)$$);
SELECT pg_temp.err($$SELECT queen.dlq_redrive('rd', deliver_to => 'everyone')$$);
SELECT pg_temp.err($$SELECT queen.dlq_redrive('rd', 'billing', force => NULL)$$);
SELECT pg_temp.err($$SELECT queen.dlq_redrive('rd', consumer_group => '')$$);
SELECT (queen.dlq_redrive('no_such_queue') ->> 'redriven')::int AS unknown_queue;

-- A dead letter whose group was dropped: a copy for that group alone would reach no one
-- (every other group passes it), so the failing-group redrive leaves it in place, unmarked,
-- and counts it; deliver_to => 'all' redrives it to every group.
SELECT count(*) FROM queen.push('rg', '"for gone"');
SELECT queen.ack(lease_id, partition_id, msg_offset, 'dlq', 'no') -> 'items' -> 0 ->> 'dlq' AS filed
  FROM queen.pop('rg', 'gone');
SELECT count(*) AS other_caught_up FROM queen.pop('rg', 'other', batch => 10, auto_ack => true);
SELECT queen.drop_group('rg', 'gone') ->> 'dropped' AS gone_dropped;
SELECT queen.dlq_redrive('rg') - 'last' AS to_failing_group;
SELECT count(*) AS marked FROM queen.log_dlq d JOIN queen.queues q USING (queue_id)
 WHERE q.name = 'rg' AND d.redriven_at IS NOT NULL;
SELECT queen.dlq_redrive('rg', deliver_to => 'all') - 'last' AS to_all;
SELECT msg_offset, payload FROM queen.pop('rg', 'other', batch => 10, auto_ack => true);
