"""The asyncio API: the same loop, on AsyncConnection."""
import asyncio

import psycopg
import pytest

import queen
from conftest import pop_all
from queen.aio import AsyncConsumer, AsyncProducer


async def _until(consumer, done, timeout=30):
    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    for _ in range(int(timeout / 0.05)):
        if done():
            break
        await asyncio.sleep(0.05)
    consumer.stop()
    await asyncio.wait_for(task, 30)
    assert done()


def test_async_producer_and_consumer(any_dsn, conn, queue):
    async def main():
        async with await AsyncProducer.connect(any_dsn) as p:
            await p.push(queue, "a", partition="x")
            await p.push_batch([{"payload": i, "partition": f"p{i % 2}"} for i in range(20)], queue=queue)
        seen, failed = [], []

        async def handle(m):
            await asyncio.sleep(0)
            if m.payload == 5 and not failed:
                failed.append(m.offset)
                raise ValueError("once")
            seen.append((m.partition, m.offset, m.attempt))

        c = AsyncConsumer(any_dsn, queue, "g", handler=handle, batch=5, concurrency=3, wait_ms=200)
        await _until(c, lambda: len(seen) == 21)
        return seen

    seen = asyncio.run(main())
    # Each message completed once, in order per partition; payload 5 (p1, offset 3) failed
    # once and came back.
    for p in ("p0", "p1", "x"):
        offsets = [o for (q, o, _) in seen if q == p]
        assert offsets == sorted(set(offsets)) and len(offsets) == {"x": 1}.get(p, 10)
    assert [(q, o) for (q, o, _) in seen].count(("p1", 3)) == 1
    assert pop_all(conn, queue, "g") == []


def test_async_outbox_rolls_back_with_the_caller(dsn, conn, queue):
    async def main():
        async with await psycopg.AsyncConnection.connect(dsn) as mine:
            with pytest.raises(RuntimeError):
                async with mine.transaction():
                    await AsyncProducer(mine).push(queue, 1)
                    raise RuntimeError
            async with mine.transaction():
                await AsyncProducer(mine).push(queue, 2)
    asyncio.run(main())
    assert pop_all(conn, queue) == [("Default", 1, 2)]


def test_async_stop_releases_what_did_not_start(dsn, conn, queue):
    async def main():
        async with await AsyncProducer.connect(dsn) as p:
            await p.push_batch([{"payload": i} for i in range(4)], queue=queue)
        started = asyncio.Event()
        c = None

        async def handle(m):
            started.set()
            c.stop()  # a stop while the first handler runs
            await asyncio.sleep(0.5)

        c = AsyncConsumer(dsn, queue, "g", handler=handle, batch=4, lease_seconds=600, wait_ms=200)
        await asyncio.wait_for(c.run(install_signal_handlers=False), 30)
        assert started.is_set()
    asyncio.run(main())
    # The first completed; the other three were released, not left under the lease.
    assert [r[1] for r in pop_all(conn, queue, "g")] == [2, 3, 4]


def test_async_may_start(dsn, conn, queue):
    async def main():
        async with await AsyncProducer.connect(dsn) as p:
            await p.push(queue, 1)
        events = []

        async def never(m):
            raise AssertionError("may not start")
        c = AsyncConsumer(dsn, queue, "g", handler=never, lease_seconds=1, handler_timeout=10,
                          wait_ms=1000, on_event=events.append)
        assert await c.run_once() == 1
        return events
    events = asyncio.run(main())
    assert [e.kind for e in events] == ["may_not_start"] and events[0].warning.startswith("SQL0105")
    assert [r[1] for r in pop_all(conn, queue, "g")] == [1]
