-- Message TTL (docs/concepts.md#message-ttl): a message older than the queue's ttl is not
-- delivered to a group that has not consumed it; it becomes a dead letter with reason
-- 'expired' (or is dropped without a DLQ), and the lane passes it in order.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN 'no error';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$;

SELECT queen.configure('short', ttl => '300 milliseconds') ->> 'ttl' AS ttl_seconds;
SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'short', 'payload', i)) FROM generate_series(1, 3) i));
-- Group fast consumes the first message in time.
SELECT payload FROM queen.pop('short', 'fast', auto_ack => true);
SELECT pg_sleep(0.4);
SELECT count(*) FROM queen.push('short', '4');
-- Now 2 and 3 have expired for fast; 1, 2 and 3 for slow, which never read any. Each
-- gets message 4, in order, and a dead letter per expired message.
SELECT msg_offset, payload FROM queen.pop('short', 'fast', batch => 10, auto_ack => true);
SELECT msg_offset, payload FROM queen.pop('short', 'slow', batch => 10, auto_ack => true);
SELECT consumer_group, reason, data, error_message FROM queen.dlq('short') ORDER BY consumer_group, data::text;
SELECT consumer_group, committed, lag FROM queen.status('short') ORDER BY 1;
SELECT metric, consumer_group, value FROM queen.metrics('dead_letters') WHERE queue = 'short' ORDER BY 1, 2;

-- A lane that holds only expired messages: the pop returns nothing and the cursor passes them.
SELECT count(*) FROM queen.push_batch('[{"queue": "short", "partition": "old", "payload": 1}, {"queue": "short", "partition": "old", "payload": 2}]');
SELECT pg_sleep(0.4);
SELECT count(*) AS delivered FROM queen.pop('short', 'fast', partition => 'old', batch => 10, lease_seconds => 30);
SELECT partition, consumer_group, committed, lease_id IS NULL AS no_lease FROM queen.status('short') WHERE partition = 'old';
-- Filed once, however often pops meet them (a second pop finds the lane passed).
SELECT count(*) AS again FROM queen.pop('short', 'fast', partition => 'old', batch => 10);
SELECT count(*) AS expired_rows FROM queen.dlq('short', 'fast') WHERE reason = 'expired';

-- Without a DLQ, expired messages are dropped: passed over, no row.
SELECT queen.configure('nodlq', dead_letter_queue => false, dlq_after_max_retries => false, ttl => '300 milliseconds') ->> 'ttl';
SELECT count(*) FROM queen.push('nodlq', '"old"');
SELECT pg_sleep(0.4);
SELECT count(*) FROM queen.push('nodlq', '"new"');
SELECT msg_offset, payload FROM queen.pop('nodlq', batch => 10, auto_ack => true);
SELECT count(*) AS dead_letters FROM queen.dlq('nodlq');
-- They are counted in metrics (expired_dropped) ...
SELECT value AS dropped FROM queen.metrics('dead_letters') WHERE metric = 'expired_dropped' AND queue = 'nodlq';
-- ... once, even when a pop meets them again after a lease expired unacked ("new2" has
-- expired too by the second pop: three in all).
SELECT count(*) FROM queen.push('nodlq', '"old2"');
SELECT pg_sleep(0.4);
SELECT count(*) FROM queen.push('nodlq', '"new2"');
SELECT payload FROM queen.pop('nodlq', batch => 10, lease_seconds => 1);
SELECT pg_sleep(1.1);
SELECT count(*) AS redelivered FROM queen.pop('nodlq', batch => 10, auto_ack => true);
SELECT value AS dropped FROM queen.metrics('dead_letters') WHERE metric = 'expired_dropped' AND queue = 'nodlq';

-- ttl 0 (the default) never expires anything.
SELECT queen.configure('short', ttl => '0s') ->> 'ttl' AS off;
SELECT count(*) FROM queen.push('short', '5', partition => 'later');
SELECT pg_sleep(0.4);
SELECT payload FROM queen.pop('short', 'fast', partition => 'later', auto_ack => true);

-- Bad input changes nothing.
SELECT pg_temp.err($$SELECT queen.configure('short', ttl => '-1 s')$$);
SELECT pg_temp.err($$SELECT queen.configure('short', ttl => '366 days')$$);
SELECT pg_temp.err($$SELECT queen.configure('short', ttl => NULL)$$);
SELECT ttl FROM queen.queues WHERE name = 'short';

-- The ttl counts from when a message may be delivered: a message delayed as long as the
-- ttl, or longer (the queue's delay, its own deliver_at), still gets the whole ttl once
-- due, and is delivered, not dropped unseen.
SELECT queen.configure('late', delay => '1 s', ttl => '1 s', dead_letter_queue => false) ->> 'ttl' AS ttl;
SELECT count(*) FROM queen.push('late', '"delayed as long as the ttl"');
SELECT count(*) FROM queen.push('late', '"due later still"', deliver_at => clock_timestamp() + interval '1.5 s');
SELECT count(*) AS not_due FROM queen.pop('late', batch => 10, auto_ack => true);
-- Due at 1 s, expiring at 2 s; the second at 1.5 s and 2.5 s.
SELECT pg_sleep(1.1);
SELECT payload FROM queen.pop('late', batch => 10, auto_ack => true);
SELECT pg_sleep(0.6);
SELECT payload FROM queen.pop('late', batch => 10, auto_ack => true);
SELECT count(*) AS dead_letters FROM queen.dlq('late');

-- A shorter delay (here a configure that leaves delay out: it goes back to 0) moves the
-- due time of stored messages back; they were not deliverable before, so the ttl counts
-- from the change, and they are delivered, not expired at once.
SELECT queen.configure('cut', delay => '10 s', ttl => '2 s', dead_letter_queue => false) ->> 'ttl' AS ttl;
SELECT count(*) FROM queen.push('cut', '"waited for its delay"');
SELECT pg_sleep(2.2);
SELECT count(*) AS not_due FROM queen.pop('cut', batch => 10, auto_ack => true);
SELECT queen.configure('cut', ttl => '2 s', dead_letter_queue => false) ->> 'delay' AS delay;
SELECT payload FROM queen.pop('cut', batch => 10, auto_ack => true);
