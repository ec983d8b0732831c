-- What a pg_dump holds of queen (docs/concepts.md, "Backup and restore"): every table and
-- sequence in the schema, with the rows pg_dump takes of it. A table added to queen shows up here, and this test fails until its place
-- in dumps is decided (pg_extension_config_dump in sql/schema.sql and the update script,
-- whose catalog the upgrade test compares with a fresh install's).
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
RESET client_min_messages;

-- Not dumped on purpose: the partitioned parents (their rows are the partitions'),
-- queen.generations (its one row comes from CREATE EXTENSION; the default is correct
-- wherever the restored rows are) and queen.limit_buckets (tokens refill).
SELECT c.relname, c.relkind,
       CASE WHEN x.cond IS NULL THEN 'not dumped' WHEN x.cond = '' THEN 'every row' ELSE x.cond END AS dumped
  FROM pg_class c
  LEFT JOIN LATERAL (SELECT u.cond FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS u(rel, cond)
                      WHERE e.extname = 'queen' AND u.rel = c.oid) x ON true
 WHERE c.relnamespace = 'queen'::regnamespace AND c.relkind IN ('r', 'p', 'S')
 ORDER BY x.cond IS NULL, c.relname;
