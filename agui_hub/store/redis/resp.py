"""RESP for the Redis store's hot paths: commands packed by hand, replies parsed
straight into :class:`~agui_hub.store.contract.Entry` tuples.

redis-py's generic encoding and parsing cost most of an append's and a
catch-up read's CPU in this process; these do what the store needs and no
more. Offsets are spelled as Redis spells them (:func:`normal_offset`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from ..contract import START, Entry, Offset, offset_key

__all__ = [
    "MAX_OFFSET",
    "command",
    "normal_offset",
    "parse_entry",
    "raw_reply",
    "round_trip",
    "text",
]

log = logging.getLogger("agui_hub.redis_store")

MAX_OFFSET = (2**64 - 1, 2**64 - 1)
"""The largest offset (as :func:`~agui_hub.store.contract.offset_key` gives it):
nothing can follow it, so a read after it asks Redis for no entries."""


def normal_offset(offset: Offset) -> Offset:
    """*offset* validated and in Redis's spelling (no leading zeros).

    The scripts compare offsets as decimal strings: pass them only offsets
    spelled this way."""
    ms, seq = offset_key(offset)
    return f"{ms}-{seq}"


# -- replies ----------------------------------------------------------------------------


def text(value: Any) -> str:
    """A reply value as text; never raises (bytes that are not UTF-8 are replaced)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def parse_entry(raw: Sequence[Any]) -> Entry:
    """An Entry from one raw XRANGE item: ``[id, [field, value, ...]]``.

    Never raises, whatever a producer wrote with a plain XADD: a missing
    ``event`` field gives empty data, an id or type that is not UTF-8 is
    decoded with replacement characters. One odd entry must not fail a read
    (nor the live reader's batch of many threads).
    """
    try:
        offset = text(raw[0])
        fields = raw[1]
        if type(fields) is dict:  # a client whose XRANGE reply was parsed into a map
            fields = [x for pair in fields.items() for x in pair]
        if (
            len(fields) == 8
            and fields[0] == b"event"
            and fields[2] == b"id"
            and fields[4] == b"run"
            and fields[6] == b"type"
        ):
            # The layout the append script writes: event, id, run, type.
            # (try, not contextlib.suppress: no object made per entry on a hot path)
            try:
                run = fields[5]
                return Entry(
                    offset,
                    fields[1],
                    fields[3].decode(),
                    run.decode() if run else None,
                    fields[7].decode(),
                )
            except (UnicodeDecodeError, AttributeError):
                pass
        data: Any = b""
        event_id: Any = None
        run_id: Any = None
        event_type: Any = None
        for i in range(0, len(fields) - 1, 2):
            name = fields[i]
            if name == b"event":
                data = fields[i + 1]
            elif name == b"id":
                event_id = fields[i + 1]
            elif name == b"run":
                run_id = fields[i + 1]
            elif name == b"type":
                event_type = fields[i + 1]
        return Entry(
            offset,
            data if isinstance(data, bytes) else text(data).encode(),
            text(event_id) if event_id is not None else offset,
            text(run_id) if run_id else None,
            text(event_type) if event_type is not None else "",
        )
    except Exception:  # pragma: no cover - Redis replies always have this shape
        log.warning("redis store: unreadable stream entry %r", raw, exc_info=True)
        offset = text(raw[0]) if isinstance(raw, (list, tuple)) and raw else START
        return Entry(offset, b"", offset, None, "")


def raw_reply(response: Any, **options: Any) -> Any:
    """A redis-py response callback that keeps the reply as it is.

    Set for XRANGE: entries are parsed once, by :func:`parse_entry`, not
    first into redis-py's ``(id, dict)`` pairs (catch-up reads are hot)."""
    return response


# -- commands ---------------------------------------------------------------------------


def command(*args: bytes | str | int) -> bytes:
    """One command in RESP, the bytes Redis reads (arguments: bytes, str or int)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if type(arg) is bytes else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


_BARE_GET = (
    inspect.signature(aioredis.BlockingConnectionPool.get_connection)
    .parameters["command_name"]
    .default
    is not inspect.Parameter.empty
)
"""Whether the pool's ``get_connection`` takes no command name (redis-py >= 5.3
warns when given one; older versions need it)."""


async def round_trip(client: aioredis.Redis, commands: bytes, count: int) -> list[Any]:
    """Send *count* commands (RESP, see :func:`command`) at once on one of
    *client*'s connections; their replies, an error reply as its exception.

    What a redis-py pipeline does, without its per-argument encoding and
    per-command bookkeeping. Connection errors are retried as redis-py
    retries them: send only commands that are safe to send twice (the
    append script is, by its event ids).
    """
    pool = client.connection_pool
    get: Any = pool.get_connection
    conn = await (get() if _BARE_GET else get("EVALSHA"))
    try:
        return await conn.retry.call_with_retry(  # type: ignore[no-any-return]
            lambda: _send_and_read(conn, commands, count),
            lambda _error: conn.disconnect(),
        )
    except BaseException:
        # Replies may be left unread on it: never hand it back as it is.
        await conn.disconnect(nowait=True)
        raise
    finally:
        await pool.release(conn)


async def _send_and_read(conn: Any, commands: bytes, count: int) -> list[Any]:
    await conn.send_packed_command(commands, check_health=False)
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(await conn.read_response())
        except ResponseError as exc:  # an error reply: that command's answer
            replies.append(exc)
    return replies
