#!/usr/bin/env bash
# A three-node Citus cluster on this machine (a coordinator and two workers: private
# ports and socket directories, the project's cluster script), with citus and queen
# preloaded on each node, and checks that both extensions work together on every node:
# the workers are registered and active, queen is installed on each node, and the
# README's SQL tour passes on the coordinator and on a worker.
#
# Then queen.distribute() routes queues to the workers (docs/citus.md), and the test checks
# through the coordinator: each call runs on its queue's home worker (EXPLAIN shows one
# task, the rows are there and nowhere else), single pushes, batches and pops, inside and
# outside BEGIN; a call that reaches a node that is not the queue's home is refused; calls
# by lease or partition id go to the node that issued the id; a transaction that pushes to
# queues on both workers commits on both (two-phase) or on neither; a long-poll on the
# coordinator is woken by a push through the coordinator; the invariants harness runs
# through the coordinator with a queue on each worker.
#
# Usage: citus_test.sh DIR BASE_PORT   (nodes on BASE_PORT, +1, +2; stopped at the end)
set -euo pipefail
dir=$1 base=$2
root=$(cd "$(dirname "$0")/.." && pwd)
REGRESS=/usr/lib/postgresql/15/lib/pgxs/src/test/regress
names=(coordinator worker1 worker2)
ports=("$base" "$((base + 1))" "$((base + 2))")
conf=$(mktemp)
cat > "$conf" <<CONF
shared_preload_libraries = 'citus,queen'
max_prepared_transactions = 50
queen.retention_interval = 1
CONF

stop_all() {
  for i in 0 1 2; do bash "$root/scripts/cluster.sh" stop "$dir/${names[$i]}" "${ports[$i]}" || true; done
}
# CITUS_KEEP=1 leaves the cluster running after the checks (for experiments by hand).
trap '[ -n "${CITUS_KEEP:-}" ] || stop_all; rm -f "$conf"' EXIT
stop_all
rm -rf "$dir"
for i in 0 1 2; do
  bash "$root/scripts/cluster.sh" start "$dir/${names[$i]}" "${ports[$i]}" "$conf"
done
psql_on() { # psql_on NODE_INDEX SQL...
  local i=$1; shift
  psql -X -q -At -v ON_ERROR_STOP=1 -h "$dir/${names[$i]}/sock" -p "${ports[$i]}" -U postgres -d queen_citus "$@"
}
for i in 0 1 2; do
  psql -X -q -v ON_ERROR_STOP=1 -h "$dir/${names[$i]}/sock" -p "${ports[$i]}" -U postgres \
    -c "CREATE DATABASE queen_citus"
  psql_on "$i" -c "CREATE EXTENSION citus"
done
psql_on 0 -c "SELECT citus_set_coordinator_host('127.0.0.1', ${ports[0]})" >/dev/null
psql_on 0 -c "SELECT citus_add_node('127.0.0.1', ${ports[1]})" -c "SELECT citus_add_node('127.0.0.1', ${ports[2]})" >/dev/null
workers=$(psql_on 0 -c "SELECT count(*) FROM citus_get_active_worker_nodes()")
if [ "$workers" != 2 ]; then
  echo "citus-test: expected 2 active workers, the coordinator sees $workers" >&2
  exit 1
fi
# queen on every node: created on the coordinator, which propagates CREATE EXTENSION to
# its workers (a worker refuses it directly); checked on each node below.
psql_on 0 -c "CREATE EXTENSION queen"
for i in 0 1 2; do
  versions=$(psql_on "$i" -c "SELECT string_agg(extname || ' ' || extversion, ', ' ORDER BY extname)
                               FROM pg_extension WHERE extname IN ('citus', 'queen')")
  echo "citus-test: ${names[$i]}: $versions"
  case "$versions" in
    "citus 13.2-1, queen "*) ;;
    *) echo "citus-test: ${names[$i]} lacks citus 13.2 or queen" >&2; exit 1 ;;
  esac
done
# The README's SQL tour (the pg_regress test `readme`) on the coordinator and on a worker.
python3 "$root/scripts/readme_sql.py" "$root/README.md" > "$dir/readme.sql"
mkdir -p "$dir/in/sql" "$dir/in/expected"
cp "$dir/readme.sql" "$dir/in/sql/readme.sql"
cp "$root/pg_test/expected/readme.out" "$dir/in/expected/readme.out"
for i in 0 1; do
  "$REGRESS/pg_regress" --host="$dir/${names[$i]}/sock" --port="${ports[$i]}" --user=postgres \
    --inputdir="$dir/in" --outputdir="$dir/out-${names[$i]}" --dbname=queen_citus_tour \
    --load-extension=citus readme \
    || { cat "$dir/out-${names[$i]}/regression.diffs"; exit 1; }
done

# ---- distributed ----
# A queue that exists before distribute() would be stranded where it is (routed calls go
# to its hash home): distribute() refuses, on the coordinator's queues and on the workers'.
for i in 0 1; do
  psql_on "$i" -c "SELECT count(*) FROM queen.push('early', '{\"n\": 1}')" >/dev/null
  if out=$(psql_on 0 -v VERBOSITY=verbose -c "SELECT queen.distribute()" 2>&1); then
    echo "citus-test: distribute() ran with queue 'early' on ${names[$i]}: $out" >&2; exit 1
  fi
  case "$out" in
    *"ERROR:  55000"*) ;;
    *) echo "citus-test: distribute() with a queue on ${names[$i]} failed otherwise: $out" >&2; exit 1 ;;
  esac
  psql_on "$i" -c "SELECT queen.delete_queue('early')" >/dev/null
done
# Its first run counts what exists, which needs READ COMMITTED.
if out=$(psql_on 0 -v VERBOSITY=verbose -c "BEGIN ISOLATION LEVEL REPEATABLE READ" -c "SELECT queen.distribute()" 2>&1); then
  echo "citus-test: distribute() ran under REPEATABLE READ: $out" >&2; exit 1
fi
case "$out" in *"ERROR:  0A000"*) ;; *) echo "citus-test: distribute() under REPEATABLE READ failed otherwise: $out" >&2; exit 1 ;; esac
echo "citus-test: distribute() refuses while a queue exists on the coordinator or a worker, and under REPEATABLE READ"
distributed=$(psql_on 0 -c "SELECT queen.distribute()")
echo "citus-test: distribute() = $distributed"
# 23 functions routed by queue (every one whose first argument is a queue, among them
# send, pause, resume, peek, get, purge and dlq_redrive, and the internal forms status,
# totals and dlq forward to), 8 by lease or partition id (ack in three forms,
# extend_lease, may_start, dlq_replay, dlq_delete, revoke_lease).
case "$distributed" in *'"functions": 31'*) ;; *) echo "citus-test: distribute() did not distribute 31 functions" >&2; exit 1 ;; esac
case "$distributed" in *'"workers": 2'*) ;; *) echo "citus-test: distribute() did not see 2 workers" >&2; exit 1 ;; esac
fail() { echo "citus-test: $*" >&2; exit 1; }
# The worker port that holds queue $1's shard.
home_port() {
  psql_on 0 -c "SELECT n.nodeport FROM pg_dist_placement pl JOIN pg_dist_node n USING (groupid)
                 WHERE pl.shardid = get_shard_id_for_distribution_column('queen_citus.queue_homes', '$1')"
}
# queue_on PREFIX NODE: the first of PREFIX0, PREFIX1, ... whose home is node NODE.
queue_on() {
  local k
  for k in $(seq 0 50); do
    if [ "$(home_port "$1$k")" = "${ports[$2]}" ]; then echo "$1$k"; return; fi
  done
  echo "citus-test: no queue name $1<k> lands on ${names[$2]}" >&2
  return 1
}
# Two queues, one on each worker.
qa=$(queue_on orders 1)
qb=$(queue_on orders 2)
echo "citus-test: $qa lives on worker1, $qb on worker2"
node_of() { case "$1" in "$qa") echo 1 ;; "$qb") echo 2 ;; esac; }
stored() { # stored NODE QUEUE: messages pushed to QUEUE stored on NODE
  psql_on "$1" -c "SELECT coalesce(sum(s.last_offset - s.first_offset + 1), 0)
                    FROM (SELECT partition_id, first_offset, last_offset FROM queen.segments
                          UNION ALL SELECT partition_id, first_offset, last_offset FROM queen.fresh_segments) s
                    JOIN queen.partitions p USING (partition_id) JOIN queen.queues q USING (queue_id)
                   WHERE q.name = '$2'"
}
# Every call that names the queue is one task on its home worker.
for q in "$qa" "$qb"; do
  plan=$(psql_on 0 -c "EXPLAIN (COSTS OFF) SELECT * FROM queen.pop('$q', 'g', batch => 10)")
  echo "$plan" | grep -q "Task Count: 1" || fail "pop($q) is not one task: $plan"
  echo "$plan" | grep -q "port=$(home_port "$q")" || fail "pop($q) does not go to its home: $plan"
  for call in "queen.push('$q', '1')" "queen.push_batch('$q', '[{\"payload\": 1}]')" "queen.configure('$q')" \
              "queen.pause('$q')" "queen.peek('$q')"; do
    plan=$(psql_on 0 -c "EXPLAIN (COSTS OFF) SELECT * FROM $call")
    echo "$plan" | grep -q "Task Count: 1" || fail "$call is not one task: $plan"
    echo "$plan" | grep -q "port=$(home_port "$q")" || fail "$call does not go to its home: $plan"
  done
done
# Pushes (single, batch with the queue named, inside BEGIN) and pops through the coordinator.
for q in "$qa" "$qb"; do
  psql_on 0 -c "SELECT queen.configure('$q', retention => 0)" >/dev/null
  for i in 1 2 3; do psql_on 0 -c "SELECT msg_offset FROM queen.push('$q', '{\"n\": $i}')" >/dev/null; done
  # (The items as a constant: an argument with a subquery is not delegated.)
  items=$(psql_on 0 -c "SELECT jsonb_agg(jsonb_build_object('payload', jsonb_build_object('n', i))) FROM generate_series(4, 100) i")
  psql_on 0 -c "SELECT msg_offset FROM queen.push_batch('$q', '$items')" >/dev/null
  psql_on 0 -c "BEGIN" -c "SELECT msg_offset FROM queen.push('$q', '{\"n\": 101}')" \
                      -c "SELECT msg_offset FROM queen.push('$q', '{\"n\": 102}')" -c "COMMIT" >/dev/null
  home=$(node_of "$q") other=$((3 - home))
  [ "$(stored "$home" "$q")" = 102 ] || fail "$q: $(stored "$home" "$q") messages on its home, not 102"
  [ "$(stored "$other" "$q")" = 0 ] || fail "$q: messages on the other worker"
  [ "$(stored 0 "$q")" = 0 ] || fail "$q: messages on the coordinator"
  got=$(psql_on 0 -c "SELECT payload->>'n' FROM queen.pop('$q', 'g', batch => 1000, auto_ack => true)" | paste -sd,)
  [ "$got" = "$(seq -s, 1 102)" ] || fail "$q: pop through the coordinator returned $got"
  # A pop inside BEGIN (delegated with force_delegation), then a push in the same
  # transaction: both on the home worker, committed together.
  got=$(psql_on 0 -c "BEGIN" -c "SELECT payload->>'n' FROM queen.pop('$q', 'g2', batch => 1, auto_ack => true)" \
                  -c "SELECT msg_offset FROM queen.push('$q', '{\"n\": 103}')" -c "COMMIT")
  [ "$got" = "$(printf '1\n103')" ] || fail "$q: pop and push in one transaction returned '$got'"
done
# A worker routes too (it has Citus's metadata): a push to qa sent to worker2 runs on worker1.
psql_on 2 -c "SELECT msg_offset FROM queen.push('$qa', '{\"n\": 104}')" >/dev/null
[ "$(stored 1 "$qa")" = 104 ] && [ "$(stored 2 "$qa")" = 0 ] || fail "a push sent to worker2 did not land on worker1"
# The guard: a call that Citus does not delegate (here: inside a CTE) runs on the node that
# received it; if that node is not the queue's home, queen refuses it.
undelegated="WITH x AS (SELECT * FROM queen.push('$qa', '1')) SELECT count(*) FROM x"
for node in 0 2; do
  out=$(psql_on "$node" -c "$undelegated" 2>&1) \
    && fail "an undelegated push on ${names[$node]} was accepted"
  echo "$out" | grep -q "lives on Citus node group" || fail "undelegated push on ${names[$node]}: $out"
done
[ "$(stored 1 "$qa")" = 104 ] && [ "$(stored 0 "$qa")" = 0 ] && [ "$(stored 2 "$qa")" = 0 ] \
  || fail "a refused push stored something"
# On the home worker itself the same shape runs (it is local there).
psql_on 1 -c "WITH x AS (SELECT * FROM queen.push('$qa', '{\"n\": 105}')) SELECT count(*) FROM x" >/dev/null
[ "$(stored 1 "$qa")" = 105 ] || fail "a push on the home worker was not stored"
# Calls by lease id and by partition id go to the node that issued the id: a pop through the
# coordinator leases on the home worker, which minted the lease id (and the partition id)
# to route back to it.
id_port() { # the worker port holding id_routes' shard for uuid $1
  psql_on 0 -c "SELECT n.nodeport FROM pg_dist_placement pl JOIN pg_dist_node n USING (groupid)
                 WHERE pl.shardid = get_shard_id_for_distribution_column('queen_citus.id_routes', '$1'::uuid)"
}
for q in "$qa" "$qb"; do
  home=$(node_of "$q") port=$(home_port "$q")
  # The partition is qa's or qb's default one; its messages 1..3 are leased.
  read -r lease pid <<< "$(psql_on 0 -F ' ' -c "SELECT lease_id, partition_id FROM queen.pop('$q', 'ids', batch => 3) LIMIT 1")"
  [ -n "$lease" ] || fail "$q: the pop through the coordinator leased nothing"
  [ "$(id_port "$lease")" = "$port" ] || fail "$q: lease $lease routes to port $(id_port "$lease"), not its home $port"
  [ "$(id_port "$pid")" = "$port" ] || fail "$q: partition $pid routes to port $(id_port "$pid"), not its home $port"
  for call in "queen.ack('$lease'::uuid)" "queen.ack('$lease'::uuid, '$pid'::uuid, 1)" "queen.ack('$lease'::uuid, '[]')" \
             "queen.extend_lease('$lease'::uuid, 30)" "queen.may_start('$lease'::uuid)" "queen.dlq_replay('$pid'::uuid, 'x')" \
             "queen.dlq_delete('$pid'::uuid, 'x')"; do
    plan=$(psql_on 0 -c "EXPLAIN (COSTS OFF) SELECT $call")
    echo "$plan" | grep -q "Task Count: 1" || fail "$call is not one task: $plan"
    echo "$plan" | grep -q "port=$port" || fail "$call does not go to its home: $plan"
  done
  # Through the coordinator (SELECT r ->> 'k' FROM queen.f(...) r is delegated; an
  # expression around the call, SELECT queen.f(...) ->> 'k', is not): extend_lease and
  # may_start; the three forms of ack: a dead letter by offset (which ends the lease), a
  # dead letter in a JSON list on the next lease, then a whole lease.
  [ "$(psql_on 0 -c "SELECT r ->> 'renewed' FROM queen.extend_lease('$lease'::uuid, 30) r")" = 1 ] || fail "$q: extend_lease renewed nothing"
  [ "$(psql_on 0 -c "SELECT queen.may_start('$lease'::uuid)")" = t ] || fail "$q: may_start is not true"
  ok=$(psql_on 0 -c "SELECT r -> 'items' -> 0 ->> 'success' FROM queen.ack('$lease'::uuid, '$pid'::uuid, 1, 'dlq', 'bad 1') r")
  [ "$ok" = true ] || fail "$q: ack of offset 1 through the coordinator: $ok"
  lease=$(psql_on 0 -c "SELECT lease_id FROM queen.pop('$q', 'ids', batch => 1)")
  ok=$(psql_on 0 -c "SELECT r -> 'items' -> 0 ->> 'success'
                       FROM queen.ack('$lease'::uuid, '[{\"partitionId\": \"$pid\", \"offset\": 2, \"status\": \"dlq\", \"error\": \"bad 2\"}]') r")
  [ "$ok" = true ] || fail "$q: ack of offset 2 through the coordinator: $ok"
  lease=$(psql_on 0 -c "SELECT lease_id FROM queen.pop('$q', 'ids', batch => 1)")
  ok=$(psql_on 0 -c "SELECT r -> 'lanes' -> 0 ->> 'committed' FROM queen.ack('$lease'::uuid) r")
  [ "$ok" = 3 ] || fail "$q: the whole-lease ack through the coordinator left the lane at $ok"
  [ "$(psql_on "$home" -c "SELECT count(*) FROM queen.dlq('$q')")" = 2 ] || fail "$q: no 2 dead letters on its home"
  tx1=$(psql_on "$home" -c "SELECT transaction_id FROM queen.dlq('$q') WHERE error_message = 'bad 1'")
  tx2=$(psql_on "$home" -c "SELECT transaction_id FROM queen.dlq('$q') WHERE error_message = 'bad 2'")
  id2=$(psql_on "$home" -c "SELECT id FROM queen.dlq('$q') WHERE error_message = 'bad 2'")
  before=$(stored "$home" "$q")
  [ "$(psql_on 0 -c "SELECT r ->> 'replayed' FROM queen.dlq_replay('$pid'::uuid, '$tx1') r")" = true ] || fail "$q: dlq_replay failed"
  # With the row's id (the optional third argument), routed by the partition id as well.
  [ "$(psql_on 0 -c "SELECT r ->> 'id' FROM queen.dlq_delete('$pid'::uuid, '$tx2', '$id2'::uuid) r")" = "$id2" ] \
    || fail "$q: dlq_delete by id failed"
  [ "$(stored "$home" "$q")" = "$((before + 1))" ] || fail "$q: the replayed message is not on its home"
  [ "$(psql_on "$home" -c "SELECT count(*) FROM queen.dlq('$q')")" = 0 ] || fail "$q: dead letters left on its home"
  # The guard: an undelegated call (inside a CTE) by id on a node that did not issue it.
  lease=$(psql_on 0 -c "SELECT lease_id FROM queen.pop('$q', 'ids2', batch => 1)")
  for node in 0 $((3 - home)); do
    out=$(psql_on "$node" -c "WITH x AS (SELECT queen.ack('$lease'::uuid) AS a) SELECT a FROM x" 2>&1) \
      && fail "an undelegated ack on ${names[$node]} was accepted"
    echo "$out" | grep -q "was issued by another Citus node" || fail "undelegated ack on ${names[$node]}: $out"
  done
  ok=$(psql_on "$home" -c "WITH x AS (SELECT queen.ack('$lease'::uuid) AS a) SELECT a -> 'lanes' -> 0 ->> 'committed' FROM x")
  [ "$ok" = 1 ] || fail "$q: the same ack on the home worker committed $ok"
done
echo "citus-test: leases and partitions route to their home: ack, extend_lease, may_start, dlq_replay, dlq_delete"
# The monitoring calls that name a queue (status, totals, dlq: not distributed themselves,
# their queue has a default) forward the call to the queue's home: the coordinator answers
# what the home answers. (A dead letter first, so that dlq has a row to show.)
read -r lease pid off <<< "$(psql_on 0 -F ' ' -c "SELECT lease_id, partition_id, msg_offset FROM queen.pop('$qa', 'mon', batch => 1)")"
psql_on 0 -c "SELECT r FROM queen.ack('$lease'::uuid, '$pid'::uuid, $off, 'dlq', 'monitored') r" >/dev/null
for call in "SELECT queue, partition, consumer_group, committed, lag FROM queen.status('$qa') ORDER BY 1, 2, 3" \
            "SELECT queue, consumer_group, partitions, messages, committed, lag FROM queen.totals('$qa')" \
            "SELECT transaction_id, error_message FROM queen.dlq('$qa', page_size => 50) ORDER BY 1"; do
  here=$(psql_on 0 -c "$call" 2>&1) || fail "$call on the coordinator: $here"
  home=$(psql_on 1 -c "$call")
  [ -n "$home" ] && [ "$here" = "$home" ] || fail "$call: the coordinator answered '$here', the home '$home'"
done
[ "$(psql_on 0 -c "SELECT count(*) FROM queen.status()")" = 0 ] || fail "status() on the coordinator lists queues"
# One transaction, both workers: all or nothing. Citus commits it with two-phase commit
# (PREPARE TRANSACTION on each worker, then COMMIT PREPARED); queen hands a push's offsets to
# the prepared transaction. Two shapes, each rolled back, then committed: one push_batch(items)
# whose items name a queue on each worker (split by queue on the coordinator), and a
# push_batch(queue, items) per queue inside BEGIN ... COMMIT.
two_worker_tx() { # two_worker_tx one|two COMMIT|ROLLBACK N: pushes {"n": N} and {"n": N+1} to each queue
  local n=$3 m=$(($3 + 1))
  if [ "$1" = one ]; then
    psql_on 0 -c "BEGIN" -c "SELECT idx, status, partition_id, msg_offset FROM queen.push_batch('[{\"queue\": \"$qa\", \"payload\": {\"n\": $n}},
                                 {\"queue\": \"$qb\", \"payload\": {\"n\": $n}}, {\"queue\": \"$qa\", \"payload\": {\"n\": $m}},
                                 {\"queue\": \"$qb\", \"payload\": {\"n\": $m}}]')" -c "$2" 2>&1
  else
    psql_on 0 -c "BEGIN" -c "SELECT count(*) FROM queen.push_batch('$qa', '[{\"payload\": {\"n\": $n}}, {\"payload\": {\"n\": $m}}]')" \
              -c "SELECT count(*) FROM queen.push_batch('$qb', '[{\"payload\": {\"n\": $n}}, {\"payload\": {\"n\": $m}}]')" \
              -c "$2" 2>&1
  fi
}
n=900
for shape in one two; do
  before_a=$(stored 1 "$qa") before_b=$(stored 2 "$qb")
  out=$(two_worker_tx "$shape" ROLLBACK "$n") || fail "a rolled-back two-worker transaction ($shape) failed: $out"
  [ "$(stored 1 "$qa")" = "$before_a" ] && [ "$(stored 2 "$qb")" = "$before_b" ] || fail "a rolled-back push ($shape) was stored"
  out=$(two_worker_tx "$shape" COMMIT "$n") || fail "a two-worker transaction ($shape) failed to commit: $out"
  if [ "$shape" = one ]; then
    # One result row per item, in input order: items 0 and 2 (qa) in one partition at
    # consecutive offsets, items 1 and 3 (qb) in another; each at the offset it was stored at
    # on its home (checked below: the pop returns n, then n + 1).
    rows=$(echo "$out" | grep '|queued|')
    idx=$(echo "$rows" | cut -d'|' -f1 | paste -sd,)
    p0=$(echo "$rows" | sed -n 1p | cut -d'|' -f3) p1=$(echo "$rows" | sed -n 2p | cut -d'|' -f3)
    p2=$(echo "$rows" | sed -n 3p | cut -d'|' -f3) p3=$(echo "$rows" | sed -n 4p | cut -d'|' -f3)
    o0=$(echo "$rows" | sed -n 1p | cut -d'|' -f4) o1=$(echo "$rows" | sed -n 2p | cut -d'|' -f4)
    o2=$(echo "$rows" | sed -n 3p | cut -d'|' -f4) o3=$(echo "$rows" | sed -n 4p | cut -d'|' -f4)
    [ "$idx" = "0,1,2,3" ] && [ "$p0" = "$p2" ] && [ "$p1" = "$p3" ] && [ "$p0" != "$p1" ] \
      && [ "$o2" = "$((o0 + 1))" ] && [ "$o3" = "$((o1 + 1))" ] \
      || fail "push_batch(items) across both workers returned: $out"
    qa_pid=$(psql_on 1 -c "SELECT p.partition_id FROM queen.partitions p JOIN queen.queues q USING (queue_id)
                            WHERE q.name = '$qa' AND p.name = 'Default'")
    [ "$p0" = "$qa_pid" ] || fail "push_batch(items): item 0 reported partition $p0, $qa's is $qa_pid"
  fi
  a=$(stored 1 "$qa") b=$(stored 2 "$qb")
  [ "$a" = "$((before_a + 2))" ] && [ "$b" = "$((before_b + 2))" ] \
    || fail "a committed two-worker transaction ($shape) stored $qa $before_a -> $a, $qb $before_b -> $b ($out)"
  [ "$(stored 0 "$qa")" = 0 ] && [ "$(stored 0 "$qb")" = 0 ] || fail "a two-worker transaction ($shape) stored on the coordinator"
  [ "$(psql_on 1 -c "SELECT count(*) FROM pg_prepared_xacts")" = 0 ] && [ "$(psql_on 2 -c "SELECT count(*) FROM pg_prepared_xacts")" = 0 ] \
    || fail "prepared transactions left on a worker"
  # Both are delivered, after the messages before them.
  for q in "$qa" "$qb"; do
    got=$(psql_on 0 -c "SELECT payload->>'n' FROM queen.pop('$q', 'tx', batch => 1000, auto_ack => true)" | tail -2 | paste -sd,)
    [ "$got" = "$n,$((n + 1))" ] || fail "$q: the two-worker transaction's ($shape) messages came out as '$got'"
  done
  n=$((n + 10))
done
echo "citus-test: a transaction pushing to both workers (one push_batch(items), or push_batch(queue, items) per queue): rolled back, nothing stored; committed (two-phase), both stored and delivered"
# Outside BEGIN, with citus.function_opens_transaction_block off, push_batch(items) across
# both workers is still all or nothing: the part pushed first is not kept when the second
# part fails (53400: its queue is full).
x=$(queue_on atom 1) y=$(queue_on atom 2)
# (The split pushes its parts in byte order of the queue names: compare them so.)
if LC_ALL=C bash -c '[[ "$1" < "$2" ]]' _ "$x" "$y"; then first=$x second=$y fnode=1; else first=$y second=$x fnode=2; fi
psql_on 0 -c "SELECT queen.configure('$second', max_depth => 1)" >/dev/null
psql_on 0 -c "SELECT count(*) FROM queen.push('$second', '1')" >/dev/null
if out=$(psql_on 0 -v VERBOSITY=verbose -c "SET citus.function_opens_transaction_block = off" \
           -c "SELECT count(*) FROM queen.push_batch('[{\"queue\": \"$first\", \"payload\": 1}, {\"queue\": \"$second\", \"payload\": 2}]')" 2>&1); then
  fail "push_batch(items) into a full queue succeeded: $out"
fi
case "$out" in *"ERROR:  53400"*) ;; *) fail "push_batch(items) into a full queue failed otherwise: $out" ;; esac
[ "$(stored "$fnode" "$first")" = 0 ] \
  || fail "a failed push_batch(items) with citus.function_opens_transaction_block off kept its part on $first"
echo "citus-test: push_batch(items) across both workers is all or nothing with citus.function_opens_transaction_block off too"
# The invariants harness through the coordinator, with a fresh queue on each worker
# (tests/tests/citus_harness.rs): pushes, rollbacks, pops in two groups, every ack outcome.
ha=$(queue_on harness 1)
hb=$(queue_on harness 2)
dsn_of() { echo "host=$dir/${names[$1]}/sock port=${ports[$1]} user=postgres dbname=queen_citus"; }
(cd "$root/tests" && QUEEN_TEST_DSN="$(dsn_of 0)" QUEEN_CITUS_QUEUE_A="$ha" QUEEN_CITUS_QUEUE_B="$hb" \
   QUEEN_CITUS_HOME_A_DSN="$(dsn_of 1)" QUEEN_CITUS_HOME_B_DSN="$(dsn_of 2)" \
   cargo test -q -p queen-it --test citus_harness -- --ignored --nocapture > "$dir/harness.log" 2>&1) \
  || { tail -40 "$dir/harness.log"; fail "the invariants harness failed through the coordinator"; }
for q in "$ha" "$hb"; do
  [ "$(stored 0 "$q")" = 0 ] || fail "harness queue $q has messages on the coordinator"
done
[ "$(stored 2 "$ha")" = 0 ] && [ "$(stored 1 "$hb")" = 0 ] || fail "a harness queue has messages on the other worker"
echo "citus-test: invariants harness through the coordinator passed ($ha on worker1, $hb on worker2; $(grep -c 'pushed:' "$dir/harness.log") runs)"
# Concurrent two-worker transactions (two-phase commit) while consumers pop both queues
# through the coordinator: every transaction pushes one number to a queue on each worker;
# each queue must deliver every committed number once. A pop that passed a prepared
# transaction's offset before it committed would lose that message.
xa=$(queue_on cross 1)
xb=$(queue_on cross 2)
cat > "$dir/cross.sql" <<SQL
\set n :client_id * 100000000 + random(1, 99999999)
SELECT count(*) FROM queen.push_batch('[{"queue": "$xa", "payload": :n}, {"queue": "$xb", "payload": :n}]');
SQL
consume() { # consume QUEUE FILE: pops with auto-ack until told to stop and the queue is dry
  local dry=0
  while :; do
    got=$(psql_on 0 -c "SELECT payload FROM queen.pop('$1', 'cx', batch => 100, auto_ack => true)")
    if [ -n "$got" ]; then echo "$got" >> "$2"; dry=0; continue; fi
    if [ -f "$dir/cross.done" ]; then dry=$((dry + 1)); [ "$dry" -ge 3 ] && break; fi
    sleep 0.05
  done
}
rm -f "$dir/cross.done" "$dir/cross-a" "$dir/cross-b"; touch "$dir/cross-a" "$dir/cross-b"
consume "$xa" "$dir/cross-a" & ca=$!
consume "$xb" "$dir/cross-b" & cb=$!
pgbench -n -M simple -h "$dir/coordinator/sock" -p "${ports[0]}" -U postgres -c 4 -j 2 -T 5 -f "$dir/cross.sql" queen_citus \
  > "$dir/cross.out" 2>&1 || { cat "$dir/cross.out"; fail "the two-worker pgbench run failed"; }
touch "$dir/cross.done"
wait "$ca" "$cb"
txs=$(awk '/number of transactions actually processed/ {print $NF}' "$dir/cross.out" | cut -d/ -f1)
grep -q "number of failed transactions: 0 " "$dir/cross.out" || fail "two-worker transactions failed: $(cat "$dir/cross.out")"
for f in cross-a cross-b; do
  n=$(wc -l < "$dir/$f") u=$(sort -u "$dir/$f" | wc -l)
  [ "$n" = "$txs" ] && [ "$u" = "$txs" ] || fail "$f: $n deliveries ($u distinct) for $txs committed two-worker transactions"
done
cmp -s <(sort "$dir/cross-a") <(sort "$dir/cross-b") || fail "the two queues delivered different numbers"
echo "citus-test: $txs concurrent two-worker transactions while popping: every message delivered once on both workers"
# Each worker's background worker maintains the queues that live there: a queue on each
# worker with retention => 1 (s), pushes and an auto-acking pop through the coordinator; the
# home's worker deletes the consumed segments (the coordinator's has nothing to do).
for w in 1 2; do
  rq=$(queue_on kept "$w")
  psql_on 0 -c "SELECT queen.configure('$rq', retention => 1)" >/dev/null
  for i in 1 2 3; do psql_on 0 -c "SELECT msg_offset FROM queen.push('$rq', '{\"n\": $i}')" >/dev/null; done
  # (Nothing is deleted before the group has consumed it.)
  [ "$(stored "$w" "$rq")" = 3 ] || fail "$rq: not stored on its home"
  # (The pop creates group r: one that meets the worker's retention step holding the
  # queue's lane-creation lock returns nothing that time, as documented; pop again.)
  got=0
  for _ in $(seq 1 50); do
    got=$((got + $(psql_on 0 -c "SELECT count(*) FROM queen.pop('$rq', 'r', batch => 10, auto_ack => true)")))
    [ "$got" -ge 3 ] && break
    sleep 0.1
  done
  [ "$got" = 3 ] || fail "$rq: the pops returned $got messages, not its 3"
  for _ in $(seq 1 100); do [ "$(stored "$w" "$rq")" = 0 ] && break; sleep 0.2; done
  [ "$(stored "$w" "$rq")" = 0 ] || fail "$rq: retention on ${names[$w]} did not delete its consumed segments in 20 s"
done
echo "citus-test: each worker's background worker applies retention to its own queues"
# A long-poll through the coordinator, woken by a push through the coordinator.
psql_on 0 -c "SELECT msg_offset FROM queen.pop('$qb', 'w', batch => 1000, auto_ack => true)" >/dev/null
start=$(date +%s%N)
psql_on 0 -c "SELECT payload->>'n' FROM queen.pop('$qb', 'w', wait_ms => 10000, auto_ack => true)" > "$dir/woken" &
waiter=$!
sleep 1
psql_on 0 -c "SELECT msg_offset FROM queen.push('$qb', '{\"n\": 777}')" >/dev/null
wait "$waiter"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$(cat "$dir/woken")" = 777 ] || fail "the long-poll returned '$(cat "$dir/woken")'"
[ "$ms" -lt 5000 ] || fail "the long-poll took $ms ms: not woken by the push"
echo "citus-test: long-poll through the coordinator woken after $ms ms"
# Run again once queues live on their workers, distribute() is a no-op that succeeds.
again=$(psql_on 0 -c "SELECT queen.distribute()")
case "$again" in *'"functions": 31'*) ;; *) fail "distribute() run again: $again" ;; esac
echo "citus-test: distribute() runs again with queues on their workers"
echo "citus-test: passed (coordinator and two workers, citus and queen on each, queues routed to their workers)"
