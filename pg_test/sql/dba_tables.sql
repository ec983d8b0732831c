-- What a DBA adds to queen's tables is honoured: queen writes the rows of the hottest
-- paths (the fresh segment of a small push, the lane journal row of an ack) directly, not
-- through an INSERT, and does so only while the table has nothing an INSERT's executor
-- would apply. An audit or replication trigger fires, and CHECK and exclusion constraints
-- hold.
-- (queen runs with its search path pinned, so a trigger names its tables in full.)
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
DROP TABLE IF EXISTS dba_audit;
RESET client_min_messages;
-- An exclusion constraint (here: no two fresh segments of one transaction, which share
-- its start as their time) holds for a push (23P01); written directly, the second row
-- would pass it.
ALTER TABLE queen.fresh_segments_0 ADD CONSTRAINT dba_one_per_xact_0 EXCLUDE USING btree (created_at WITH =);
ALTER TABLE queen.fresh_segments_1 ADD CONSTRAINT dba_one_per_xact_1 EXCLUDE USING btree (created_at WITH =);
BEGIN;
SELECT count(*) FROM queen.push('dba', '"first"');
\set VERBOSITY sqlstate
SELECT count(*) FROM queen.push('dba', '"second"', partition => 'p2');
\set VERBOSITY default
ROLLBACK;
ALTER TABLE queen.fresh_segments_0 DROP CONSTRAINT dba_one_per_xact_0;
ALTER TABLE queen.fresh_segments_1 DROP CONSTRAINT dba_one_per_xact_1;

CREATE TABLE dba_audit (tbl text, op text);
CREATE FUNCTION dba_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.dba_audit VALUES (TG_TABLE_NAME, TG_OP);
  RETURN NEW;
END $$;
-- A statement trigger on the parent (the table the fallback INSERT names), alone.
CREATE TRIGGER dba_audit_stmt AFTER INSERT ON queen.fresh_segments FOR EACH STATEMENT EXECUTE FUNCTION dba_audit_row();
SELECT count(*) FROM queen.push('dba', '"zero"');
SELECT tbl, op, count(*) FROM dba_audit GROUP BY 1, 2 ORDER BY 1;
TRUNCATE dba_audit;
-- Row triggers on the tables written.
CREATE TRIGGER dba_audit AFTER INSERT ON queen.fresh_segments_0 FOR EACH ROW EXECUTE FUNCTION dba_audit_row();
CREATE TRIGGER dba_audit AFTER INSERT ON queen.fresh_segments_1 FOR EACH ROW EXECUTE FUNCTION dba_audit_row();
CREATE TRIGGER dba_audit AFTER INSERT ON queen.lane_journal_0 FOR EACH ROW EXECUTE FUNCTION dba_audit_row();
CREATE TRIGGER dba_audit AFTER INSERT ON queen.lane_journal_1 FOR EACH ROW EXECUTE FUNCTION dba_audit_row();

SELECT count(*) FROM queen.push('dba', '"one"');
SELECT count(*) FROM queen.push_batch('[{"queue": "dba", "payload": 2}, {"queue": "dba", "payload": 3, "partition": "p2"}]');
SELECT regexp_replace(tbl, '_[01]$', '_N') AS tbl, op, count(*) FROM dba_audit GROUP BY 1, 2 ORDER BY 1;
-- The ack's journal rows (with the lane registry; without it an ack updates the lane's
-- row, and there is no journal).
SELECT count(*) FROM queen.pop('dba', batch => 10, max_partitions => 2, auto_ack => true);
SELECT ((SELECT count(*) FROM dba_audit WHERE tbl LIKE 'lane_journal_%') > 0)
       = (current_setting('shared_preload_libraries') ~ 'queen') AS journal_rows_audited;

-- A CHECK constraint a DBA adds (for new rows) holds for a push too (23514), which then
-- stores nothing.
ALTER TABLE queen.fresh_segments_0 ADD CONSTRAINT dba_small CHECK (octet_length(data) < 10) NOT VALID;
ALTER TABLE queen.fresh_segments_1 ADD CONSTRAINT dba_small CHECK (octet_length(data) < 10) NOT VALID;
\set VERBOSITY sqlstate
SELECT count(*) FROM queen.push('dba', '"a payload longer than the check allows"');
\set VERBOSITY default
SELECT count(*) FROM queen.pop('dba', batch => 10, max_partitions => 2, auto_ack => true);

-- Taken off again: pushes and pops go on, and nothing fires.
ALTER TABLE queen.fresh_segments_0 DROP CONSTRAINT dba_small;
ALTER TABLE queen.fresh_segments_1 DROP CONSTRAINT dba_small;
DROP TRIGGER dba_audit ON queen.fresh_segments_0;
DROP TRIGGER dba_audit ON queen.fresh_segments_1;
DROP TRIGGER dba_audit ON queen.lane_journal_0;
DROP TRIGGER dba_audit ON queen.lane_journal_1;
DROP TRIGGER dba_audit_stmt ON queen.fresh_segments;
TRUNCATE dba_audit;
SELECT count(*) FROM queen.push('dba', '"after"');
SELECT payload FROM queen.pop('dba', batch => 10, max_partitions => 2, auto_ack => true);
SELECT count(*) AS audited FROM dba_audit;
DROP TABLE dba_audit;
DROP FUNCTION dba_audit_row();
