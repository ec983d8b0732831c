"""queen from an ORM's raw query: SQLAlchemy `text()` with bound parameters, inside the
ORM's own transaction (the pop, the work and the ack commit together). Run by
`make clients` against a real cluster (QUEEN_DSN)."""
import json
import os
import uuid

from sqlalchemy import create_engine, text

queue = f"sa-orders-{uuid.uuid4().hex[:8]}"
# QUEEN_DSN is a postgresql:// URL; SQLAlchemy names its driver in the scheme.
engine = create_engine(os.environ["QUEEN_DSN"].replace("postgresql://", "postgresql+psycopg://", 1))

with engine.begin() as db:
    db.execute(text("SELECT * FROM queen.push(:q, CAST(:p AS jsonb))"), {"q": queue, "p": json.dumps({"id": 7})})

with engine.begin() as db:
    msg = db.execute(
        text("SELECT lease_id, payload FROM queen.pop(:q, wait_ms => 2000)"), {"q": queue}
    ).one()
    assert msg.payload == {"id": 7}, msg
    # ... the application's own writes go here, in the same transaction ...
    acked = db.execute(text("SELECT queen.ack(:lease)"), {"lease": msg.lease_id}).scalar_one()
    assert acked["lanes"][0]["committed"] == 1, acked

with engine.connect() as db:
    left = db.execute(text("SELECT count(*) FROM queen.pop(:q)"), {"q": queue}).scalar_one()
    assert left == 0, left

print("python (SQLAlchemy text()): ok")
