"""The attribute fall-through both dataset wrappers share (map-style and iterable).

Why: code that reads ``loader.dataset.classes``, or a ``worker_init_fn`` that
shards through ``get_worker_info().dataset``, must keep seeing the user's
dataset behind dsim's wrapper. Attributes named ``_dsim_*`` are the
wrapper's own; every other name is read from and written to the wrapped
dataset (``.wrapped``). Dunder names are not forwarded, so pickling and
``torch`` see the wrapper for what it is.
"""

from __future__ import annotations

from typing import Any


class DatasetProxy:
    """Forwards attribute access to ``self._dsim_dataset``; keeps ``_dsim_*`` names local."""

    _dsim_dataset: Any

    @property
    def wrapped(self) -> Any:
        return self._dsim_dataset

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("__", "_dsim_")):
            raise AttributeError(name)
        return getattr(self._dsim_dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_dsim_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._dsim_dataset, name, value)

    def __len__(self) -> int:
        return len(self._dsim_dataset)
