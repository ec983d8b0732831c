"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.BY_SQLSTATE = exports.DataCorrupted = exports.SerializationFailure = exports.KeyFileError = exports.CapacityExceeded = exports.NotSupported = exports.NotReady = exports.PermissionDenied = exports.ObjectInUse = exports.UndefinedObject = exports.DeadLetterNotFound = exports.SizeLimitExceeded = exports.InvalidArgument = exports.NullArgument = exports.QueenError = void 0;
exports.isTransient = isTransient;
exports.typed = typed;
/**
 * Typed errors for queen's SQLSTATEs (docs/errors.md). A server error comes back as the
 * class matching its SQLSTATE, with the node-postgres error as `cause`. Catch by class,
 * never by message text.
 */
class QueenError extends Error {
    static sqlstate = undefined;
    sqlstate;
    detail;
    hint;
    constructor(message, opts = {}) {
        super(message, { cause: opts.cause });
        this.name = new.target.name;
        this.sqlstate = opts.sqlstate;
        this.detail = opts.detail;
        this.hint = opts.hint;
    }
}
exports.QueenError = QueenError;
/** 22004: a required argument is NULL. */
class NullArgument extends QueenError {
    static sqlstate = "22004";
}
exports.NullArgument = NullArgument;
/** 22023: an argument has a value it cannot take. */
class InvalidArgument extends QueenError {
    static sqlstate = "22023";
}
exports.InvalidArgument = InvalidArgument;
/** 54000: a payload, headers or batch past a size limit. */
class SizeLimitExceeded extends QueenError {
    static sqlstate = "54000";
}
exports.SizeLimitExceeded = SizeLimitExceeded;
/** P0002: no dead letter at this address. */
class DeadLetterNotFound extends QueenError {
    static sqlstate = "P0002";
}
exports.DeadLetterNotFound = DeadLetterNotFound;
/** 42704: the queue, consumer group or lane does not exist. */
class UndefinedObject extends QueenError {
    static sqlstate = "42704";
}
exports.UndefinedObject = UndefinedObject;
/** 55006: a lane is under a live lease, or a partition is busy. */
class ObjectInUse extends QueenError {
    static sqlstate = "55006";
}
exports.ObjectInUse = ObjectInUse;
/** 42501: the role may not do this on this queue. */
class PermissionDenied extends QueenError {
    static sqlstate = "42501";
}
exports.PermissionDenied = PermissionDenied;
/** 55000: not in the state the call needs (no key, extension not updated, wrong Citus node). */
class NotReady extends QueenError {
    static sqlstate = "55000";
}
exports.NotReady = NotReady;
/** 0A000: e.g. a long-poll under REPEATABLE READ. */
class NotSupported extends QueenError {
    static sqlstate = "0A000";
}
exports.NotSupported = NotSupported;
/** 53400: backpressure: the queue is full, or a shared-memory table is. Retry later. */
class CapacityExceeded extends QueenError {
    static sqlstate = "53400";
}
exports.CapacityExceeded = CapacityExceeded;
/** F0000: the encryption key file is missing or unusable. */
class KeyFileError extends QueenError {
    static sqlstate = "F0000";
}
exports.KeyFileError = KeyFileError;
/** 40001: retry the transaction. */
class SerializationFailure extends QueenError {
    static sqlstate = "40001";
}
exports.SerializationFailure = SerializationFailure;
/** XX001: a stored segment failed its checks. */
class DataCorrupted extends QueenError {
    static sqlstate = "XX001";
}
exports.DataCorrupted = DataCorrupted;
exports.BY_SQLSTATE = Object.fromEntries([NullArgument, InvalidArgument, SizeLimitExceeded, DeadLetterNotFound, UndefinedObject, ObjectInUse,
    PermissionDenied, NotReady, NotSupported, CapacityExceeded, KeyFileError, SerializationFailure, DataCorrupted]
    .map((c) => [c.sqlstate, c]));
/** A lost connection or a server going down (SQLSTATE classes 08 and 57, or none): a
 * consumer reconnects and goes on. */
function isTransient(e) {
    const code = e instanceof QueenError ? e.sqlstate : e?.code;
    if (!code || !/^[0-9A-Z]{5}$/.test(code))
        return true; // no SQLSTATE: the socket, not the server
    return code.startsWith("08") || code.startsWith("57");
}
/** The typed error for a server error; a transient one is returned as it is. */
function typed(e) {
    const pe = e;
    if (!pe || typeof pe.code !== "string" || isTransient(e))
        return e;
    const cls = exports.BY_SQLSTATE[pe.code] ?? QueenError;
    return new cls(pe.message, { sqlstate: pe.code, detail: pe.detail, hint: pe.hint, cause: e });
}
