"""Handlers a cancel cut, kept until they end (agent/cuthandlers.py)."""

from __future__ import annotations

import asyncio
from uuid import uuid4

from vox_mqtt.agent.cuthandlers import CutHandlers


async def test_a_cut_handler_that_runs_on_is_kept_until_it_ends() -> None:
    cut, request_id, gate = CutHandlers(), uuid4(), asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await gate.wait()  # it runs on past its cancel

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)  # it runs up to its sleep
    task.cancel()
    cut.watch(request_id, (task, None))
    assert request_id in cut
    assert not await cut.ended(request_id, 0.05)
    gate.set()
    assert await cut.ended(request_id, 5.0)
    await asyncio.sleep(0)  # the done callback runs
    assert request_id not in cut


async def test_tasks_already_ended_are_not_kept() -> None:
    cut, request_id = CutHandlers(), uuid4()
    task = asyncio.create_task(asyncio.sleep(0))
    await task
    cut.watch(request_id, (task, None))
    assert request_id not in cut
    assert await cut.ended(request_id, 0.0)


async def test_a_canceled_answer_waits_until_every_cut_task_ended() -> None:
    cut, request_id, gate = CutHandlers(), uuid4(), asyncio.Event()
    sent: list[str] = []

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await gate.wait()

    tasks = [asyncio.create_task(stubborn()) for _ in range(2)]
    await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    cut.watch(request_id, tasks)
    cut.then(request_id, lambda: sent.append("CANCELED"))
    await asyncio.sleep(0.05)
    assert sent == []  # the handlers run on: no answer yet
    gate.set()
    await asyncio.gather(*tasks)
    await asyncio.sleep(0)  # the done callbacks run
    assert sent == ["CANCELED"]  # once, after both ended


async def test_an_answer_with_no_cut_task_goes_at_once() -> None:
    sent: list[str] = []
    CutHandlers().then(uuid4(), lambda: sent.append("CANCELED"))
    assert sent == ["CANCELED"]
