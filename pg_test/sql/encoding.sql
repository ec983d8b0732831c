-- queen needs a UTF8 database. In a database of another encoding CREATE EXTENSION fails
-- with 0A000 and a message that names the encoding: single-byte encodings, SQL_ASCII
-- (where a text may hold any bytes) and a multibyte one alike. Before this check, queen
-- installed in SQL_ASCII and LATIN1 databases, where push_batch turned distinct
-- non-UTF-8 transaction ids into one string, and the later messages were answered
-- 'duplicate' and never stored.
SET client_min_messages = warning;
DROP DATABASE IF EXISTS queen_enc_sql_ascii;
DROP DATABASE IF EXISTS queen_enc_latin1;
DROP DATABASE IF EXISTS queen_enc_euc_jp;
RESET client_min_messages;
CREATE DATABASE queen_enc_sql_ascii TEMPLATE template0 ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C';
CREATE DATABASE queen_enc_latin1 TEMPLATE template0 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C';
CREATE DATABASE queen_enc_euc_jp TEMPLATE template0 ENCODING 'EUC_JP' LC_COLLATE 'C' LC_CTYPE 'C';
\set VERBOSITY sqlstate
\c queen_enc_sql_ascii
CREATE EXTENSION queen;
\c queen_enc_latin1
CREATE EXTENSION queen;
\c queen_enc_euc_jp
CREATE EXTENSION queen;
\set VERBOSITY default
CREATE EXTENSION queen;
SELECT count(*) AS installed FROM pg_extension WHERE extname = 'queen';
\c queen_regress
SET client_min_messages = warning;
DROP DATABASE queen_enc_sql_ascii;
DROP DATABASE queen_enc_latin1;
DROP DATABASE queen_enc_euc_jp;
RESET client_min_messages;

-- The install script is ASCII, so the check above is what any encoding meets first (a
-- character that the database's encoding cannot hold would fail the whole script before it).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS queen;
RESET client_min_messages;
SELECT pg_read_file(s.setting || '/extension/queen--' || e.extversion || '.sql') ~ '[^[:ascii:]]' AS not_ascii
  FROM pg_config s, pg_extension e WHERE s.name = 'SHAREDIR' AND e.extname = 'queen';
