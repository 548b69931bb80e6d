"""Opening one WebSocket to a gateway, and what a failed opening handshake raises.

:func:`open_websocket` is one attempt: it returns the open connection or
raises :class:`~agui_hub.errors.HubUnreachable` (:class:`GatewayBusy` when
the gateway said when to come back) or
:class:`~agui_hub.errors.ConnectionRejected`, with a message that says what
to do about it. Retrying is the caller's business (see
:class:`~agui_hub.client.link.GatewayLink`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import ssl
from collections.abc import Mapping

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidMessage, InvalidStatus, InvalidURI

from ..errors import AguiHubError, ConnectionRejected, HubUnreachable
from ..gateway.auth import RedactingLogger
from ..wire.codec import Encoding
from ..wire.protocol import SUBPROTOCOL_JSON, SUBPROTOCOL_MSGPACK, CloseCode
from .retry import MAX_RETRY_AFTER

__all__ = ["GatewayBusy", "describe", "open_websocket"]

_WEBSOCKETS_LOG = RedactingLogger(logging.getLogger("websockets.client"), {})


def describe(exc: BaseException) -> str:
    """*exc* for a log line: its type, and its message when it has one."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _unreachable(url: str, exc: BaseException) -> str:
    """Why a connection attempt to *url* failed, in words (never an empty reason)."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    # A wss:// client meeting a plain hub: the hub reads the TLS hello as a bad
    # HTTP request and drops the connection, so the error says little itself.
    if (
        scheme == "wss"
        and isinstance(exc, ssl.SSLError | ConnectionResetError | ConnectionAbortedError)
        and not isinstance(exc, ssl.SSLCertVerificationError)
    ):
        return (
            f"TLS handshake failed ({describe(exc)}): is the hub serving TLS? "
            f"For a hub without TLS use ws://{rest}"
        )
    if scheme == "ws" and isinstance(exc, InvalidMessage):
        # A TLS hub (or something else than a gateway) answers a plain request.
        return f"{exc} (is it an agui-hub gateway? If it serves TLS, use wss://{rest})"
    if isinstance(exc, TimeoutError):
        return f"no WebSocket handshake in time ({describe(exc)})"
    return str(exc) or describe(exc)


class GatewayBusy(HubUnreachable):
    """HTTP 429 / 503 at the handshake: transient; retry after :attr:`retry_after` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        self.retry_after = retry_after
        super().__init__(message)


async def open_websocket(
    url: str,
    *,
    encoding: Encoding,
    headers: Mapping[str, str],
    token: str | None,
    open_timeout: float,
    max_receive_bytes: int | None,
) -> ClientConnection:
    """One connection attempt to the gateway at *url*, sending *token* as a bearer token.

    Raises :class:`GatewayBusy` (HTTP 429 / 503: retry after its
    ``retry_after``), :class:`~agui_hub.errors.HubUnreachable` (cannot connect,
    not a gateway, subprotocol refused) or
    :class:`~agui_hub.errors.ConnectionRejected` (HTTP 401 / 403).
    """
    subprotocol = SUBPROTOCOL_MSGPACK if encoding is Encoding.MSGPACK else SUBPROTOCOL_JSON
    headers = dict(headers)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        ws = await connect(
            url,
            subprotocols=[subprotocol],  # type: ignore[list-item]
            additional_headers=headers or None,
            open_timeout=open_timeout,
            max_size=max_receive_bytes,
            logger=_WEBSOCKETS_LOG,
        )
    except InvalidStatus as exc:
        raise _refusal(url, exc, token) from None
    except InvalidURI as exc:
        raise HubUnreachable(f"not a WebSocket URL: {exc}") from None
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise HubUnreachable(f"cannot connect to {url}: {_unreachable(url, exc)}") from None
    if ws.subprotocol != subprotocol:
        await ws.close()
        raise HubUnreachable(f"{url} did not accept the {subprotocol} subprotocol")
    return ws


def _refusal(url: str, exc: InvalidStatus, token: str | None) -> AguiHubError:
    """What a handshake answered with another HTTP status than 101 raises."""
    response = exc.response
    status = response.status_code
    body = bytes(response.body or b"").decode("utf-8", "replace").strip()
    if token is not None:
        body = body.replace(token, "[token]")  # a gateway that echoes it: not in messages
    why = " ".join(body.split())[:300] or response.reason_phrase
    if status in (429, 503):
        retry_after = 0.0
        with contextlib.suppress(TypeError, ValueError):
            retry_after = float(response.headers.get("Retry-After", "0"))
        if not math.isfinite(retry_after) or retry_after < 0:
            retry_after = 0.0
        what = "has too many connections from this address" if status == 429 else (
            "is full or draining")  # fmt: skip
        return GatewayBusy(
            f"{url} {what} (HTTP {status}: {why}); try again "
            f"{f'in {retry_after:g} s' if retry_after else 'later'}",
            min(retry_after, MAX_RETRY_AFTER),
        )
    if status in (401, 403):
        code = CloseCode.UNAUTHORIZED if status == 401 else CloseCode.FORBIDDEN
        error = ConnectionRejected(code, why)
        if status == 403:
            message = (
                f"the gateway refused the connection (HTTP 403: {why}): the credentials "
                "were revoked or this Origin is not allowed; do not retry with them"
            )
        elif token is None:
            message = (
                f"the gateway requires a token (HTTP 401: {why}); pass token= to the "
                "client (a JWT, or a callable that returns one)"
            )
        else:
            message = (
                f"the gateway refused the token (HTTP 401: {why}); get a new token, or "
                "pass token= a callable that returns a fresh one"
            )
        error.args = (message,)
        return error
    return HubUnreachable(f"{url} is not an agui-hub gateway: {exc}")
