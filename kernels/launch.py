"""Launches at the host's floor: a launcher's checks, constexprs and grid computed once per plan, and the kernel's
later calls sent straight to Triton's compiled kernel.

``kernel[grid](*args, **meta)`` binds every argument, computes the specialization key and looks the compiled
kernel up on each call; the project's launchers add their own checks, constexpr dicts, grids and descriptors. On a
GPU machine's CPU that was 58-195 us of host time a call, more than the GPU work of a decode-sized product. Here a
launcher keys a :class:`Plan` by everything the call's specialization depends on (shapes, strides, dtypes, the
16-byte alignment of each pointer, the knobs); a plan's first call goes through ``kernel[grid]`` (compiling if
need be) and keeps the compiled kernel's runner, and every later call is that runner with the tensors of the call.

The runner takes the kernel's arguments in signature order, constexprs included (Triton >= 3.3); an older launcher
that takes only the runtime arguments is detected by its argument count (it raises TypeError) and served so.
Under the Triton interpreter there is no compiled kernel: every call goes through ``kernel[grid]``.

Imports torch and triton only (no project code), so the kernels stay standalone.
"""

from __future__ import annotations

import inspect
import os
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

#: Plans a launcher keeps (least recently used dropped first): shapes x configs x operand sets of one process.
MAX_PLANS = 512
#: Descriptor sets a plan keeps (:class:`Descriptors`): operand sets of one shape and config.
MAX_DESCRIPTORS = 64
#: ``KERNELS_SLOW_LAUNCH=1`` sends every call through ``kernel[grid]`` (to compare, or to rule the cache out).
SLOW = os.environ.get("KERNELS_SLOW_LAUNCH", "0") == "1"


def aligned(*tensors: Any) -> tuple[bool, ...]:
    """Whether each tensor's data pointer is 16-byte aligned (Triton specializes pointers on it); None is True."""
    return tuple(t is None or t.data_ptr() % 16 == 0 for t in tensors)


def layout_key(*tensors: Any) -> tuple[Any, ...]:
    """What a call's specialization reads of each tensor: shape, strides, dtype and :func:`aligned`; None stays
    None. With the device and the knobs it keys a launcher's :class:`PlanCache`."""
    return tuple(
        None if t is None else (t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0) for t in tensors
    )


_SM_COUNTS: dict[Any, int] = {}


def sm_count(device: Any) -> int:
    """The multiprocessor count of a CUDA device (asked of the driver once per device index)."""
    index = device.index
    count = _SM_COUNTS.get(index)
    if count is None:
        import torch

        count = _SM_COUNTS[index] = torch.cuda.get_device_properties(device).multi_processor_count
    return count


class Descriptors:
    """A plan's host-side tensor descriptors, keyed by the data pointers of the tensors they wrap (the plan fixes
    their shapes, strides and dtypes); at most ``maxsize`` sets, the oldest dropped first. A set holds its
    tensors, so their memory stays allocated while the set is kept."""

    __slots__ = ("_sets", "maxsize")

    def __init__(self, maxsize: int = MAX_DESCRIPTORS) -> None:
        self.maxsize = maxsize
        self._sets: dict[tuple[int, ...], Any] = {}

    def get(self, pointers: tuple[int, ...], build: Callable[..., Any], *args: Any) -> Any:
        """The set of these pointers, ``build(*args)`` when there is none yet."""
        found = self._sets.get(pointers)
        if found is None:
            found = self._sets[pointers] = build(*args)
            if len(self._sets) > self.maxsize:
                del self._sets[next(iter(self._sets))]
        return found

    def __len__(self) -> int:
        return len(self._sets)


class Plan:
    """One launch configuration of one kernel: grid, constexprs and launch options, and once compiled its runner."""

    __slots__ = ("consts", "grid", "kernel", "meta", "proven", "runner", "state", "values")

    def __init__(self, kernel: Any, grid: Sequence[int], meta: dict[str, Any], **state: Any) -> None:
        self.kernel = kernel
        self.grid = tuple(grid)
        self.meta = meta
        self.state = state  # whatever else the launcher computed once (scratch, strides, descriptor boxes)
        self.runner: Callable[..., Any] | None = None
        self.consts: tuple[Any, ...] = ()
        self.values = True  # the runner takes the constexprs too (Triton >= 3.3)
        self.proven = False  # the runner has taken a call

    def launch(self, *args: Any) -> None:
        """One launch with these runtime arguments (in the kernel's signature order, before the constexprs)."""
        runner = self.runner
        if runner is None:
            compiled = self.kernel[self.grid](*args, **self.meta)
            if not SLOW:
                self._keep(compiled, len(args))
            return
        if self.values:
            try:
                runner(*args, *self.consts)
                self.proven = True
                return
            except TypeError:  # raised by the runner's argument parsing, before any launch
                if self.proven:
                    raise
                self.values = False  # an older launcher: runtime arguments only
        runner(*args)
        self.proven = True

    def _keep(self, compiled: Any, n_args: int) -> None:
        """Keep the compiled kernel's runner and the constexpr values that follow the runtime arguments."""
        if compiled is None or not hasattr(compiled, "__getitem__") or not hasattr(self.kernel, "arg_names"):
            return  # the interpreter: no compiled kernel
        names = list(self.kernel.arg_names)[n_args:]
        params = inspect.signature(self.kernel.fn).parameters
        values = [self.meta[name] if name in self.meta else params[name].default for name in names]
        if any(v is inspect.Parameter.empty for v in values):
            return  # a parameter with neither a value nor a default: leave it to Triton's path
        self.consts = tuple(values)
        self.runner = compiled[(*self.grid, 1, 1)[:3]]  # the compiled runner reads all three grid dimensions


class PlanCache:
    """A launcher's plans, keyed by what its call's specialization depends on; the least recently used dropped."""

    def __init__(self, maxsize: int = MAX_PLANS) -> None:
        self.maxsize = maxsize
        self._plans: OrderedDict[Hashable, Plan] = OrderedDict()

    def get(self, key: Hashable) -> Plan | None:
        """The plan of ``key``; None when there is none or the key is unhashable (a knob's value: no plan kept)."""
        try:
            plan = self._plans.get(key)
        except TypeError:
            return None
        if plan is not None:
            self._plans.move_to_end(key)
        return plan

    def put(self, key: Hashable, plan: Plan) -> Plan:
        """Keep ``plan`` under ``key`` (not when the key is unhashable) and return it."""
        try:
            self._plans[key] = plan
        except TypeError:
            return plan
        if len(self._plans) > self.maxsize:
            self._plans.popitem(last=False)
        return plan

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        self._plans.clear()
