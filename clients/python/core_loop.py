"""queen's core loop from Python with psycopg 3: push, pop with a wait, ack, and the
dead-letter queue, with a W3C traceparent header carried from producer to consumer. Run by `make clients` against a real cluster (QUEEN_DSN); any
difference from what queen promises is an AssertionError."""
import os
import uuid

import psycopg
from psycopg.types.json import Jsonb

queue = f"py-orders-{uuid.uuid4().hex[:8]}"

# The producer's trace context (W3C Trace Context): version-trace id-parent id-flags.
traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
trace = {"traceparent": traceparent}

with psycopg.connect(os.environ["QUEEN_DSN"], autocommit=True) as conn:
    # Push: one message with the trace context in its headers, then a batch.
    conn.execute("SELECT * FROM queen.push(%s, %s, headers => %s)", (queue, Jsonb({"id": 1}), Jsonb(trace)))
    conn.execute(
        "SELECT * FROM queen.push_batch(%s)",
        (Jsonb([{"queue": queue, "payload": {"id": 2}},
                {"queue": queue, "payload": {"id": 3}, "headers": trace}]),),
    )

    # Pop: wait up to 2 s for up to 10 messages, under one lease. The consumer continues
    # the producer's trace from the headers.
    rows = conn.execute(
        "SELECT lease_id, partition_id, msg_offset, payload, headers"
        "  FROM queen.pop(%s, batch => 10, wait_ms => 2000)",
        (queue,),
    ).fetchall()
    assert [r[3] for r in rows] == [{"id": 1}, {"id": 2}, {"id": 3}], rows
    assert [r[4] for r in rows] == [trace, None, trace], rows

    # Ack: 1 and 2 completed; 3 goes to the dead-letter queue.
    lease, partition = rows[0][0], rows[0][1]
    result = conn.execute(
        "SELECT queen.ack(%s, %s)",
        (lease, Jsonb([
            {"partitionId": str(partition), "offset": 2, "status": "completed"},
            {"partitionId": str(partition), "offset": 3, "status": "dlq", "error": "bad order"},
        ])),
    ).fetchone()[0]
    assert result["lanes"][0]["committed"] == 3 and result["items"][1]["dlq"], result

    # The dead-letter queue: list, then replay one row by its address and id (pushes the payload again).
    dead = conn.execute(
        "SELECT partition_id, transaction_id, data, error_message, headers, id FROM queen.dlq(%s)", (queue,)
    ).fetchall()
    assert [(d[2], d[3], d[4]) for d in dead] == [({"id": 3}, "bad order", trace)], dead
    conn.execute("SELECT queen.dlq_replay(%s, %s, %s)", (dead[0][0], dead[0][1], dead[0][5]))
    again = conn.execute("SELECT payload, headers FROM queen.pop(%s, auto_ack => true)", (queue,)).fetchall()
    assert again == [({"id": 3}, trace)], again

print("python (psycopg 3): ok")
