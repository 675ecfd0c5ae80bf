"""The LoRA adapters loaded on one base model, applied per row inside one forward.

Every linear layer an adapter targets keeps its own weights and call, and adds the low-rank product
of the adapter its row selected: the loaded adapters' matrices are stacked per layer ([slots, in,
rank] and [slots, rank, out], slot 0 all zeros for rows without one, smaller ranks padded with
zeros), and `mx.gather_mm` multiplies each row by its own slot's matrices. So rows with different
adapters, and rows with none, share one forward: no weights are merged and no batch is split per
adapter. A forward with no adapter rows costs nothing extra.

Who runs a forward says which rows use which adapter (`selected`): the batch's decode step from its
rows, the admission from the prompts it reads, a decision request for all of its own rows. Outside
`selected` every layer is the base model's.

At most `capacity` adapters stay loaded; one no row uses is unloaded, least recently used first, when
another needs its slot.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from swama.engine.adapters.formats import AdapterFormatError, AdapterWeights, read_adapter
from swama.engine.errors import LoadFailed, Unavailable, without_folders

_ADAPTED: dict[type, type] = {}  # a linear layer's class: its subclass that adds the selected adapter


def _adapted_class(cls: type) -> type:
    """`cls` with a call that adds the selected rows' low-rank products; its parameters are untouched."""
    if cls not in _ADAPTED:
        def __call__(self: Any, x: Any) -> Any:
            y = cls.__call__(self, x)
            bank: AdapterBank = self._swama_bank
            return bank.add(self._swama_key, x, y)

        _ADAPTED[cls] = type(f"Adapted{cls.__name__}", (cls,), {"__call__": __call__, "_swama_adapted": True})
    return _ADAPTED[cls]


class AdapterBank:
    def __init__(self, net: Any, capacity: int) -> None:
        import mlx.nn as nn

        self.net = net
        self.capacity = capacity
        self._modules = {name: m for name, m in net.named_modules() if isinstance(m, nn.Linear | nn.QuantizedLinear)}
        self._loaded: OrderedDict[str, AdapterWeights] = OrderedDict()  # least recently used first
        self._slot: dict[str, int] = {}  # adapter id: its slot (1..capacity)
        self._users: dict[str, int] = {}  # adapter id: rows (or requests) using it now
        self._stacks: dict[str, tuple[Any, Any]] = {}  # module: (a [slots, in, r], b [slots, r, out])
        self.selection: Any = None  # None, a slot for every row, or an array of one slot per row
        self._lock = threading.Lock()

    # -- loading ----------------------------------------------------------------------------------

    def acquire(self, adapter_id: str, folder: Path) -> int:
        """`adapter_id`'s slot, loaded first when it is not (unloading an unused one when all slots are
        taken); 503 when every slot is in use by running rows. Release it with `release`."""
        with self._lock:
            if adapter_id not in self._loaded:
                try:
                    adapter = read_adapter(folder)
                except (AdapterFormatError, OSError, KeyError, ValueError) as exc:
                    raise LoadFailed(f"Adapter '{adapter_id}' could not be loaded: {without_folders(str(exc))}. Its files may be "
                                     f"damaged; install it again (swama rm {adapter_id}, then swama create "
                                     "ADAPTER_DIR --base MODEL).") from None
                self._load(adapter_id, adapter)
            self._loaded.move_to_end(adapter_id)
            self._users[adapter_id] = self._users.get(adapter_id, 0) + 1
            return self._slot[adapter_id]

    def release(self, adapter_id: str) -> None:
        with self._lock:
            if self._users.get(adapter_id, 0) > 0:
                self._users[adapter_id] -= 1

    def loaded(self) -> list[str]:
        return list(self._loaded)

    def _load(self, adapter_id: str, adapter: AdapterWeights) -> None:
        import mlx.core as mx

        missing = [n for n in adapter.modules if n not in self._modules]
        if missing:
            raise Unavailable(f"Adapter '{adapter_id}' targets {missing[0]}, which this model does not have as a "
                              "linear layer.", code="adapter_mismatch")
        if len(self._loaded) >= self.capacity:
            idle = [k for k in self._loaded if not self._users.get(k)]
            if not idle:
                raise Unavailable(f"All {self.capacity} adapter slots of this model are in use by running requests "
                                  f"(--max-adapters); retry adapter '{adapter_id}' when one finishes.",
                                  code="adapters_busy")
            self._unload(idle[0])
        free = sorted(set(range(1, self.capacity + 1)) - set(self._slot.values()))
        dtype = self._dtype()
        adapter.modules = {n: (a.astype(dtype), b.astype(dtype)) for n, (a, b) in adapter.modules.items()}
        mx.eval([w for pair in adapter.modules.values() for w in pair])
        self._loaded[adapter_id] = adapter
        self._slot[adapter_id] = free[0]
        self._restack()

    def _unload(self, adapter_id: str) -> None:
        self._loaded.pop(adapter_id, None)
        self._slot.pop(adapter_id, None)
        self._users.pop(adapter_id, None)
        self._restack()

    def _dtype(self) -> Any:
        import mlx.core as mx

        for m in self._modules.values():
            scales = getattr(m, "scales", None)
            return scales.dtype if scales is not None else m.weight.dtype
        return mx.float32

    def _restack(self) -> None:
        """Every targeted layer's stacks from the loaded adapters, by slot (rank padded with zeros)."""
        import mlx.core as mx

        rank = max((a.shape[1] for ad in self._loaded.values() for a, _ in ad.modules.values()), default=0)
        names = sorted({n for ad in self._loaded.values() for n in ad.modules})
        stacks = {}
        for name in names:
            first = next(ad.modules[name] for ad in self._loaded.values() if name in ad.modules)
            n_in, n_out, dtype = first[0].shape[0], first[1].shape[1], first[0].dtype
            a_rows = [mx.zeros((n_in, rank), dtype=dtype)] * (self.capacity + 1)
            b_rows = [mx.zeros((rank, n_out), dtype=dtype)] * (self.capacity + 1)
            for adapter_id, ad in self._loaded.items():
                if name in ad.modules:
                    a, b = ad.modules[name]
                    pad = rank - a.shape[1]
                    slot = self._slot[adapter_id]
                    a_rows[slot] = mx.pad(a, [(0, 0), (0, pad)]) if pad else a
                    b_rows[slot] = mx.pad(b, [(0, pad), (0, 0)]) if pad else b
            stacks[name] = (mx.stack(a_rows), mx.stack(b_rows))
            self._patch(name)
        mx.eval([w for pair in stacks.values() for w in pair])
        self._stacks = stacks

    def _patch(self, name: str) -> None:
        module = self._modules[name]
        if not getattr(type(module), "_swama_adapted", False):
            module.__class__ = _adapted_class(type(module))
        module._swama_bank, module._swama_key = self, name  # the newest bank made for the model, if several

    # -- forwards ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def selected(self, slots: int | Sequence[int] | None) -> Iterator[None]:
        """Within: row i of every forward uses slot `slots[i]` (an int: every row; 0 or None: none)."""
        import mlx.core as mx

        selection: Any = slots or None
        if slots is not None and not isinstance(slots, int):
            slots = list(slots)
            if not any(slots):
                selection = None
            elif all(s == slots[0] for s in slots):
                selection = slots[0]
            else:
                selection = mx.array(slots, dtype=mx.uint32)
        previous, self.selection = self.selection, selection
        try:
            yield
        finally:
            self.selection = previous

    def add(self, name: str, x: Any, y: Any) -> Any:
        """A targeted layer's output `y` for input `x`, plus the selected rows' low-rank products."""
        import mlx.core as mx

        selection = self.selection
        stack = self._stacks.get(name) if selection is not None else None
        if stack is None:
            return y
        a, b = stack
        if isinstance(selection, int):  # every row the same adapter, gathered too: with MKL, plain products of
            selection = mx.full((x.shape[0],), selection, dtype=mx.uint32)  # these thin shapes were slower
        h = mx.gather_mm(x.astype(a.dtype), a, rhs_indices=selection)
        return y + mx.gather_mm(h, b, rhs_indices=selection).astype(y.dtype)


def bank_of(model: Any, capacity: int) -> AdapterBank:
    """The adapter bank beside a loaded model (made, and its capacity fixed, on first use)."""
    return model.beside.setdefault(AdapterBank, lambda: AdapterBank(model.model, capacity))


def selected(model: Any, slots: int | Sequence[int] | None) -> contextlib.AbstractContextManager[None]:
    """`AdapterBank.selected` on the model's bank; nothing at all when the model has none."""
    bank = model.beside.get(AdapterBank) if model is not None else None
    if bank is None:
        return contextlib.nullcontext()
    return bank.selected(slots)
