-- Consumer lease budgets in SQL (docs/functions.md#configure_group, #may_start).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN 'no error';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$;
CREATE FUNCTION pg_temp.secs(t timestamptz) RETURNS int LANGUAGE sql AS $$
  SELECT round(extract(epoch FROM t - clock_timestamp()))::int $$;

SELECT count(*) FROM queen.push_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'payments.requested', 'payload', i)) FROM generate_series(1, 8) i));

-- The example values: 15 s queue margin + 30 s handler + 1 s grace + 2 s record = 48 s.
SELECT queen.configure_group('payments.requested', 'charge-cards');
CREATE TEMP TABLE claim AS SELECT * FROM queen.pop('payments.requested', 'charge-cards', batch => 4);
SELECT msg_offset, pg_temp.secs(lease_expires_at) AS lease_s FROM claim;
-- lease_seconds still wins; a group without a budget uses the queue's lease_time (60).
SELECT DISTINCT pg_temp.secs(lease_expires_at) AS explicit_s FROM queen.pop('payments.requested', 'other', batch => 4, lease_seconds => 7);
SELECT DISTINCT pg_temp.secs(lease_expires_at) AS queue_s FROM queen.pop('payments.requested', 'third', batch => 4);

-- may_start: just under 48 s remain; a start needs timeout + 1 s + 2 s. (Terse: the
-- warning's DETAIL gives the remaining time to the millisecond.)
\set VERBOSITY terse
SELECT queen.may_start(lease_id) AS group_default_30s FROM claim LIMIT 1;
SELECT queen.may_start(lease_id, '44 s') AS needs_47s FROM claim LIMIT 1;
SELECT queen.may_start(lease_id, '45 s') AS needs_48s FROM claim LIMIT 1;
SELECT queen.may_start(lease_id, '46 s') AS needs_49s FROM claim LIMIT 1;
-- Starting a handler does not restart the lease: the deadline is the claim's.
SELECT count(DISTINCT lease_expires_at) AS one_deadline FROM claim;
-- An expired or unknown lease is false, with the warning.
SELECT queen.may_start(gen_random_uuid()) AS unknown;
SELECT queen._expire_lease((SELECT lease_id FROM claim LIMIT 1)) AS expired_lanes;
SELECT queen.may_start(lease_id) AS expired FROM claim LIMIT 1;

\set VERBOSITY default
-- Updating the budget changes the next claim.
SELECT queen.configure_group('payments.requested', 'charge-cards', handler_timeout => '3 s', queue_margin => '1.5 s',
                             timeout_grace => '0.1 s', record_margin => '0.2 s') ->> 'leaseSeconds' AS lease_seconds;

-- Bad input.
SELECT pg_temp.err($$SELECT queen.configure_group('q', 'g', handler_timeout => '-1 s')$$);
SELECT pg_temp.err($$SELECT queen.configure_group('q', 'g', handler_timeout => '0 s')$$);
-- A lease that may end before its pop returns leaves a group that never acks: the budget's
-- floor is 100 ms.
SELECT pg_temp.err($$SELECT queen.configure_group('q', 'g', handler_timeout => '0.05 s', queue_margin => '0', timeout_grace => '0', record_margin => '0')$$);
SELECT queen.configure_group('q', 'g', handler_timeout => '25 ms', queue_margin => '25 ms', timeout_grace => '25 ms', record_margin => '25 ms') ->> 'leaseSeconds' AS floor;
SELECT pg_temp.err($$SELECT queen.configure_group('q', 'g', queue_margin => '1 mon')$$);
SELECT pg_temp.err($$SELECT queen.configure_group('q', NULL)$$);
SELECT pg_temp.err($$SELECT queen.configure_group('bad name', 'g')$$);
SELECT pg_temp.err($$SELECT queen.may_start(NULL)$$);
