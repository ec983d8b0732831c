"""queen for Python: a producer and a consumer loop for queen, the message queue inside
PostgreSQL (psycopg 3; sync and asyncio).

    from queen import Consumer, Producer

    Producer(dsn).push("orders", {"id": 1})
    Consumer(dsn, "orders", "billing", handler=lambda m: print(m.payload)).run()
"""
from ._common import (QUEUE_MODE, Decision, ErrorPolicy, Message, Poison, PushResult, RetryLater,
                      backoff_policy, default_error_policy)
from .consumer import Consumer, Event
from .errors import (CapacityExceeded, DataCorrupted, DeadLetterNotFound, InvalidArgument, KeyFileError,
                     NotReady, NotSupported, NullArgument, ObjectInUse, PermissionDenied, QueenError,
                     SerializationFailure, SizeLimitExceeded, UndefinedObject)
from .producer import Producer

__version__ = "0.4.0"

__all__ = [
    "Consumer", "Producer", "Event", "Message", "PushResult", "Decision", "ErrorPolicy", "RetryLater", "Poison",
    "default_error_policy", "backoff_policy", "QUEUE_MODE", "QueenError", "NullArgument", "InvalidArgument",
    "SizeLimitExceeded", "DeadLetterNotFound", "UndefinedObject", "ObjectInUse", "PermissionDenied", "NotReady",
    "NotSupported", "CapacityExceeded", "KeyFileError", "SerializationFailure", "DataCorrupted",
]
