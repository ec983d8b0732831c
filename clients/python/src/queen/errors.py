"""Typed exceptions for queen's SQLSTATEs (docs/errors.md).

Every error queen raises is a PostgreSQL ERROR with a SQLSTATE; the library turns the
psycopg error into the class below that matches it, keeping the original as
``__cause__`` and its fields on the exception. Catch by class, never by message text.
"""
from __future__ import annotations

from typing import Dict, NoReturn, Optional, Type

import psycopg


class QueenError(Exception):
    """An error queen (or PostgreSQL under it) raised. ``sqlstate`` is the five-character
    code, ``detail`` and ``hint`` the server's, when it sent them."""

    sqlstate: Optional[str] = None

    def __init__(self, message: str, sqlstate: Optional[str] = None,
                 detail: Optional[str] = None, hint: Optional[str] = None):
        super().__init__(message)
        if sqlstate is not None:
            self.sqlstate = sqlstate
        self.detail = detail
        self.hint = hint


class NullArgument(QueenError):
    """22004: a required argument is NULL."""
    sqlstate = "22004"


class InvalidArgument(QueenError):
    """22023: an argument has a value it cannot take (a bad name, a batch out of range...)."""
    sqlstate = "22023"


class SizeLimitExceeded(QueenError):
    """54000: a payload, headers or batch past a size limit."""
    sqlstate = "54000"


class DeadLetterNotFound(QueenError):
    """P0002: no dead letter at this address (already replayed or deleted?)."""
    sqlstate = "P0002"


class UndefinedObject(QueenError):
    """42704: the queue, consumer group or lane does not exist."""
    sqlstate = "42704"


class ObjectInUse(QueenError):
    """55006: a lane is under a live lease, or a partition is busy."""
    sqlstate = "55006"


class PermissionDenied(QueenError):
    """42501: the role may not do this on this queue."""
    sqlstate = "42501"


class NotReady(QueenError):
    """55000: the object is not in the state the call needs (no encryption key, an
    extension not updated, a call that reached the wrong Citus node)."""
    sqlstate = "55000"


class NotSupported(QueenError):
    """0A000: e.g. a long-poll under REPEATABLE READ."""
    sqlstate = "0A000"


class CapacityExceeded(QueenError):
    """53400: backpressure. The queue is full (``max_depth``, a holding group's
    ``max_lag``), or one of the preloaded library's shared-memory tables is. Retry later."""
    sqlstate = "53400"


class KeyFileError(QueenError):
    """F0000: the encryption key file is missing or unusable."""
    sqlstate = "F0000"


class SerializationFailure(QueenError):
    """40001: retry the transaction."""
    sqlstate = "40001"


class DataCorrupted(QueenError):
    """XX001: a stored segment failed its checks."""
    sqlstate = "XX001"


BY_SQLSTATE: Dict[str, Type[QueenError]] = {
    c.sqlstate: c  # type: ignore[misc]
    for c in (NullArgument, InvalidArgument, SizeLimitExceeded, DeadLetterNotFound, UndefinedObject,
              ObjectInUse, PermissionDenied, NotReady, NotSupported, CapacityExceeded, KeyFileError,
              SerializationFailure, DataCorrupted)
}


def from_psycopg(e: psycopg.Error) -> QueenError:
    """The typed exception for a psycopg error (QueenError for a code without a class)."""
    diag = getattr(e, "diag", None)
    sqlstate = getattr(e, "sqlstate", None) or (diag.sqlstate if diag else None)
    cls = BY_SQLSTATE.get(sqlstate or "", QueenError)
    message = (diag.message_primary if diag and diag.message_primary else str(e)).strip()
    return cls(message, sqlstate, diag.message_detail if diag else None, diag.message_hint if diag else None)


def transient(e: BaseException) -> bool:
    """A lost connection or a server going down (SQLSTATE class 08, class 57 but for
    57014, or no SQLSTATE at all): a consumer reconnects and goes on."""
    if isinstance(e, QueenError):
        state = e.sqlstate or ""
    elif isinstance(e, psycopg.Error):
        state = getattr(e, "sqlstate", None)
        if state is None:
            return True  # no SQLSTATE: the socket, not the server
    else:
        return False
    # 57014 is a cancelled statement (a timeout, a cancel request), not a lost server.
    return state[:2] == "08" or (state[:2] == "57" and state != "57014")


def raise_typed(e: psycopg.Error) -> "NoReturn":
    """Raises the typed exception for a server error, or ``e`` itself when it is
    ``transient``."""
    if transient(e):
        raise e
    raise from_psycopg(e) from e
