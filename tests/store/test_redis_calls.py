"""The Redis store's calls: deadlines shared by one timer per grain."""

from __future__ import annotations

import asyncio

import pytest

from agui_hub.store.redis.calls import Deadlines

pytestmark = pytest.mark.timeout(30)


async def test_deadlines_fail_what_is_not_done_in_time_with_one_timer_per_grain() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
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
        for future in [*late, answered]:
            deadlines.add(future, 0.2, lambda: TimeoutError("late"))
        answered.set_result("on time")
        results = await asyncio.gather(*late, return_exceptions=True)
    finally:
        loop.call_at = call_at  # type: ignore[method-assign]
    took = loop.time() - started
    assert all(isinstance(r, TimeoutError) and str(r) == "late" for r in results)
    assert answered.result() == "on time"  # done in time: left alone
    assert 0.2 <= took < 0.2 + Deadlines.GRAIN + 0.2
    assert timers <= 2  # one per grain the 501 deadlines fell in
