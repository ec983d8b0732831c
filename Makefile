# queen — make run: install what is missing, build, install, start a local cluster, demo.
#         make test: every test layer (unit, pgrx, pg_regress + isolation, integration).
#         make soak: the invariants harness for 10 minutes under crashes and fail points.
SHELL := /bin/bash
PG_CONFIG := /usr/lib/postgresql/15/bin/pg_config
PGBIN     := /usr/lib/postgresql/15/bin
REGRESS   := /usr/lib/postgresql/15/lib/pgxs/src/test/regress
# Unlink the installed library before replacing it: overwriting the file in place would
# change pages a running server has mapped (SIGBUS); a new file leaves them alone.
UNLINK_SO := rm -f /usr/lib/postgresql/15/lib/queen.so
export PATH := $(HOME)/.cargo/bin:$(PATH)

# The cluster `make run` leaves running (documented in the README).
RUN_DIR  ?= /var/tmp/queen-run
RUN_PORT ?= 5488
# The throwaway cluster the tests start and stop.
TEST_DIR  ?= /tmp/queen-test
TEST_PORT ?= 5487
TEST_DSN  := host=$(TEST_DIR)/sock port=$(TEST_PORT) user=postgres
TEST_CONF ?= scripts/test.conf
# The benchmark cluster: fixed settings in scripts/bench.conf.
BENCH_DIR  ?= /tmp/queen-bench
BENCH_PORT ?= 5486
PSQL_RUN  := psql -X -v ON_ERROR_STOP=1 -h $(RUN_DIR)/sock -p $(RUN_PORT) -U postgres
PSQL_TEST := psql -X -q -v ON_ERROR_STOP=1 -h $(TEST_DIR)/sock -p $(TEST_PORT) -U postgres

REGRESS_TESTS := $(sort $(filter-out nopreload,$(basename $(notdir $(wildcard pg_test/sql/*.sql)))) readme)
# Run again on a cluster without shared_preload_libraries (scripts/nopreload.conf): every
# test whose output does not depend on gaps (offsets and compaction show them).
NOPRELOAD_TESTS := $(filter-out offsets compaction,$(REGRESS_TESTS)) nopreload
# Isolation specs also run without preloading: their table fallbacks.
NOPRELOAD_ISOLATION := limit_in_flight dlq_snapshot expired_drops ack_waits_release redrive_drop_group retention_prefix pop_push_seek legacy_first_call
NOPRELOAD_DIR  ?= /tmp/queen-nopreload
NOPRELOAD_PORT ?= 5490
# The second cluster of `make integration`.
TEST_B_DIR ?= /tmp/queen-test-b
TEST_B_PORT ?= 5484
POOLER_DIR ?= /tmp/queen-pooler
POOLER_PORT ?= 5491
EXPORTER_DIR ?= /tmp/queen-exporter
EXPORTER_PORT ?= 9491
RUN_EXPORTER_PORT ?= 9488
ISOLATION_TESTS := $(sort $(basename $(notdir $(wildcard pg_test/specs/*.spec))))

.PHONY: check soak citus-test bench-citus upgrade-test clients package fuzz bench bench-held deps build install install-debug run stop test lint unit pgrx-test regress integration \
        test-cluster-start test-cluster-stop readme-sql clean

deps:
	@bash scripts/deps.sh

# Besides the current version and the older upgrade scripts (sql/queen--A--B.sql, which
# pgrx copies): the previous versions' install scripts (the upgrade test starts from
# them), and the upgrade to the current version, built by scripts/upgrade_sql.py from the
# install script pgrx just wrote and the hand-written part in sql/upgrade/.
EXTENSION_DIR = $$($(PG_CONFIG) --sharedir)/extension
PREVIOUS_SQL := install -m 644 sql/previous/*.sql $(EXTENSION_DIR)/ && \
  for hand in sql/upgrade/queen--*--*.sql; do \
    to=$${hand\#\#*--}; \
    python3 scripts/upgrade_sql.py $(EXTENSION_DIR)/queen--$${to} $$hand > $(EXTENSION_DIR)/.upgrade.tmp \
      && mv $(EXTENSION_DIR)/.upgrade.tmp $(EXTENSION_DIR)/$$(basename $$hand) || exit 1; \
  done

install: deps
	$(UNLINK_SO)
	cargo pgrx install --release --pg-config $(PG_CONFIG)
	$(PREVIOUS_SQL)

# The tests' build: debug, with the fail points compiled in (src/pg/failpoints.rs).
install-debug: deps
	$(UNLINK_SO)
	cargo pgrx install --pg-config $(PG_CONFIG) --features failpoints
	$(PREVIOUS_SQL)

run: install
	@bash scripts/cluster.sh stop $(RUN_DIR) $(RUN_PORT)
	@bash scripts/cluster.sh start $(RUN_DIR) $(RUN_PORT)
	@$(PSQL_RUN) -q -c "CREATE EXTENSION IF NOT EXISTS queen"
	@$(PSQL_RUN) -q -c "ALTER EXTENSION queen UPDATE" >/dev/null 2>&1 || true
	@$(PSQL_RUN) -f scripts/demo.sql
	@bash scripts/exporter.sh stop $(RUN_DIR)-exporter $(RUN_EXPORTER_PORT)
	@bash scripts/exporter.sh start $(RUN_DIR)-exporter $(RUN_EXPORTER_PORT) \
	  "postgresql://postgres@127.0.0.1:$(RUN_PORT)/postgres?sslmode=disable"
	@echo
	@echo "queen is running. Connect with:"
	@echo "  psql -h $(RUN_DIR)/sock -p $(RUN_PORT) -U postgres"
	@echo "  (or TCP: psql -h 127.0.0.1 -p $(RUN_PORT) -U postgres)"
	@echo "Prometheus metrics (postgres_exporter with prometheus/queen.yaml):"
	@echo "  curl -s http://127.0.0.1:$(RUN_EXPORTER_PORT)/metrics | grep ^queen_"
	@echo "Stop it with: make stop"

stop:
	@bash scripts/exporter.sh stop $(RUN_DIR)-exporter $(RUN_EXPORTER_PORT)
	@bash scripts/cluster.sh stop $(RUN_DIR) $(RUN_PORT)

test: deps
	@MAKE="$(MAKE)" bash scripts/timed.sh lint unit pgrx-test install-debug regress integration upgrade-test citus-test
	@echo "make test: all layers passed"

# The inner loop (80 s on a warm build tree, about 3 minutes after a change to src/):
# formatting, layering and clippy,
# the core's unit and property tests, the in-server pgrx tests, the debug build installed,
# pg_regress and the isolation specs (with and without preloading). No integration tests.
check: deps
	@MAKE="$(MAKE)" bash scripts/timed.sh lint unit pgrx-test install-debug regress
	@echo "make check: passed (make test runs every layer)"

# The habits, enforced: rustfmt (rustfmt.toml), and clippy with every warning an error and
# every unsafe block explained (a SAFETY: note).
lint:
	cargo fmt --all --check
	python3 scripts/layers.py --self-test && python3 scripts/layers.py
	python3 scripts/upgrade_sql.py --self-test
	cargo clippy --workspace --all-targets -- -D warnings -D clippy::undocumented_unsafe_blocks

# queen on Citus 13.2.2: a coordinator and two workers of this machine, queues routed to
# their workers by queen.distribute() (scripts/citus_test.sh, docs/citus.md); the first
# run builds Citus from its vendored source archive (scripts/citus.sh).
CITUS_DIR  ?= /tmp/queen-citus
CITUS_PORT ?= 5492
citus-test: install-debug
	bash scripts/citus.sh
	bash scripts/citus_test.sh $(CITUS_DIR) $(CITUS_PORT)

# One node against a Citus coordinator and two workers of this machine: push and pop + ack
# over 16 queues, and the coordinator's delegation overhead per call (scripts/bench_citus.sh,
# about 5 minutes). Writes BENCHMARKS-citus.md.
BENCH_CITUS_DIR  ?= /tmp/queen-bench-citus
BENCH_CITUS_PORT ?= 5496
bench-citus: install
	bash scripts/citus.sh
	bash scripts/bench_citus.sh $(BENCH_CITUS_DIR) $(BENCH_CITUS_PORT) BENCHMARKS-citus.md

# Previous release's library writes data, the current one upgrades it (scripts/upgrade_test.sh).
upgrade-test:
	bash scripts/upgrade_test.sh

unit:
	cargo test -p queen-core -p queen-consumer --features queen-core/failpoints

# A deep run of the core's property tests (segment codec, cursor arithmetic): the number
# of cases per property is FUZZ_CASES. `make test` runs proptest's default of 256.
FUZZ_CASES ?= 50000
fuzz:
	PROPTEST_CASES=$(FUZZ_CASES) cargo test --release -p queen-core prop_ -- --nocapture

pgrx-test:
	$(UNLINK_SO)
	cargo pgrx test pg15 --runas postgres --pgdata /tmp/queen-pgrx

test-cluster-start:
	@bash scripts/cluster.sh stop $(TEST_DIR) $(TEST_PORT)
	@rm -rf $(TEST_DIR)
	@bash scripts/cluster.sh start $(TEST_DIR) $(TEST_PORT) $(TEST_CONF)

test-cluster-stop:
	@bash scripts/cluster.sh stop $(TEST_DIR) $(TEST_PORT)

# The README's SQL tour, extracted verbatim, is a regression test of its own.
readme-sql:
	@python3 scripts/readme_sql.py README.md > pg_test/sql/readme.sql

# Each layer starts its own fresh cluster (a recipe, not a prerequisite: make would run a
# shared prerequisite only once per invocation).
regress: readme-sql
	@$(MAKE) -s test-cluster-start TEST_CONF=scripts/regress.conf
	@mkdir -p /tmp/queen-regress-out /tmp/queen-isolation-out
	$(REGRESS)/pg_regress --host=$(TEST_DIR)/sock --port=$(TEST_PORT) --user=postgres \
	  --inputdir=pg_test --outputdir=/tmp/queen-regress-out --dbname=queen_regress \
	  $(REGRESS_TESTS) || { cat /tmp/queen-regress-out/regression.diffs; $(MAKE) -s test-cluster-stop; exit 1; }
	$(REGRESS)/../isolation/pg_isolation_regress --host=$(TEST_DIR)/sock --port=$(TEST_PORT) \
	  --user=postgres --inputdir=pg_test --outputdir=/tmp/queen-isolation-out \
	  --dbname=queen_isolation $(ISOLATION_TESTS) \
	  || { cat /tmp/queen-isolation-out/regression.diffs; $(MAKE) -s test-cluster-stop; exit 1; }
	@$(MAKE) -s test-cluster-stop
	@bash scripts/cluster.sh stop $(NOPRELOAD_DIR) $(NOPRELOAD_PORT); rm -rf $(NOPRELOAD_DIR) /tmp/queen-nopreload-out
	@bash scripts/cluster.sh start $(NOPRELOAD_DIR) $(NOPRELOAD_PORT) scripts/nopreload.conf
	$(REGRESS)/pg_regress --host=$(NOPRELOAD_DIR)/sock --port=$(NOPRELOAD_PORT) --user=postgres \
	  --inputdir=pg_test --outputdir=/tmp/queen-nopreload-out --dbname=queen_regress \
	  $(NOPRELOAD_TESTS) || { cat /tmp/queen-nopreload-out/regression.diffs; bash scripts/cluster.sh stop $(NOPRELOAD_DIR) $(NOPRELOAD_PORT); exit 1; }
	$(REGRESS)/../isolation/pg_isolation_regress --host=$(NOPRELOAD_DIR)/sock --port=$(NOPRELOAD_PORT) \
	  --user=postgres --inputdir=pg_test --outputdir=/tmp/queen-nopreload-out/isolation \
	  --dbname=queen_isolation $(NOPRELOAD_ISOLATION) \
	  || { cat /tmp/queen-nopreload-out/isolation/regression.diffs; bash scripts/cluster.sh stop $(NOPRELOAD_DIR) $(NOPRELOAD_PORT); exit 1; }
	@bash scripts/cluster.sh stop $(NOPRELOAD_DIR) $(NOPRELOAD_PORT)

integration:
	@# Two streams at once on two clusters (scripts/integration.sh says which tests go where).
	bash scripts/integration.sh $(TEST_DIR) $(TEST_PORT) $(TEST_B_DIR) $(TEST_B_PORT) \
	  $(POOLER_DIR) $(POOLER_PORT) $(EXPORTER_DIR) $(EXPORTER_PORT) $(TEST_CONF)

# The soak (not part of `make test`; `make integration` runs 60 seconds of it): two runs of
# the invariants harness at once on two databases for SOAK_SECONDS, with kill -9 and
# immediate stops all along, fail points, acks that roll back while retention, compaction
# and rotation run, half the clients through PgBouncer (tests/tests/soak.rs). Prints the
# figures: committed, delivered, lost, skipped, duplicated, faults injected, crashes.
SOAK_SECONDS ?= 600
soak: install-debug
	@$(MAKE) -s test-cluster-start
	@$(PSQL_TEST) -c "CREATE DATABASE queen_it" -c "\c queen_it" -c "CREATE EXTENSION queen"
	@bash scripts/pgbouncer.sh start $(POOLER_DIR) $(POOLER_PORT) $(TEST_DIR) $(TEST_PORT) 4
	QUEEN_TEST_DSN="$(TEST_DSN) dbname=queen_it" QUEEN_TEST_DIR=$(TEST_DIR) QUEEN_TEST_PORT=$(TEST_PORT) \
	QUEEN_TEST_POOLER_DSN="host=127.0.0.1 port=$(POOLER_PORT) user=postgres dbname=queen_it" \
	QUEEN_SOAK_SECONDS=$(SOAK_SECONDS) cargo test -p queen-it --test soak -- --nocapture \
	  || { bash scripts/pgbouncer.sh stop $(POOLER_DIR) $(POOLER_PORT); $(MAKE) -s test-cluster-stop; exit 1; }
	@bash scripts/pgbouncer.sh stop $(POOLER_DIR) $(POOLER_PORT)
	@$(MAKE) -s test-cluster-stop

# Release build, a dedicated cluster with scripts/bench.conf, every scenario against
# every baseline; prints the table and writes BENCHMARKS.md.
bench: install
	@bash scripts/cluster.sh stop $(BENCH_DIR) $(BENCH_PORT)
	@rm -rf $(BENCH_DIR)
	@bash scripts/cluster.sh start $(BENCH_DIR) $(BENCH_PORT) scripts/bench.conf
	@psql -X -q -h $(BENCH_DIR)/sock -p $(BENCH_PORT) -U postgres -c "CREATE DATABASE queen_bench"
	@bash scripts/pgbouncer.sh start $(POOLER_DIR) $(POOLER_PORT) $(BENCH_DIR) $(BENCH_PORT) 4
	cargo run --release -q -p queen-bench -- \
	  --dsn "host=$(BENCH_DIR)/sock port=$(BENCH_PORT) user=postgres dbname=queen_bench" \
	  --pooler-dsn "host=127.0.0.1 port=$(POOLER_PORT) user=postgres dbname=queen_bench" \
	  --out BENCHMARKS.md || { bash scripts/pgbouncer.sh stop $(POOLER_DIR) $(POOLER_PORT); \
	                           bash scripts/cluster.sh stop $(BENCH_DIR) $(BENCH_PORT); exit 1; }
	@bash scripts/pgbouncer.sh stop $(POOLER_DIR) $(POOLER_PORT)
	@bash scripts/cluster.sh stop $(BENCH_DIR) $(BENCH_PORT)

# The held-snapshot scenario (half an hour): its section of BENCHMARKS.md.
bench-held: install
	@bash scripts/cluster.sh stop $(BENCH_DIR) $(BENCH_PORT)
	@rm -rf $(BENCH_DIR)
	@bash scripts/cluster.sh start $(BENCH_DIR) $(BENCH_PORT) scripts/bench.conf
	@psql -X -q -h $(BENCH_DIR)/sock -p $(BENCH_PORT) -U postgres -c "CREATE DATABASE queen_bench"
	cargo run --release -q -p queen-bench -- \
	  --dsn "host=$(BENCH_DIR)/sock port=$(BENCH_PORT) user=postgres dbname=queen_bench" \
	  --only held --out BENCHMARKS.md || { bash scripts/cluster.sh stop $(BENCH_DIR) $(BENCH_PORT); exit 1; }
	@bash scripts/cluster.sh stop $(BENCH_DIR) $(BENCH_PORT)

# The client examples alone, against the test cluster (make integration runs them too).
clients:
	@$(MAKE) -s test-cluster-start
	@$(PSQL_TEST) -c "CREATE DATABASE queen_it" -c "\c queen_it" -c "CREATE EXTENSION queen"
	bash scripts/clients.sh "postgresql://postgres@127.0.0.1:$(TEST_PORT)/queen_it" \
	  || { $(MAKE) -s test-cluster-stop; exit 1; }
	@$(MAKE) -s test-cluster-stop

# A release package: dist/*.tar.gz (files rooted at /) and a .deb (README, "Packaging").
package: deps
	bash scripts/package.sh

clean:
	cargo clean
