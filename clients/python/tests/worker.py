"""A consumer in a process of its own, for the stop and crash tests.

worker.py DSN QUEUE GROUP LOG LEASE_SECONDS SLEEP_SECONDS: runs a Consumer whose handler
writes "start <offset>" to LOG, sleeps, then writes "done <offset>"."""
import sys
import time

import queen

dsn, queue, group, log, lease, sleep = sys.argv[1:7]


def handle(m):
    with open(log, "a") as f:
        f.write(f"start {m.offset}\n")
    time.sleep(float(sleep))
    with open(log, "a") as f:
        f.write(f"done {m.offset}\n")


queen.Consumer(dsn, queue, group, handler=handle, batch=10, wait_ms=1000, lease_seconds=int(lease)).run()
print("stopped", flush=True)
