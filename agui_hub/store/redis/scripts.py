"""The Redis store's Lua scripts, read from the package's ``lua/`` folder.

Each script is a file of its own (``agui_hub/store/redis/lua/*.lua``) whose header
says its KEYS, ARGV and reply, so that it can be read, and run with
``redis-cli --eval``, on its own. They are read once, when this module is
imported, and shipped as package data (pyproject.toml).

The store runs the append, read, position and presence scripts with EVALSHA and loads
one when Redis answers NOSCRIPT (a restart, a failover, SCRIPT FLUSH): see
:meth:`~agui_hub.store.redis.calls.RedisCalls.load_script`. The checkpoint
script, written rarely, is sent whole with EVAL.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

__all__ = [
    "APPEND",
    "CHECKPOINT",
    "CHECK_POSITION",
    "PRESENCE_READ",
    "PRESENCE_UPDATE",
    "READ",
    "Script",
]


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script's source and its SHA1 (what EVALSHA names it by)."""

    name: str
    """The file it was read from, e.g. ``append.lua``."""
    source: str
    sha: str

    @classmethod
    def of(cls, name: str, source: str) -> Script:
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())

    def replace(self, old: str, new: str) -> Script:
        """This script with *old* replaced by *new* in its source (a new SHA)."""
        return Script.of(self.name, self.source.replace(old, new))


def _read(name: str) -> str:
    return (
        resources.files(__name__.rpartition(".")[0])
        .joinpath("lua", name)
        .read_text(encoding="utf-8")
    )


def load(name: str, *, after: str | None = None) -> Script:
    """The script in ``lua/<name>`` of this package; with *after*, that file's
    source first (what two scripts share: Redis scripts cannot import)."""
    source = _read(name)
    if after is not None:
        source = _read(after) + "\n" + source
    return Script.of(name, source)


APPEND = load("append.lua")
"""Appends events to one thread (:meth:`RedisStore.append
<agui_hub.store.redis.store.RedisStore.append>`): idempotent, conditional, with
retention, rewind detection and the live readers' notification."""

CHECK_POSITION = load("check_position.lua")
"""Whether a live reader's cursor is still stored after a reconnect; a new
epoch if the stream was rolled back under it."""

CHECKPOINT = load("checkpoint.lua")
"""Writes a thread's checkpoint, only forward and only in its current epoch."""

READ = load("read.lua")
"""A page of one thread on Redis Cluster: meta and entries, atomically."""

PRESENCE_UPDATE = load("presence_update.lua", after="presence_lib.lua")
"""Adds, refreshes and removes one thread's presence entries, drops the expired ones."""

PRESENCE_READ = load("presence_read.lua", after="presence_lib.lua")
"""One thread's presence entries (or only its version, when the reader knows it)."""
