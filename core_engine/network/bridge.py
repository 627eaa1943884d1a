"""Carry engine events from blocking request handles onto the asyncio event loop."""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Iterable, Sequence

from core_engine.serving import RequestHandle, TokenEvent
from core_engine.task import GenerationResult

Event = TokenEvent | GenerationResult


class HandleEvents:
    """The events of several request handles, merged in arrival order as `(index, event)`.

    Each handle pushes its events onto the event loop from the engine's thread (no thread per
    handle); each ends with its final result, which the engine always delivers (cancellation
    and engine stop included).
    """

    def __init__(self, handles: Sequence[RequestHandle]) -> None:
        self._handles = list(handles)
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self._replay: deque[tuple[int, Event]] = deque()
        self._finished: set[int] = set()
        for index, handle in enumerate(self._handles):
            handle.subscribe(functools.partial(self._push, index, handle))

    def _push(self, index: int, handle: RequestHandle, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (index, event))
        except RuntimeError:  # the event loop is closed: nobody listens any more
            handle.cancel()

    async def _receive(self) -> tuple[int, Event]:
        return self._note(await self._queue.get())

    def _note(self, item: tuple[int, Event]) -> tuple[int, Event]:
        if isinstance(item[1], GenerationResult):
            self._finished.add(item[0])
        return item

    def __aiter__(self) -> HandleEvents:
        return self

    async def __anext__(self) -> tuple[int, Event]:
        if self._replay:
            return self._replay.popleft()
        if len(self._finished) == len(self._handles):
            raise StopAsyncIteration
        return await self._receive()

    async def next_batch(self) -> list[tuple[int, Event]]:
        """The events that have arrived (waiting for one if none has), in order; empty once
        every handle's result has been read."""
        try:
            batch = [await self.__anext__()]
        except StopAsyncIteration:
            return []
        batch += self._replay
        self._replay.clear()
        while not self._queue.empty():
            batch.append(self._note(self._queue.get_nowait()))
        return batch

    async def first_events(self, indices: Iterable[int]) -> dict[int, Event]:
        """Wait for the first event of each given handle; every event read on the way is
        replayed by the iteration."""
        wanted = set(indices)
        first: dict[int, Event] = {}
        for index, event in self._replay:
            first.setdefault(index, event)
        while not wanted <= first.keys():
            index, event = await self._receive()
            self._replay.append((index, event))
            first.setdefault(index, event)
        return {i: first[i] for i in wanted}

    async def results(self) -> list[GenerationResult]:
        """Every handle's final result, in handle order."""
        results: dict[int, GenerationResult] = {}
        async for index, event in self:
            if isinstance(event, GenerationResult):
                results[index] = event
        return [results[i] for i in range(len(self._handles))]

    def cancel(self) -> None:
        """Cancel every handle whose result has not arrived yet."""
        for index, handle in enumerate(self._handles):
            if index not in self._finished:
                handle.cancel()
