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
here it is written under a name no consumer reads and renamed into place. Files are written
for this user alone (0600). A consumer takes a message by renaming it; a file in the queue that
is no message is moved aside to ``bad/`` beside the queue's folder, and logged.
"""

import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from queue import Empty
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.transport.filesystem import LOCK_EX, exchange_queue_t, lock, unlock
from kombu.utils.json import dumps, loads

from db.session import private_dir, private_file

Table = list[exchange_queue_t]
log = logging.getLogger(__name__)


class Channel(filesystem.Channel):
    """Binds and unbinds under one lock per exchange, puts whole message files, and takes
    them one consumer each, a file that is no message set aside; table reads stay kombu's."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # kombu's name shape: consumers take the first name in sorted order and match on
        # ".<queue>.msg". kombu's stamp, monotonic milliseconds, sorts as text: one more digit
        # (10**7 ms: 2.8 h after boot) put newer messages first, as did a reboot (restarting
        # the count). Wall-clock nanoseconds of fixed width sort in submission order.
        name = f"{time.time_ns():020d}_{uuid.uuid4()}.{queue}.msg"
        try:
            _replace(Path(self.data_folder_out) / name, dumps(payload))
        except OSError as exc:
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc

    def _get(self, queue: str) -> dict[str, Any]:
        """The first message of ``queue`` in name order, taken by renaming it out of the
        queue's names. A file that is not a message is moved to the ``bad`` folder beside the
        queue's folder and logged, and the next one is taken (kombu's error stopped the
        worker, at its start when the file was waiting). kombu's ``store_processed`` is not
        read."""
        folder = Path(self.data_folder_in)
        for name in sorted(os.listdir(folder)):
            if name.partition(".")[2] != f"{queue}.msg":
                continue
            taken = folder / f".{name}.{uuid.uuid4().hex}.taken"  # a name no consumer reads
            try:
                os.rename(folder / name, taken)
            except FileNotFoundError:  # another consumer took it first
                continue
            try:
                payload = _message(taken.read_bytes())
            except OSError as exc:
                raise ChannelError(f"Cannot read file {name!r} from queue.") from exc
            if payload is None:
                bad = private_dir(folder.with_name("bad"))
                os.replace(taken, bad / name)
                log.warning(
                    "%s in the embedded broker's queue is not a message: moved to %s", name, bad
                )
                continue
            taken.unlink()
            return payload
        raise Empty()

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        entry = exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._update_table(exchange, lambda table: table if entry in table else [entry, *table])

    def _delete(self, queue: str, exchange: str, routing_key: str, pattern: str, *args, **kw):
        virtual.Channel._delete(self, queue, exchange, routing_key, pattern, *args, **kw)
        entry = exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self._update_table(exchange, lambda table: [q for q in table if q != entry])

    def _update_table(self, exchange: str, change: Callable[[Table], Table]) -> None:
        file = self._exchange_file(exchange)
        guard_file = private_file(private_dir(self.control_folder) / f"{file.name}.lock")
        with open(guard_file, "ab") as guard:
            lock(guard, LOCK_EX)
            try:
                table = self.get_table(exchange)
                changed = change(table)
                if changed != table:
                    _replace(file, dumps(changed))
            finally:
                unlock(guard)


def _message(data: bytes) -> dict[str, Any] | None:
    """The message a file holds (what kombu's `virtual.Message` reads), None for anything
    else."""
    try:
        payload = loads(data)
    except Exception:  # not UTF-8, not JSON, or a value kombu's decoders refuse
        return None
    properties = payload.get("properties") if isinstance(payload, dict) else None
    return payload if isinstance(properties, dict) and "delivery_tag" in properties else None


def _replace(file: Path, text: str) -> None:
    """Write ``file`` whole, for this user alone (0600), under a temporary name, then rename
    it into place."""
    temporary = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(descriptor, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(temporary, file)


class Transport(filesystem.Transport):
    Channel = Channel
