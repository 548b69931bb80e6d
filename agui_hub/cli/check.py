"""``agui-hub check``: whether the store's Redis is set up to keep the hub's
promises (AOF persistence, no eviction of thread keys, memory headroom), one
verdict per line, each with the change to make.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from .common import Output, Subcommands, UsageError
from .shared_store import STORE_HELP, human_size, open_shared_store, store_url

MEMORY_WARN_FRACTION = 0.9
"""``check`` warns when Redis uses this much of its ``maxmemory``."""


def add_check_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "check",
        help="check that Redis's persistence and eviction keep the hub's promises",
        description="Connect to the store's Redis and check the settings the hub's "
        "promises rest on: AOF persistence (appendonly, appendfsync), the eviction policy "
        "(maxmemory-policy), memory headroom, and every warning `serve` logs at start-up. "
        "One line per check, OK, WARN or FAIL, with the change to make. Exit 0 when every "
        "promise holds (what serve --require-durable-store needs to start), 1 when one "
        "does not, 2 when nothing could be checked (the store is unreachable).",
    )
    parser.add_argument("--store", metavar="URL", help=STORE_HELP)


@dataclass(frozen=True)
class _Verdict:
    """One line of ``check``: its level (OK, WARN, FAIL), what was checked, and why."""

    level: str
    name: str
    text: str

    def line(self) -> str:
        return f"{self.level:<4} {self.name}: {self.text}"


CHECKED_SETTINGS = ("appendonly", "appendfsync", "save", "maxmemory", "maxmemory-policy")


def _conf_change(name: str, value: str, also: str = "") -> str:
    """The change to make, as ``check`` words it: at once and for good."""
    return (
        f"change: CONFIG SET {name} {value} (at once) and `{name} {value}` in redis.conf "
        f"(for good){also}"
    )


def _persistence_verdicts(settings: dict[str, str]) -> list[_Verdict]:
    appendonly = settings.get("appendonly", "").lower()
    fsync = settings.get("appendfsync", "").lower()
    save = settings.get("save", "").strip()
    lost = "(viewers are told: new epochs)"
    if appendonly == "yes":
        aof = _Verdict(
            "OK", "appendonly", "yes: Redis logs every write to its AOF before it answers, so "
            "a restart loses nothing",
        )  # fmt: skip
    elif appendonly == "no" and save:
        aof = _Verdict(
            "FAIL", "appendonly", f'no, RDB snapshots only (save "{save}"): a crash or '
            "restart of Redis loses every acknowledged event since the last snapshot and "
            f"rolls threads back to it {lost}; {_conf_change('appendonly', 'yes')}",
        )  # fmt: skip
    elif appendonly == "no":
        aof = _Verdict(
            "FAIL", "appendonly", 'no, and no RDB snapshots (save ""): Redis persists '
            f"nothing, a restart loses every thread {lost}; {_conf_change('appendonly', 'yes')}",
        )  # fmt: skip
    else:
        aof = _Verdict("WARN", "appendonly", f"{appendonly!r}, a value this check does not "
                       "know: the hub needs yes")  # fmt: skip
    later = "" if appendonly == "yes" else "; it applies once appendonly is yes"
    if fsync == "always":
        sync = _Verdict(
            "OK", "appendfsync", "always: every write is on disk before Redis answers, even a "
            f"crash of its machine loses nothing{later}",
        )  # fmt: skip
    elif fsync == "everysec":
        sync = _Verdict(
            "OK", "appendfsync", "everysec: a crash of Redis loses nothing, a crash of its "
            "machine at most ~1 s of acknowledged events (always: none, at a cost in write "
            f"throughput){later}",
        )  # fmt: skip
    elif fsync == "no":
        sync = _Verdict(
            "FAIL", "appendfsync", "no: the operating system decides when the AOF reaches the "
            "disk, a crash of the machine can lose ~30 s of acknowledged events; "
            + _conf_change("appendfsync", "everysec"),
        )  # fmt: skip
    else:
        sync = _Verdict("WARN", "appendfsync", f"{fsync!r}, a value this check does not know: "
                        "the hub needs everysec or always")  # fmt: skip
    return [aof, sync]


def _eviction_verdict(settings: dict[str, str], uses_ttl: bool) -> _Verdict:
    policy = settings.get("maxmemory-policy", "").lower()
    try:
        maxmemory = int(settings.get("maxmemory", "0") or 0)
    except ValueError:
        maxmemory = 0
    limit = f"maxmemory {human_size(maxmemory)}" if maxmemory else "maxmemory 0: no limit"
    when = "when maxmemory is reached" if maxmemory else "as soon as a maxmemory is set"
    change = _conf_change("maxmemory-policy", "noeviction")
    name = "maxmemory-policy"
    if policy == "noeviction":
        text = f"noeviction ({limit}): a full Redis refuses appends with an error, drops nothing"
        return _Verdict("OK", name, text)
    if policy.startswith("allkeys-"):
        text = f"{policy} ({limit}): Redis evicts any key {when}, threads' events included"
        return _Verdict("FAIL", name, f"{text}; {change}")
    if policy.startswith("volatile-") and uses_ttl:
        text = (
            f"{policy} ({limit}): Redis evicts keys with a TTL {when}, and the store's ttl "
            "option (7 days unless set) gives every thread's keys one"
        )
        return _Verdict("FAIL", name, f"{text}; {change} (or ttl=0 in the store URL)")
    if policy.startswith("volatile-"):
        text = f"{policy} ({limit}): evicts only keys with a TTL; ttl=0 gives thread keys none"
        return _Verdict("OK", name, text)
    text = f"{policy!r}, a value this check does not know: the hub needs noeviction"
    return _Verdict("WARN", name, f"{text}; {change}")


def _memory_verdict(settings: dict[str, str], facts: dict[str, str]) -> _Verdict | None:
    """Headroom under maxmemory: not a promise, but a full Redis refuses appends."""
    try:
        maxmemory = int(settings.get("maxmemory", "0") or 0)
        used = int(facts["used_memory"])
    except (KeyError, ValueError):
        return None
    if not maxmemory:
        return _Verdict("OK", "memory", f"{human_size(used)} used, no maxmemory")
    share = used / maxmemory
    text = f"{human_size(used)} used of maxmemory {human_size(maxmemory)} ({share:.0%})"
    if share < MEMORY_WARN_FRACTION:
        return _Verdict("OK", "memory", text)
    return _Verdict(
        "WARN", "memory", f"{text}: a full Redis refuses appends; raise maxmemory (CONFIG SET "
        "maxmemory, and in redis.conf) or keep less (the store's max_len, max_bytes, ttl)",
    )  # fmt: skip


async def check_command(args: argparse.Namespace) -> int:
    from ..errors import StoreError
    from ..store.urls import parse_store_url, redact_url

    try:
        url = store_url(args, "check")
        parsed = parse_store_url(url)
        store = open_shared_store(url)
    except (UsageError, ValueError) as exc:
        # Nothing was checked: exit 2 also for a missing redis package.
        print(f"agui-hub check: {exc}", file=sys.stderr)
        return 2
    where = redact_url(url)
    assert parsed.redis_url is not None
    from ..store.redis.settings import redis_settings  # redis is there: the store opened

    try:
        try:
            await store.ping()
            settings, refused, facts = await redis_settings(
                parsed.redis_url, CHECKED_SETTINGS, store.op_timeout
            )
            warnings: list[str] = await store.durability_warnings()
        except StoreError as exc:  # unreachable, or it refuses us (a wrong password)
            why = str(exc).rstrip(".")
            print(_Verdict("FAIL", "reachable", f"{why}; nothing else was checked").line())
            return 2
    finally:
        await store.close()
    version = facts.get("redis_version", "?")
    verdicts = [_Verdict("OK", "reachable", f"Redis {version} at {where} answers")]
    if refused is not None:
        text = (
            f"Redis does not let agui-hub read its settings (CONFIG GET: {refused}); check by "
            "hand that appendonly is yes, appendfsync everysec or always, and maxmemory-policy "
            "noeviction"
        )
        verdicts.append(_Verdict("FAIL", "settings", text))
    else:
        verdicts += _persistence_verdicts(settings)
        verdicts.append(_eviction_verdict(settings, store.retention.ttl > 0))
        memory = _memory_verdict(settings, facts)
        if memory is not None:
            verdicts.append(memory)
    # What `serve` warns about, unless a FAIL line above already said it: one
    # verdict, whichever check finds it (a warning this check does not know
    # of still fails it, as it stops serve --require-durable-store).
    failed = [verdict.name for verdict in verdicts if verdict.level == "FAIL"]
    for warning in warnings:
        if not any(name in warning for name in failed):
            verdicts.append(_Verdict("FAIL", "store", warning))
    out = Output(sys.stdout)
    out.write("".join(verdict.line() + "\n" for verdict in verdicts))
    failures = sum(verdict.level == "FAIL" for verdict in verdicts)
    if failures:
        print(f"agui-hub check: {failures} check{'s' if failures != 1 else ''} failed: the "
              f"hub's promises do not hold on Redis at {where}, or cannot be verified: see the "
              "FAIL lines, and docs/store.md, 'Redis settings the store needs'",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"agui-hub check: Redis at {where} keeps the hub's promises", file=sys.stderr)
    return 0
