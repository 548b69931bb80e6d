"""The Redis store's calls: the callers' deadlines, one timer at a time."""

from __future__ import annotations

import asyncio

import pytest

from agui_hub.store.redis.calls import Deadlines

pytestmark = pytest.mark.timeout(30)


async def test_deadlines_fail_what_is_not_done_in_time_with_one_timer_at_a_time() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(0.2, lambda: TimeoutError("late"))
    timers = 0
    call_at = loop.call_at

    def counted(*args: object) -> asyncio.TimerHandle:
        nonlocal timers
        timers += 1
        return call_at(*args)  # type: ignore[arg-type]

    loop.call_at = counted  # type: ignore[method-assign]
    try:
        late = [loop.create_future() for _ in range(500)]
        answered = loop.create_future()
        started = loop.time()
        for future in [answered, *late]:
            deadlines.add(future)
        answered.set_result("on time")
        results = await asyncio.gather(*late, return_exceptions=True)
    finally:
        loop.call_at = call_at  # type: ignore[method-assign]
    took = loop.time() - started
    assert all(isinstance(r, TimeoutError) and str(r) == "late" for r in results)
    assert answered.result() == "on time"  # done in time: left alone
    assert 0.2 <= took < 0.2 + Deadlines.GRAIN + 0.2
    assert timers <= 2


async def test_deadlines_hold_only_what_is_in_flight() -> None:
    """Futures done in time leave as soon as they are at the front: memory holds
    the calls in flight, not every call of the last timeout seconds."""
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(60, lambda: TimeoutError("late"))
    for _ in range(1000):
        future = loop.create_future()
        deadlines.add(future)
        future.set_result(None)
    deadlines.add(loop.create_future())
    assert len(deadlines._waiting) == 1
