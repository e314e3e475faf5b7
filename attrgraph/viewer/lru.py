"""A bounded, thread-safe cache of computed answers: the model panels' graphs, views and answers.

`get(key, compute)` returns the kept answer for `key`, or runs `compute()` outside the lock and
keeps its result; at most `size` answers are kept, the least recently used dropped first. Two
threads missing one key at once may both compute it (the answers are equal; the later is kept):
a compute that must run once per key needs its own lock (model_hub.ModelHub's loads,
server.Viewer's payload builds)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


class LruCache:
    def __init__(self, size: int):
        self.size = size
        self.lock = threading.Lock()
        self.items: OrderedDict = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = compute()
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value
