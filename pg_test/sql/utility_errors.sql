-- queen chains PostgreSQL's ProcessUtility hook (with shared_preload_libraries), so every
-- utility statement of the database passes through it: DO, CALL, COPY, EXECUTE, DDL. An
-- ERROR such a statement raises must reach the client as PostgreSQL raised it, with its
-- CONTEXT, DETAIL, HINT and the schema, table and constraint names drivers read.
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS queen CASCADE;
CREATE EXTENSION queen;
DROP TABLE IF EXISTS ue_items;
DROP PROCEDURE IF EXISTS ue_insert(int);
RESET client_min_messages;

-- The library is loaded (with shared_preload_libraries its hook was in place already; this
-- test also runs on a cluster without it, where these statements never pass through queen).
SELECT count(*) FROM queen.push('ue', '{"a": 1}');

-- A DO block's error: its detail and hint as raised, and its context line.
DO $$ BEGIN RAISE EXCEPTION 'boom' USING DETAIL = 'the detail', HINT = 'the hint', ERRCODE = '22023'; END $$;

CREATE TABLE ue_items (id int CONSTRAINT ue_items_pkey PRIMARY KEY, note text CHECK (note <> ''));
CREATE PROCEDURE ue_insert(v int) LANGUAGE sql AS $$ INSERT INTO ue_items VALUES (v, 'x') $$;
CALL ue_insert(1);

-- A unique violation inside CALL: its detail, and its context.
CALL ue_insert(1);

-- COPY's error names the line it stopped at.
COPY ue_items FROM stdin;
2	fine
3	
\.

-- EXECUTE of a prepared statement is a utility statement too.
PREPARE ue_dup AS INSERT INTO ue_items VALUES (1, 'y');
EXECUTE ue_dup;

-- What a driver reads from the error: every field, caught where the CALL ran (inside
-- PL/pgSQL, the CALL goes through SPI and the same hook).
DO $$
DECLARE
  state text; msg text; detail text; hint text; ctx text; sch text; tbl text; con text;
BEGIN
  CALL ue_insert(1);
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL,
    hint = PG_EXCEPTION_HINT, ctx = PG_EXCEPTION_CONTEXT, sch = SCHEMA_NAME, tbl = TABLE_NAME,
    con = CONSTRAINT_NAME;
  RAISE NOTICE 'sqlstate %, message %, detail %, schema %, table %, constraint %',
    state, msg, detail, sch, tbl, con;
  RAISE NOTICE 'context %', ctx;
END $$;

-- A check violation: its constraint name too.
DO $$
DECLARE con text; tbl text;
BEGIN
  EXECUTE 'COPY ue_items FROM PROGRAM ''printf "9\t\n"''';
EXCEPTION WHEN check_violation THEN
  GET STACKED DIAGNOSTICS con = CONSTRAINT_NAME, tbl = TABLE_NAME;
  RAISE NOTICE 'check violation: table %, constraint %', tbl, con;
END $$;

SELECT id, note FROM ue_items ORDER BY id;

DROP PROCEDURE ue_insert(int);
DROP TABLE ue_items;
