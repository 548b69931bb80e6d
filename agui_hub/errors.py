"""The exceptions agui-hub raises.

Every exception derives from :class:`AguiHubError`, so ``except AguiHubError``
catches anything the hub reports on purpose; anything else is a bug. Each
exception carries a stable machine-readable :attr:`~AguiHubError.code` that
the gateway puts into its error frames, and a message a person can act on.

.. code-block:: text

    AguiHubError
    └── ProtocolError                 bad input from a peer; the hub keeps running
        ├── DecodeError               bytes that are not valid msgpack / JSON
        ├── PayloadTooLarge           an encoded payload over the configured limit
        ├── InvalidEvent              not an AG-UI 1.0 event (shape, type, fields)
        ├── SequenceError             a valid event in an order the protocol forbids
        │   └── ChunkError            a *_CHUNK event that cannot be expanded
        ├── PatchError                a JSON Patch that cannot be applied
        ├── LimitExceeded             an event would push the thread's state past a limit
        ├── RateLimited               a connection sent more than its limit per second
        └── TooManyThreads            a new thread would pass its tenant's thread quota
    └── AuthError                     who the peer is, or what it may do, says no
        ├── Unauthorized              no valid credentials: missing, malformed, expired token
        └── Forbidden                 valid credentials that do not grant this action here
    └── StoreError                    the thread store could not do what was asked
        ├── StoreUnavailable          the backend (Redis) cannot be reached; retry
        ├── InvalidOffset             not an offset of the form "<ms>-<seq>"
        ├── AppendConflict            the thread changed since the writer last read it
        ├── OffsetExpired             events after the offset were trimmed; resync
        │   └── ThreadReset           the thread's stream was lost or re-created; resync
        └── SubscriptionLagged        a live feed was not read fast enough; resubscribe
    └── BridgeError                   a run of an upstream agent (the HTTP bridge) was refused
        ├── UnknownAgent              no upstream agent of that name is configured
        ├── UnknownRun                a parentRunId that is no run of the thread
        ├── RunActive                 the thread has a run going; cancel it or wait
        ├── TooManyRuns               the gateway runs as many upstream runs as it may
        ├── NoActiveRun               a cancel for a thread without a bridged run here
        └── UpstreamError             the upstream agent failed: its run ended with RUN_ERROR
    └── PresenceOff                   this gateway keeps no presence (--presence off)
    └── ClientError                   a client of the gateway (agui_hub.client) stopped
        ├── HubUnreachable            no connection to the gateway, and retrying gave up
        ├── ConnectionRejected        the gateway closed the connection for good (4401, 4403)
        └── CommandRejected           the gateway answered a command with an error frame

Catch :class:`ProtocolError` at a boundary that receives input (a socket, a
publish call): report it to the sender and carry on. Catch
:class:`OffsetExpired` where a reader resumes: it means "start again from a
snapshot", never a silent partial read.

A client receives the gateway's errors as the same classes:
:func:`from_error_frame` turns an error frame of a publish into
:class:`InvalidEvent`, :class:`SequenceError`, :class:`PatchError`,
:class:`LimitExceeded`, :class:`PayloadTooLarge` or :class:`StoreUnavailable`
(with the gateway's message), so code that publishes
catches the same exceptions whether it writes into a store or through a
gateway. Error codes without a class of their own (``forbidden``,
``bad_command``, ...) become :class:`CommandRejected`.
"""

from __future__ import annotations

import re
from typing import Any


class AguiHubError(Exception):
    """Root of every exception agui-hub raises on purpose."""

    code: str = "error"
    """Stable, machine-readable identifier, e.g. ``"invalid_event"``."""


class ProtocolError(AguiHubError):
    """Input that breaks the AG-UI protocol or the hub's encoding rules.

    The input is rejected as a whole; nothing of it was stored or applied.
    """

    code = "protocol_error"

    index: int | None = None
    """For an error about one event of a published batch: that event's
    position in the batch (0-based); ``None`` otherwise."""


class DecodeError(ProtocolError):
    """The payload is not well-formed msgpack or JSON, or not of the expected shape.

    Fix the producer's encoder; the payload cannot be recovered.
    """

    code = "decode_error"


class PayloadTooLarge(ProtocolError):
    """The payload is larger than the configured limit.

    Split the data over several events (for example several
    TEXT_MESSAGE_CONTENT deltas) or raise the limit.
    """

    code = "payload_too_large"

    def __init__(self, size: int, limit: int, unit: str = "bytes") -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"payload of {size} {unit} exceeds the limit of {limit} {unit}")


class InvalidEvent(ProtocolError):
    """The object is not a valid AG-UI 1.0 event.

    :attr:`problems` lists each problem as ``(location, message)``; the
    message of the exception joins them into one line.
    """

    code = "invalid_event"

    def __init__(
        self,
        message: str,
        *,
        event_type: str | None = None,
        problems: list[tuple[str, str]] | None = None,
    ) -> None:
        self.event_type = event_type
        self.problems = problems or []
        super().__init__(message)


class SequenceError(ProtocolError):
    """A valid event arrived where the AG-UI sequence rules forbid it.

    :attr:`rule` names the broken rule (e.g. ``"run_not_started"``),
    :attr:`event` is the offending event's wire dict and :attr:`thread` the
    thread it was published to (``None`` when unknown). Nothing of the event
    was applied; the verifier's state is unchanged, so the producer may send a
    corrected event next.
    """

    code = "sequence_error"

    def __init__(
        self,
        rule: str,
        message: str,
        *,
        event: dict[str, Any] | None = None,
        thread: str | None = None,
    ) -> None:
        self.rule = rule
        self.event = event
        self.thread = thread
        event_type = event.get("type") if event else None
        where = f" in thread {thread!r}" if thread is not None else ""
        super().__init__(f"[{rule}] {event_type or 'event'}{where}: {message}")


class ChunkError(SequenceError):
    """A TEXT_MESSAGE_CHUNK, TOOL_CALL_CHUNK or REASONING_MESSAGE_CHUNK that
    cannot be expanded, e.g. the first chunk of a stream without its id."""

    code = "chunk_error"


class PatchError(ProtocolError):
    """An RFC 6902 JSON Patch that does not apply to the current document.

    The document is left unchanged. :attr:`patch` is the patch as received.
    """

    code = "patch_error"

    def __init__(self, message: str, *, patch: Any = None) -> None:
        self.patch = patch
        super().__init__(message)


class LimitExceeded(ProtocolError):
    """An event would make the thread's folded state exceed a configured limit.

    :attr:`limit` names the limit (``"max_depth"``, ``"max_bytes"``) and
    :attr:`value` its configured value. Nothing of the event was applied or
    stored: send a smaller state (a STATE_SNAPSHOT that replaces it), or
    raise the limit (``agui-hub serve --state-max-bytes`` / ``--state-max-depth``).
    """

    code = "limit_exceeded"

    def __init__(self, message: str, *, limit: str, value: int) -> None:
        self.limit = limit
        self.value = value
        super().__init__(message)


class RateLimited(ProtocolError):
    """A connection sent more commands or events per second than the gateway allows.

    Nothing of the command was carried out. Wait :attr:`retry_after` seconds
    and send it again (a publish with the same event ids stores nothing
    twice), or ask the operator for a higher limit
    (``--max-commands-per-second``, ``--max-events-per-second``).
    """

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float = 0.0) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class TooManyThreads(ProtocolError):
    """A publish would create a thread past its tenant's quota of threads.

    The tenant is the part of the thread id before its first ``/``
    (``tenant-42/run-1`` belongs to ``tenant-42``). Nothing was stored:
    delete threads of the tenant, let idle ones expire (the store's ``ttl``),
    or raise the store's ``max_tenant_threads``.
    """

    code = "too_many_threads"


class AuthError(AguiHubError):
    """Who the peer is, or what it may do, stops the request."""

    code = "auth_error"


class Unauthorized(AuthError):
    """No valid credentials: the token is missing, malformed, badly signed, expired,
    or for another audience or issuer. Get a new token and connect again (or send
    it in an ``auth`` command)."""

    code = "unauthorized"


class Forbidden(AuthError):
    """Valid credentials that do not grant this action on this thread, or
    credentials that were revoked.

    Ask whoever issues the tokens for a grant (see docs/security.md).
    """

    code = "forbidden"


class StoreError(AguiHubError):
    """The thread store could not do what was asked."""

    code = "store_error"


class StoreUnavailable(StoreError):
    """The store's backend (Redis) cannot be reached; retry later.

    When :meth:`~agui_hub.store.ThreadStore.append` raises this the events may
    or may not have been appended (the reply can be lost): retry with the same
    event ids, which never appends twice.
    """

    code = "store_unavailable"


class InvalidOffset(StoreError):
    """A string that is not an offset (``"<ms>-<seq>"``, e.g. ``"1764700000000-0"``)."""

    code = "invalid_offset"


class OffsetExpired(StoreError):
    """Events after the requested offset are no longer stored (retention trimmed them).

    The reader cannot get a complete history from :attr:`offset`: resync from
    a snapshot. :attr:`first` is the oldest offset still stored (``None`` when
    none is).
    """

    code = "offset_expired"

    def __init__(self, thread: str, offset: str, first: str | None, reason: str = "") -> None:
        self.thread = thread
        self.offset = offset
        self.first = first
        super().__init__(
            reason
            or f"thread {thread!r}: events after offset {offset} were trimmed "
            f"(oldest stored: {first or 'none'}); resync from a snapshot"
        )


class ThreadReset(OffsetExpired):
    """The thread's stream was lost or re-created, so its epoch changed.

    Offsets of the old epoch mean nothing in the new one: resync from a snapshot.
    """

    code = "thread_reset"

    def __init__(self, thread: str, old_epoch: str | None, new_epoch: str | None) -> None:
        self.old_epoch = old_epoch
        self.new_epoch = new_epoch
        super().__init__(
            thread,
            "",
            None,
            f"thread {thread!r} was reset (epoch {old_epoch} -> {new_epoch or 'deleted'}); "
            "resync from a snapshot",
        )


class AppendConflict(StoreError):
    """A conditional append found the thread changed: nothing was appended.

    Raised by :meth:`~agui_hub.store.ThreadStore.append` with ``expect`` when
    another writer appended after the expected offset, or the thread's epoch
    is not the expected one. Read what changed, judge the events again, and
    append with the new expectation (:class:`~agui_hub.gateway.writer.ThreadWriter`
    does this by itself).
    """

    code = "append_conflict"

    def __init__(self, thread: str) -> None:
        self.thread = thread
        super().__init__(
            f"thread {thread!r} changed since it was last read; read it again and retry"
        )


class SubscriptionLagged(StoreError):
    """A live subscription's bounded queue overflowed: it was not read fast enough.

    Nothing is lost in the store: subscribe again after :attr:`last`, the
    offset of the last entry this subscription delivered.
    """

    code = "subscription_lagged"

    def __init__(self, thread: str, last: str) -> None:
        self.thread = thread
        self.last = last
        super().__init__(
            f"subscription to thread {thread!r} fell behind; resubscribe after offset {last}"
        )


class BridgeError(AguiHubError):
    """A run of an upstream agent (docs/bridge.md) could not start or be cancelled."""

    code = "bridge_error"


class UnknownAgent(BridgeError):
    """No upstream agent of that name is configured on this gateway (``--agent NAME=URL``)."""

    code = "unknown_agent"


class UnknownRun(BridgeError):
    """A run's ``parentRunId`` names no run of the thread (``runs`` lists them)."""

    code = "unknown_run"


class RunActive(BridgeError):
    """The thread has a run going: cancel it, or wait for its RUN_FINISHED / RUN_ERROR."""

    code = "run_active"


class TooManyRuns(BridgeError):
    """The gateway has as many upstream runs going as ``max_runs`` allows; retry later."""

    code = "too_many_runs"


class NoActiveRun(BridgeError):
    """A cancel for a thread that has no bridged run on this gateway (or not that run id)."""

    code = "no_active_run"


class UpstreamError(BridgeError):
    """The upstream agent failed; :attr:`code` says how (``upstream_unreachable``,
    ``upstream_status``, ``upstream_malformed``, ``upstream_invalid_event``,
    ``upstream_closed``, ``upstream_timeout``; ``thread_changed`` when the thread was
    reset or its run ended by another writer meanwhile). The run ended with a RUN_ERROR whose
    ``code`` is ``AGUI_HUB_`` and this code in capitals, and whose message is this one."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)

    @property
    def run_error_code(self) -> str:
        return "AGUI_HUB_" + self.code.upper()


class PresenceOff(AguiHubError):
    """This gateway keeps no presence (``--presence off``): ask another gateway, or
    its operator to turn presence on."""

    code = "presence_off"


class ClientError(AguiHubError):
    """A client of the gateway could not do what was asked."""

    code = "client_error"


class HubUnreachable(ClientError):
    """The gateway cannot be reached (refused, unresolvable, handshake failed).

    Check the URL and that ``agui-hub serve`` runs there. Raised by the first
    connection attempt, and later when reconnecting gave up after the
    client's ``give_up_after`` seconds.
    """

    code = "hub_unreachable"


class ConnectionRejected(ClientError):
    """The gateway closed the connection with a code that forbids resuming.

    :attr:`close_code` is 4401 (unauthorised: fix the credentials), 4403
    (forbidden) or 1000 (the gateway ended the session). Reconnecting with
    the same request would be refused again.
    """

    code = "connection_rejected"

    def __init__(self, close_code: int, reason: str) -> None:
        self.close_code = close_code
        self.reason = reason
        super().__init__(f"the gateway closed the connection: {close_code} {reason}".rstrip())


class CommandRejected(ClientError):
    """The gateway answered a command with an error frame.

    :attr:`code` is the frame's error code (see docs/protocol.md, e.g.
    ``forbidden``, ``too_many_subscriptions``, ``invalid_offset``) and the
    message is the gateway's. The connection stays open.
    """

    def __init__(self, code: str, message: str, thread: str | None = None) -> None:
        self.code = code
        self.thread = thread
        super().__init__(message)


_RULE = re.compile(r"^\[([a-z_]+)\]")


def from_error_frame(
    code: str, message: str, thread: str | None = None, index: int | None = None
) -> AguiHubError:
    """The exception that a gateway error frame stands for, with the gateway's message.

    ``invalid_event``, ``sequence_error``, ``chunk_error``, ``patch_error``,
    ``limit_exceeded``, ``payload_too_large``, ``rate_limited``,
    ``too_many_threads`` and ``store_unavailable`` give
    the classes a local publish raises; any other code gives :class:`CommandRejected`. *index*
    (the frame's ``index``) becomes :attr:`ProtocolError.index`.
    """
    exc: AguiHubError
    if code in ("sequence_error", "chunk_error"):
        match = _RULE.match(message)
        cls = ChunkError if code == "chunk_error" else SequenceError
        exc = cls.__new__(cls)
        Exception.__init__(exc, message)
        exc.rule = match.group(1) if match else code
        exc.event = None
        exc.thread = thread
    elif code == "invalid_event":
        exc = InvalidEvent(message)
    elif code == "payload_too_large":
        exc = PayloadTooLarge.__new__(PayloadTooLarge)
        Exception.__init__(exc, message)
        exc.size, exc.limit = 0, 0
    elif code == "patch_error":
        exc = PatchError(message)
    elif code == "limit_exceeded":
        exc = LimitExceeded(message, limit="", value=0)
    elif code == "store_unavailable":
        exc = StoreUnavailable(message)
    elif code == "rate_limited":
        exc = RateLimited(message)
    elif code == "too_many_threads":
        exc = TooManyThreads(message)
    else:
        exc = CommandRejected(code, message, thread)
    if isinstance(exc, ProtocolError):
        exc.index = index
    return exc
