/**
 * Typed errors for queen's SQLSTATEs (docs/errors.md). A server error comes back as the
 * class matching its SQLSTATE, with the node-postgres error as `cause`. Catch by class,
 * never by message text.
 */
export declare class QueenError extends Error {
    static readonly sqlstate: string | undefined;
    readonly sqlstate: string | undefined;
    readonly detail: string | undefined;
    readonly hint: string | undefined;
    constructor(message: string, opts?: {
        sqlstate?: string;
        detail?: string;
        hint?: string;
        cause?: unknown;
    });
}
/** 22004: a required argument is NULL. */
export declare class NullArgument extends QueenError {
    static readonly sqlstate = "22004";
}
/** 22023: an argument has a value it cannot take. */
export declare class InvalidArgument extends QueenError {
    static readonly sqlstate = "22023";
}
/** 54000: a payload, headers or batch past a size limit. */
export declare class SizeLimitExceeded extends QueenError {
    static readonly sqlstate = "54000";
}
/** P0002: no dead letter at this address. */
export declare class DeadLetterNotFound extends QueenError {
    static readonly sqlstate = "P0002";
}
/** 42704: the queue, consumer group or lane does not exist. */
export declare class UndefinedObject extends QueenError {
    static readonly sqlstate = "42704";
}
/** 55006: a lane is under a live lease, or a partition is busy. */
export declare class ObjectInUse extends QueenError {
    static readonly sqlstate = "55006";
}
/** 42501: the role may not do this on this queue. */
export declare class PermissionDenied extends QueenError {
    static readonly sqlstate = "42501";
}
/** 55000: not in the state the call needs (no key, extension not updated, wrong Citus node). */
export declare class NotReady extends QueenError {
    static readonly sqlstate = "55000";
}
/** 0A000: e.g. a long-poll under REPEATABLE READ. */
export declare class NotSupported extends QueenError {
    static readonly sqlstate = "0A000";
}
/** 53400: backpressure: the queue is full, or a shared-memory table is. Retry later. */
export declare class CapacityExceeded extends QueenError {
    static readonly sqlstate = "53400";
}
/** F0000: the encryption key file is missing or unusable. */
export declare class KeyFileError extends QueenError {
    static readonly sqlstate = "F0000";
}
/** 40001: retry the transaction. */
export declare class SerializationFailure extends QueenError {
    static readonly sqlstate = "40001";
}
/** XX001: a stored segment failed its checks. */
export declare class DataCorrupted extends QueenError {
    static readonly sqlstate = "XX001";
}
export declare const BY_SQLSTATE: Record<string, typeof QueenError>;
/** A lost connection or a server going down (SQLSTATE classes 08 and 57, or none): a
 * consumer reconnects and goes on. */
export declare function isTransient(e: unknown): boolean;
/** The typed error for a server error; a transient one is returned as it is. */
export declare function typed(e: unknown): unknown;
