/**
 * Typed errors for queen's SQLSTATEs (docs/errors.md). A server error comes back as the
 * class matching its SQLSTATE, with the node-postgres error as `cause`. Catch by class,
 * never by message text.
 */
export class QueenError extends Error {
  static readonly sqlstate: string | undefined = undefined;
  readonly sqlstate: string | undefined;
  readonly detail: string | undefined;
  readonly hint: string | undefined;
  constructor(message: string, opts: { sqlstate?: string; detail?: string; hint?: string; cause?: unknown } = {}) {
    super(message, { cause: opts.cause });
    this.name = new.target.name;
    this.sqlstate = opts.sqlstate;
    this.detail = opts.detail;
    this.hint = opts.hint;
  }
}

/** 22004: a required argument is NULL. */
export class NullArgument extends QueenError { static readonly sqlstate = "22004"; }
/** 22023: an argument has a value it cannot take. */
export class InvalidArgument extends QueenError { static readonly sqlstate = "22023"; }
/** 54000: a payload, headers or batch past a size limit. */
export class SizeLimitExceeded extends QueenError { static readonly sqlstate = "54000"; }
/** P0002: no dead letter at this address. */
export class DeadLetterNotFound extends QueenError { static readonly sqlstate = "P0002"; }
/** 42704: the queue, consumer group or lane does not exist. */
export class UndefinedObject extends QueenError { static readonly sqlstate = "42704"; }
/** 55006: a lane is under a live lease, or a partition is busy. */
export class ObjectInUse extends QueenError { static readonly sqlstate = "55006"; }
/** 42501: the role may not do this on this queue. */
export class PermissionDenied extends QueenError { static readonly sqlstate = "42501"; }
/** 55000: not in the state the call needs (no key, extension not updated, wrong Citus node). */
export class NotReady extends QueenError { static readonly sqlstate = "55000"; }
/** 0A000: e.g. a long-poll under REPEATABLE READ. */
export class NotSupported extends QueenError { static readonly sqlstate = "0A000"; }
/** 53400: backpressure: the queue is full, or a shared-memory table is. Retry later. */
export class CapacityExceeded extends QueenError { static readonly sqlstate = "53400"; }
/** F0000: the encryption key file is missing or unusable. */
export class KeyFileError extends QueenError { static readonly sqlstate = "F0000"; }
/** 40001: retry the transaction. */
export class SerializationFailure extends QueenError { static readonly sqlstate = "40001"; }
/** XX001: a stored segment failed its checks. */
export class DataCorrupted extends QueenError { static readonly sqlstate = "XX001"; }

export const BY_SQLSTATE: Record<string, typeof QueenError> = Object.fromEntries(
  [NullArgument, InvalidArgument, SizeLimitExceeded, DeadLetterNotFound, UndefinedObject, ObjectInUse,
    PermissionDenied, NotReady, NotSupported, CapacityExceeded, KeyFileError, SerializationFailure, DataCorrupted]
    .map((c) => [c.sqlstate as string, c]),
);

interface PgLike { code?: string; message: string; detail?: string; hint?: string }

/** A lost connection or a server going down (SQLSTATE classes 08 and 57, or none): a
 * consumer reconnects and goes on. */
export function isTransient(e: unknown): boolean {
  // A system error of the socket (EPIPE, ECONNRESET, ...): its errno code has five
  // capitals too, but it is not a SQLSTATE.
  if (typeof (e as { syscall?: unknown } | undefined)?.syscall === "string") return true;
  const code = e instanceof QueenError ? e.sqlstate : (e as PgLike | undefined)?.code;
  if (!code || !/^[0-9A-Z]{5}$/.test(code)) return true; // no SQLSTATE: the socket, not the server
  // 57014 is a cancelled statement (a timeout, a cancel request), not a lost server.
  return code.startsWith("08") || (code.startsWith("57") && code !== "57014");
}

/** Worth another round rather than stopping the consumer: `isTransient`, a
 * serialization failure or deadlock (class 40), a statement timeout (57014), a full
 * shared-memory table (53400: "retry later", docs/errors.md), a lock wait past the
 * session's `lock_timeout` (55P03). */
export function isRetryable(e: unknown): boolean {
  if (isTransient(e)) return true;
  const code = e instanceof QueenError ? e.sqlstate : (e as PgLike | undefined)?.code;
  return code?.startsWith("40") === true || ["57014", "53400", "55P03"].includes(code ?? "");
}

/** The typed error for a server error; a transient one is returned as it is. */
export function typed(e: unknown): unknown {
  const pe = e as PgLike;
  if (!pe || typeof pe.code !== "string" || isTransient(e)) return e;
  const cls = BY_SQLSTATE[pe.code] ?? QueenError;
  return new cls(pe.message, { sqlstate: pe.code, detail: pe.detail, hint: pe.hint, cause: e });
}
