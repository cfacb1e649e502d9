"""Read the next batch of events while the database loads the current one.

The ingest reads and validates a batch (Parquet decoding, Arrow checks: C++ that releases the GIL) and then hands
it to the database (DuckDB's and psycopg's calls release the GIL too), so on two cores the two steps can overlap.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["ReadAhead"]

logger = logging.getLogger("flywheel.read_ahead")

T = TypeVar("T")


class ReadAhead(Generic[T]):
    """The items of ``make()`` in order, each produced in a background thread while the caller works on the one
    before: exactly one item ahead (memory: one extra batch).

    ``make`` itself runs in the thread too (opening a file happens there). An exception raised by ``make`` or
    while producing item k is raised by ``next()`` when the caller asks for item k, so the caller sees the same
    items and the same error, in the same order, as when iterating ``make()`` directly. ``on_done`` (optional)
    is called in the thread once every item is produced (e.g. to start reading the next file); its error is
    logged (the caller has every item by then), not raised.

    :meth:`close` (or leaving a ``with`` block) stops it: the thread finishes the item it is producing, if any,
    and ends; the iterator ``make()`` returned is closed. Iterating to the end or to an error also closes it.
    """

    def __init__(self, make: Callable[[], Iterator[T]], on_done: Callable[[], object] | None = None):
        self._requests: queue.Queue[bool] = queue.Queue()
        self._results: queue.Queue[tuple[str, object]] = queue.Queue()
        self._stop = threading.Event()
        self._items: Iterator[T] | None = None
        self._finished = False
        self._worker = threading.Thread(target=self._produce, args=(make, on_done), name="read-ahead", daemon=True)
        self._worker.start()
        self._requests.put(True)

    def _produce(self, make: Callable[[], Iterator[T]], on_done: Callable[[], object] | None) -> None:
        try:
            self._items = iter(make())
            while self._requests.get() and not self._stop.is_set():
                try:
                    item = next(self._items)
                except StopIteration:
                    self._results.put(("done", None))
                    if on_done is not None:
                        try:
                            on_done()
                        except Exception:  # the caller already has every item; say so rather than lose it
                            logger.exception("read-ahead: on_done failed after the last item")
                    return
                self._results.put(("item", item))
        except BaseException as err:  # noqa: BLE001 (handed to the caller, raised by next())
            self._results.put(("error", err))

    def __iter__(self) -> ReadAhead[T]:
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        kind, value = self._results.get()
        if kind == "item":
            self._requests.put(True)  # start on the next item while the caller works on this one
            return value  # type: ignore[return-value]
        self.close()
        if kind == "error":
            raise value  # type: ignore[misc]
        raise StopIteration

    def close(self) -> None:
        """Stop reading ahead and wait for the thread (at most the item it is producing); idempotent."""
        self._finished = True
        self._stop.set()
        self._requests.put(False)
        self._worker.join()
        close = getattr(self._items, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> ReadAhead[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
