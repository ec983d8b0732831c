import datetime as dt

import psycopg
import pytest

import queen
from conftest import pop_all


def test_push_and_batch(dsn, conn, queue):
    with queen.Producer(dsn) as p:
        r = p.push(queue, {"n": 1}, partition="a", transaction_id="t-1", headers={"k": "v"})
        assert (r.status, r.offset, r.transaction_id) == ("queued", 1, "t-1")
        rows = p.push_batch([{"payload": {"n": 2}, "partition": "a"}, {"payload": {"n": 3}, "partition": "b"}],
                            queue=queue)
        assert [(x.idx, x.offset) for x in rows] == [(0, 2), (1, 1)]
        again = p.push(queue, {"n": 1}, partition="a", transaction_id="t-1")
        assert again.status == "duplicate" and again.message_id == r.message_id
    assert sorted(pop_all(conn, queue)) == [("a", 1, {"n": 1}), ("a", 2, {"n": 2}), ("b", 1, {"n": 3})]


def test_outbox_on_the_callers_transaction(dsn, conn, queue):
    conn.execute("CREATE TABLE IF NOT EXISTS py_orders (id int)")
    with psycopg.connect(dsn) as mine:
        with pytest.raises(RuntimeError):
            with mine.transaction():
                mine.execute("INSERT INTO py_orders VALUES (1)")
                queen.Producer(mine).push(queue, {"order": 1})
                raise RuntimeError("the application fails: both roll back")
        assert pop_all(conn, queue) == []
        with mine.transaction():
            mine.execute("INSERT INTO py_orders VALUES (2)")
            queen.Producer(mine).push(queue, {"order": 2})
            # Not visible before the caller commits.
            assert pop_all(conn, queue) == []
    assert pop_all(conn, queue) == [("Default", 1, {"order": 2})]


def test_deliver_at_in_a_batch(dsn, conn, queue):
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    with queen.Producer(dsn) as p:
        p.push_batch([{"payload": 1, "deliverAt": later}, {"payload": 2, "partition": "now"}], queue=queue)
    assert pop_all(conn, queue) == [("now", 1, 2)]


def test_typed_errors(dsn, conn, queue):
    with queen.Producer(dsn) as p:
        with pytest.raises(queen.InvalidArgument) as e:
            p.push("bad name!", {})
        assert e.value.sqlstate == "22023" and isinstance(e.value.__cause__, psycopg.Error)
        conn.execute("SELECT queen.configure(%s, max_depth => 1)", (queue,))
        p.push(queue, 1)
        with pytest.raises(queen.CapacityExceeded):
            p.push(queue, 2)
        with pytest.raises(queen.NullArgument):
            p.push(None, 1)
    conn.execute("SELECT queen.configure(%s, create_groups => false)", (queue,))
    c = queen.Consumer(dsn, queue, "nobody", handler=print, wait_ms=0)
    with pytest.raises(queen.UndefinedObject):
        c.run_once()
    # Every class maps back to its SQLSTATE.
    for state, cls in queen.errors.BY_SQLSTATE.items():
        assert cls.sqlstate == state and issubclass(cls, queen.QueenError)
