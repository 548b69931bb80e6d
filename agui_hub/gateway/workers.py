"""``agui-hub serve --workers N``: N gateway processes sharing one port.

The parent, a :class:`Supervisor`, serves nothing itself. It starts each
worker as the same ``serve`` command line with :data:`WORKER_FLAG`, so a
worker reads its settings exactly as a single gateway does; every worker
listens with SO_REUSEPORT and the kernel spreads new connections among them.
The parent forwards SIGTERM, SIGINT (each worker drains) and SIGHUP (each
re-reads its credentials), restarts a worker that dies unexpectedly (at most
:data:`RESTART_LIMIT` times in :data:`RESTART_WINDOW` seconds) and exits
once every worker has exited.

A worker watches a pipe from the parent: when the parent is gone, however it
died, the worker drains and exits rather than serving on unsupervised.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FORWARDED", "WORKER_FLAG", "Supervisor", "check_port_free"]

log = logging.getLogger("agui_hub.workers")

WORKER_FLAG = "--worker-pipe"
"""The hidden ``serve`` flag that makes a process a worker; its value is the
descriptor of the pipe whose end of file says the parent is gone."""

FORWARDED: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)
"""Signals the parent passes on to every worker (where the platform has them: the
command line imports this module everywhere, workers run only where SO_REUSEPORT is)."""

RESTART_LIMIT = 5
RESTART_WINDOW = 60.0
"""A worker that died is restarted unless RESTART_LIMIT restarts happened in the
last RESTART_WINDOW seconds: then the parent stops every worker and exits 1."""

STOP_TIMEOUT = 30.0
"""Seconds the workers have to drain after SIGTERM before they are killed (a
gateway's drain is bounded by about 20 s)."""

CONFIG_ERROR = 2
"""The exit status of a worker whose settings cannot be served: restarting it
would fail the same way."""


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`OSError` if something already listens on *host*:*port*.

    Workers bind with SO_REUSEPORT, which lets them share the port with any
    other process of the same user that does too (a forgotten gateway with
    workers, say): the parent binds without it first, so that a taken port
    is refused as a single gateway would refuse it.
    """
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    probed = set()
    for family, kind, proto, _name, address in infos:
        if (family, address) in probed:
            continue
        probed.add((family, address))
        with socket.socket(family, kind, proto) as probe:
            # As asyncio binds: a port in TIME_WAIT is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            probe.bind(address)


@dataclass
class Worker:
    """One worker slot: the process now in it, if any."""

    number: int
    process: subprocess.Popen[bytes] | None = None


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


class Supervisor:
    """Runs *workers* copies of *command* (plus :data:`WORKER_FLAG`) until told to stop.

    :meth:`run` must be called in the main thread (it installs signal handlers)
    and returns the exit status: 0 when every worker drained and exited 0 after
    SIGTERM / SIGINT, :data:`CONFIG_ERROR` when a worker refused its settings,
    1 otherwise (a worker failed to stop, or died too often).
    """

    def __init__(
        self,
        command: Sequence[str],
        workers: int,
        *,
        restart_limit: int = RESTART_LIMIT,
        restart_window: float = RESTART_WINDOW,
        stop_timeout: float = STOP_TIMEOUT,
    ) -> None:
        self.command = list(command)
        self.workers = workers
        self.restart_limit = restart_limit
        self.restart_window = restart_window
        self.stop_timeout = stop_timeout
        self.slots = [Worker(number) for number in range(1, workers + 1)]
        self.restarts: collections.deque[float] = collections.deque()
        """When the restarts of the last ``restart_window`` seconds happened."""
        self.status = 0
        self.stopping = False
        self._kill_at = math.inf
        self._signals: collections.deque[int] = collections.deque()
        self._pipe = -1

    def run(self) -> int:
        # The parent keeps the write end and never writes: the workers see end
        # of file on theirs once it is gone, even after SIGKILL.
        self._pipe, keep = os.pipe()
        waker, wake = socket.socketpair()
        waker.setblocking(False)
        wake.setblocking(False)
        watched = (*FORWARDED, signal.SIGCHLD)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in watched}
        previous_wakeup = signal.set_wakeup_fd(wake.fileno(), warn_on_full_buffer=False)
        try:
            for slot in self.slots:
                self._start(slot)
            while True:
                self._handle_signals()
                for slot in self.slots:
                    self._reap(slot)
                if all(slot.process is None for slot in self.slots):
                    break
                if self.stopping and time.monotonic() >= self._kill_at:
                    self._kill_late()
                # SIGCHLD and the forwarded signals wake this at once.
                select.select([waker], [], [], 1.0)
                with contextlib.suppress(BlockingIOError):
                    while waker.recv(512):
                        pass
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._kill_all()
            for closing in (waker, wake):
                closing.close()
            os.close(self._pipe)
            os.close(keep)
        log.info("agui-hub workers stopped (exit status %d)", self.status)
        return self.status

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signals.append(signum)

    def _handle_signals(self) -> None:
        while self._signals:
            sig = signal.Signals(self._signals.popleft())
            if sig == signal.SIGCHLD:
                continue
            if sig in (signal.SIGTERM, signal.SIGINT) and not self.stopping:
                log.info("%s: stopping the workers (each drains)", sig.name)
                self._stop()
            elif sig == signal.SIGHUP:
                log.info("SIGHUP: passed on to every worker (they re-read credentials)")
            self._send(sig)

    def _send(self, sig: signal.Signals) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.process.send_signal(sig)

    def _stop(self, status: int | None = None) -> None:
        if status is not None:
            self.status = max(self.status, status)
        if not self.stopping:
            self.stopping = True
            self._kill_at = time.monotonic() + self.stop_timeout

    def _start(self, slot: Worker) -> None:
        if self.stopping:
            return
        argv = [*self.command, WORKER_FLAG, str(self._pipe)]
        # Held until the worker's gateway handles them: SIGHUP's default action
        # would kill a worker still starting, SIGTERM's would skip its drain.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        try:
            slot.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=(self._pipe,))
        except OSError as exc:
            log.error("cannot start worker %d: %s; stopping the others", slot.number, exc)
            self._stop(1)
            self._send(signal.SIGTERM)
            return
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        log.info("worker %d of %d started: pid %d", slot.number, self.workers, slot.process.pid)

    def _reap(self, slot: Worker) -> None:
        process = slot.process
        if process is None or (code := process.poll()) is None:
            return
        slot.process = None
        how = describe_exit(code)
        if self.stopping:
            if code == 0:
                log.info("worker %d (pid %d) stopped", slot.number, process.pid)
            else:
                log.warning("worker %d (pid %d) %s", slot.number, process.pid, how)
                self.status = max(self.status, 1)
            return
        if code == CONFIG_ERROR:
            log.error(
                "worker %d (pid %d) %s: its settings cannot be served (its message is "
                "above); stopping the others",
                slot.number,
                process.pid,
                how,
            )
            self._stop(CONFIG_ERROR)
            self._send(signal.SIGTERM)
            return
        now = time.monotonic()
        while self.restarts and now - self.restarts[0] > self.restart_window:
            self.restarts.popleft()
        if len(self.restarts) >= self.restart_limit:
            log.error(
                "worker %d (pid %d) %s, after %d restarts in %.0f s: stopping every worker",
                slot.number,
                process.pid,
                how,
                len(self.restarts),
                self.restart_window,
            )
            self._stop(1)
            self._send(signal.SIGTERM)
            return
        self.restarts.append(now)
        log.warning(
            "worker %d (pid %d) %s: restarting it (restart %d of at most %d in %.0f s)",
            slot.number,
            process.pid,
            how,
            len(self.restarts),
            self.restart_limit,
            self.restart_window,
        )
        self._start(slot)

    def _kill_late(self) -> None:
        late = [slot for slot in self.slots if slot.process is not None]
        for slot in late:
            assert slot.process is not None
            log.warning(
                "worker %d (pid %d) did not stop within %g s: killing it",
                slot.number,
                slot.process.pid,
                self.stop_timeout,
            )
            with contextlib.suppress(ProcessLookupError):
                slot.process.kill()
        if late:
            self.status = max(self.status, 1)
        self._kill_at = math.inf  # the kill is reaped as any exit

    def _kill_all(self) -> None:
        """Never leave a worker behind, whatever ended :meth:`run`."""
        for slot in self.slots:
            process = slot.process
            if process is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
            slot.process = None
