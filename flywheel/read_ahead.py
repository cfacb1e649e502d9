"""Read the next batch of a file while the database loads the current one.

The ingest reads and validates a batch (Parquet decoding, Arrow checks: C++ that releases the GIL) and then hands
it to the database (DuckDB's and psycopg's calls release the GIL too), so on two cores the two steps can overlap.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

__all__ = ["read_ahead"]

T = TypeVar("T")


def read_ahead(items: Iterator[T]) -> Iterator[T]:
    """Yield ``items`` in order, producing item k+1 in a background thread while the caller works on item k.

    Exactly one item ahead (memory: one extra batch). An exception raised while producing item k+1 is raised
    here when the caller asks for item k+1, so the caller sees the same items and the same error, in the same
    order, as when iterating ``items`` directly. When the caller stops early (an error in its own work, or
    ``close()``), the thread finishes the item it is producing, if any, and ends; ``items`` is then closed.
    """
    requests: queue.Queue[bool] = queue.Queue()
    results: queue.Queue[tuple[str, object]] = queue.Queue()

    def produce() -> None:
        while requests.get():
            try:
                item = next(items)
            except StopIteration:
                results.put(("done", None))
                return
            except BaseException as err:  # noqa: BLE001 (handed to the caller, raised there)
                results.put(("error", err))
                return
            results.put(("item", item))

    worker = threading.Thread(target=produce, name="flywheel-read-ahead", daemon=True)
    worker.start()
    requests.put(True)
    try:
        while True:
            kind, value = results.get()
            if kind == "done":
                return
            if kind == "error":
                raise value  # type: ignore[misc]
            requests.put(True)  # start on the next item while the caller works on this one
            yield value  # type: ignore[misc]
    finally:
        requests.put(False)
        worker.join()
        close = getattr(items, "close", None)
        if close is not None:
            close()
