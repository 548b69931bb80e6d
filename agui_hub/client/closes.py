"""What a closed connection means to the client: reconnect, or end with which error.

The close codes are those of docs/protocol.md (close codes). The connection
(:class:`~agui_hub.client.link.GatewayLink`) decides with :data:`NO_RESUME`
and :data:`CLIENT_FAULTS` whether to reconnect, and raises what the
functions here build when it does not: each message says what to change.
"""

from __future__ import annotations

from ..errors import CommandRejected, ConnectionRejected
from ..wire.protocol import CloseCode

__all__ = [
    "CLIENT_FAULTS",
    "NO_RESUME",
    "faulty_frame_refused",
    "gateway_refused_again",
    "no_resume",
    "unreadable_frame",
]

NO_RESUME = {CloseCode.NORMAL, CloseCode.UNAUTHORIZED, CloseCode.FORBIDDEN}
"""Close codes after which the client stops (docs/protocol.md, close codes)."""
CLIENT_FAULTS = {1002: "protocol error", 1007: "invalid data", 1009: "message too big"}
"""Close codes that say one side could not take the other's frame ("fix the client").

Sent by the gateway (a frame of this client was refused), the client fails the
commands in flight, reconnects and resumes once; the same close again before the
gateway answered anything ends the client with
:class:`~agui_hub.errors.ConnectionRejected` rather than a reconnect loop. Sent by
this client (a frame of the gateway was over ``max_receive_bytes``, or invalid),
it ends the client at once: the gateway would send the same frame again."""


def no_resume(code: int, reason: str) -> ConnectionRejected:
    """The gateway closed the connection with a code that forbids reconnecting."""
    error = ConnectionRejected(code, reason)
    because = f" ({reason})" if reason else ""
    if code == CloseCode.UNAUTHORIZED:
        error.args = (
            f"the gateway closed the connection with 4401{because}: its credentials "
            "expired (or never came); pass token= a callable that returns fresh "
            "tokens, so that the client renews them and reconnects by itself",
        )
    elif code == CloseCode.FORBIDDEN:
        error.args = (
            f"the gateway closed the connection with 4403{because}: its credentials "
            "were revoked; do not reconnect with them",
        )
    return error


def faulty_frame_refused(code: int, name: str, reason: str) -> CommandRejected:
    """What a command in flight gets when the gateway closed with a CLIENT_FAULTS code."""
    if code == CloseCode.MESSAGE_TOO_BIG:
        return CommandRejected(
            "payload_too_large",
            "the gateway closed the connection (1009): a frame was over its "
            "size limit; lower the client's max_frame_bytes to match it",
        )
    return CommandRejected(
        "bad_frame",
        f"the gateway closed the connection ({code} {name}: "
        f"{reason or 'no reason given'}): it could not read a frame of "
        "this client",
    )


def gateway_refused_again(code: int, name: str, reason: str) -> ConnectionRejected:
    """The gateway closed with the same CLIENT_FAULTS code twice without answering between."""
    error = ConnectionRejected(code, reason)
    error.args = (
        f"the gateway closed the connection with {code} ({name}"
        f"{': ' + reason if reason else ''}) twice without "
        "answering anything in between: it refuses this client's frames; fix the "
        "client (e.g. max_frame_bytes) rather than reconnect",
    )
    return error


def unreadable_frame(code: int, reason: str, max_receive_bytes: int | None) -> ConnectionRejected:
    """This client failed the connection (CLIENT_FAULTS): the gateway's frame was unreadable."""
    if code == CloseCode.MESSAGE_TOO_BIG:
        what = (
            f"a frame from the gateway was over this client's max_receive_bytes "
            f"({max_receive_bytes} bytes), e.g. the snapshot of a large thread; "
            "raise max_receive_bytes (None: no limit)"
        )
    else:
        what = (
            f"a frame from the gateway was unreadable ({code} "
            f"{CLIENT_FAULTS.get(code, '')}: {reason})"
        )
    error = ConnectionRejected(code, reason)
    error.args = (f"{what}; not reconnecting: the gateway would send it again",)
    return error
