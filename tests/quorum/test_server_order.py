"""quorum.server.InOrder: a connection's answers in request order, written by whoever completes the line."""
from __future__ import annotations

import asyncio

from quorum.server import InOrder
from tests.support.loop import passes


class Writer:
    """What InOrder uses of an asyncio.StreamWriter; ``drain`` waits while ``full`` is set."""

    def __init__(self):
        self.written: list[bytes] = []
        self.closed = False
        self.room = asyncio.Event()
        self.room.set()

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    async def drain(self) -> None:
        await self.room.wait()


def on_a_line(check) -> None:
    """Run ``check(writer, line)`` in a new event loop, ``line`` an InOrder over a new ``Writer``."""
    async def main():
        w = Writer()
        await check(w, InOrder(w))
    asyncio.run(main())


async def answer_when(event: asyncio.Event, data: bytes) -> bytes:
    """A request's answer, ``data``, once ``event`` is set."""
    await event.wait()
    return data


def test_answers_finishing_out_of_order_are_written_in_request_order_as_soon_as_the_line_allows():
    async def check(w: Writer, line: InOrder):
        first, second = asyncio.Event(), asyncio.Event()

        line.put_task(answer_when(first, b"1"))
        line.put(b"2")  # ready at once, but behind 1
        line.put_task(answer_when(second, b"3"))
        second.set()
        await passes()
        assert w.written == []  # 3 done, 1 not: nothing may pass 1
        first.set()
        await passes()
        assert w.written == [b"1", b"2", b"3"]
        line.put(b"4")  # an empty line: written at once
        assert w.written[-1] == b"4"
        await line.finish()

    on_a_line(check)


def test_the_finishing_task_writes_its_own_answer_without_another_pass_of_the_loop():
    async def check(w: Writer, line: InOrder):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        marks = []
        line.put_task(fut)
        await asyncio.sleep(0)  # the task now waits on fut
        loop.call_soon(fut.set_result, b"a")
        loop.call_soon(lambda: loop.call_soon(lambda: marks.append(list(w.written))))
        await passes()
        assert marks == [[b"a"]]  # written in the pass the task resumed in, before the next one
        await line.finish()

    on_a_line(check)


def test_room_waits_while_the_client_does_not_take_its_answers_and_finish_waits_for_every_answer():
    async def check(w: Writer, line: InOrder):
        w.room.clear()
        waiting = asyncio.ensure_future(line.room())
        await passes()
        assert not waiting.done()
        w.room.set()
        await asyncio.wait_for(waiting, 1)
        slow = asyncio.Event()

        async def answer():
            await slow.wait()
            return b"late"

        line.put_task(answer())
        finishing = asyncio.ensure_future(line.finish())
        await passes()
        assert not finishing.done()
        slow.set()
        await asyncio.wait_for(finishing, 1)
        assert w.written == [b"late"]

    on_a_line(check)


def test_a_handler_that_fails_without_an_answer_closes_the_connection_instead_of_stalling_it():
    async def check(w: Writer, line: InOrder):
        async def broken():
            raise RuntimeError("bug")

        line.put_task(broken())
        line.put(b"after")
        await line.finish()
        assert w.closed and w.written == []

    on_a_line(check)


def test_an_answer_filled_before_its_task_ends_keeps_its_place_in_line_and_is_written_once():
    async def check(w: Writer, line: InOrder):
        first, second = asyncio.Event(), asyncio.Event()

        line.put_task(answer_when(first, b"1"))
        slot = line.slot()
        line.put_task(answer_when(second, b"2 from the task"), slot)
        line.fill(slot, b"2")  # known before its task ends (the leader's tick: QuorumServer._answer)
        assert w.written == []  # behind 1
        first.set()
        await passes()
        assert w.written == [b"1", b"2"]
        line.fill(slot, b"2 again")
        second.set()
        await line.finish()
        assert w.written == [b"1", b"2"]  # neither a second fill nor the task's own answer is written
        third = line.slot()
        line.fill(third, b"3")  # first in line: written at once
        assert w.written[-1] == b"3"

    on_a_line(check)
