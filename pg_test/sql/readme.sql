CREATE EXTENSION IF NOT EXISTS queen;

-- Producers push JSON. A queue is created on first use.
SELECT idx, status, msg_offset FROM queen.push('orders', '{"id": 1, "item": "book"}');
SELECT idx, status, msg_offset
  FROM queen.push_batch('[{"queue": "orders", "payload": {"id": 2}},
                          {"queue": "orders", "payload": {"id": 3}, "transactionId": "order-3"}]');

-- A consumer pops a batch under a lease (60 s on a queue nobody configured) ...
CREATE TEMP TABLE got AS SELECT * FROM queen.pop('orders', batch => 2);
SELECT msg_offset, payload, attempt,
       lease_expires_at BETWEEN now() + interval '59 s' AND now() + interval '61 s' AS leased_60s
  FROM got;

-- ... while the lease is live, nobody else in its group gets that partition ...
SELECT count(*) FROM queen.pop('orders');

-- ... and acks it: the cursor moves to the end of the batch, the lease is released.
SELECT r -> 'lanes' -> 0 -> 'committed' AS committed,
       r -> 'lanes' -> 0 -> 'leaseReleased' AS released
  FROM (SELECT queen.ack(lease_id) AS r FROM got LIMIT 1) ack;

-- The next pop continues after the batch. auto_ack commits in the same call.
SELECT msg_offset, transaction_id, payload, lease_id IS NULL AS no_lease
  FROM queen.pop('orders', auto_ack => true);

-- Another consumer group reads the same stream from the start: fan-out.
SELECT msg_offset, payload FROM queen.pop('orders', 'audit', batch => 10, auto_ack => true);
