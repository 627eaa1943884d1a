"""The embedded broker's transport: kombu's filesystem transport with exchange tables that
processes starting together update safely, and message files that appear whole.

kombu (5.7) creates an exchange's table file with ``open("wb")`` before it locks it, and binds
into an existing one in place. Two workers starting at once (``rlwb up`` starts two, both bound
to the ``celery.pidbox`` broadcast exchange) each wrote a one-entry table, so one worker no
longer heard broadcasts (``celery inspect``, the Queue tab, revokes), or one read the other's
still-empty file and failed to start. Here every change of a table is a read-modify-write under
an exclusive lock on a side file, written whole and renamed into place, so a reader sees the
old table or the new one, never a partial one, and no binding is lost. Likewise kombu wrote a
message file in place, where a consumer polling the folder could take it before it was written;
here it is written under a name no consumer reads and renamed into place.
"""

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.transport.filesystem import LOCK_EX, exchange_queue_t, lock, unlock
from kombu.utils.json import dumps

Table = list[exchange_queue_t]


class Channel(filesystem.Channel):
    """Binds and unbinds under one lock per exchange, and puts whole message files; reads
    stay kombu's."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # kombu's name: consumers take the oldest first and match on ".<queue>.msg"
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        try:
            _replace(Path(self.data_folder_out) / name, dumps(payload))
        except OSError as exc:
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        entry = exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._update_table(exchange, lambda table: table if entry in table else [entry, *table])

    def _delete(self, queue: str, exchange: str, routing_key: str, pattern: str, *args, **kw):
        virtual.Channel._delete(self, queue, exchange, routing_key, pattern, *args, **kw)
        entry = exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._update_table(exchange, lambda table: [q for q in table if q != entry])

    def _update_table(self, exchange: str, change: Callable[[Table], Table]) -> None:
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(parents=True, exist_ok=True)
        with open(file.with_name(f"{file.name}.lock"), "ab") as guard:
            lock(guard, LOCK_EX)
            try:
                table = self.get_table(exchange)
                changed = change(table)
                if changed != table:
                    _replace(file, dumps(changed))
            finally:
                unlock(guard)


def _replace(file: Path, text: str) -> None:
    """Write ``file`` whole under a temporary name, then rename it into place."""
    temporary = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, file)


class Transport(filesystem.Transport):
    Channel = Channel
