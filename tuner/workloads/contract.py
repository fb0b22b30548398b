"""The workload contract as a reusable pytest suite: :class:`WorkloadContract`, run over one :class:`ContractCase`.

What every measured workload keeps (``tuner/workloads/base.py``, ``template.py``), checked on the CPU under the
Triton interpreter with small shapes: args validated naming the arg; the default space compiles and its seeds pass
``static_check`` on an H200; statically infeasible configs never launch; every precision the interpreter computes
correctly runs OK with all declared metrics and a roofline position, and its exports are usable; a kernel that
writes nothing is ``numerics_fail``; Triton's compile failures become statuses; ``static_check`` needs neither
torch nor triton. The project's ``tests/test_workload_contract.py`` runs it over every registered workload.

A workload of your own reuses it as Optuna's storages reuse ``optuna.testing.pytest_storages``: subclass the suite
in a test module and give it a ``case`` fixture (``workload`` is a registered name or ``"module:Class"``)::

    import pytest
    from tuner.workloads.contract import ContractCase, WorkloadContract

    @pytest.fixture
    def case() -> ContractCase:
        return ContractCase(
            "my_pkg.scale:Scale",
            args={"n": 1000},
            bad_args={"n": 0},  # arg -> a value that must be refused with a ValueError naming the arg
            ok_configs=[{"BLOCK": 256, "num_warps": 4, "precision": "fp32"}],
            infeasible={"BLOCK": 384, "num_warps": 4, "precision": "fp32"},  # static_check refuses it
            seed_args={"n": 1 << 24},  # a real shape for the space's seeds (default: args)
        )

    class TestScaleContract(WorkloadContract):
        pass

A fixture with ``params=[...]`` runs the suite over several cases. pytest is imported by the checks only, so
importing this module costs nothing outside a test run.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.workloads.base import DeviceInfo, TrialContext, TrialStatus, Workload
from tuner.workloads.registry import workload_class

if TYPE_CHECKING:
    import pytest

CPU = DeviceInfo()
H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0), smem_per_block_bytes=232448, sm_count=132)
ROOFLINE_PRECISIONS = {"fp32", "tf32", "bf16", "fp16", "fp8"}

#: Resolves a registered name or ``module:Class`` without importing this module (the static check's subprocess).
_RESOLVE = (
    "import importlib\n"
    "from tuner.workloads.registry import workload_class\n"
    "def resolve(target):\n"
    "    module, _, attr = target.partition(':')\n"
    "    return getattr(importlib.import_module(module), attr) if attr else workload_class(target)\n"
)


@dataclass
class ContractCase:
    """One workload in the contract suite: small CPU args and the configs to try."""

    workload: str  # a registered name, or "module:Class"
    args: dict[str, Any]
    bad_args: dict[str, Any]  # arg -> a value that must be refused, naming the arg
    ok_configs: list[dict[str, Any]]  # one per precision the interpreter computes correctly
    infeasible: dict[str, Any]  # statically infeasible
    seed_args: dict[str, Any] = field(default_factory=dict)  # a real shape for the seeds (default: args)

    def workload_class(self) -> type[Workload]:
        module, _, attr = self.workload.partition(":")
        return getattr(importlib.import_module(module), attr) if attr else workload_class(self.workload)

    def make(self, **args: Any) -> Workload:
        return self.workload_class()(**(args or self.args))


def require_interpreter(kernel: Any = None) -> None:
    """Skip unless Triton kernels run under the interpreter: ``TRITON_INTERPRET=1``, and ``kernel`` (one of the
    workload's ``@triton.jit`` functions, if given) was made under it, not by a triton imported before."""
    import pytest

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1 before triton is imported)")
    if kernel is not None and type(kernel).__name__ != "InterpretedFunction":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: kernels compile, not interpret")


class OutOfResources(Exception):
    """Named like Triton's: the status comes from the exception's name."""


class CompilationError(Exception):
    """Named like Triton's compile error."""


#: What the fake compile failures raise and the status each must become.
COMPILE_FAILURES = (
    (
        OutOfResources("out of resource: shared memory, Required: 262144, Hardware limit: 232448"),
        TrialStatus.OUT_OF_RESOURCES,
    ),
    (CompilationError("at 12:4: invalid block shape"), TrialStatus.COMPILE_ERROR),
)


def _must_not_launch(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("launched a statically infeasible config")


class WorkloadContract:
    """The contract's checks, as pytest test methods over a ``case`` fixture (a :class:`ContractCase`).

    Subclass it as ``Test...`` in a test module that defines ``case``; override :meth:`require_interpreter`
    to name one of the workload's kernels (see :func:`require_interpreter`).
    """

    def require_interpreter(self) -> None:
        require_interpreter()

    def test_args_are_validated_naming_the_arg(self, case: ContractCase) -> None:
        import pytest

        cls = case.workload_class()
        for arg, value in case.bad_args.items():
            with pytest.raises(ValueError, match=arg):
                cls(**{**case.args, arg: value})
        with pytest.raises(TypeError):
            cls(**{**case.args, "no_such_arg": 1})

    def test_default_space_compiles_and_its_seeds_pass_static_check_on_an_h200(
        self, case: ContractCase, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from tuner.study.space import compile_space

        monkeypatch.setenv("TRITON_INTERPRET", "0")  # as on the H200, where kernels compile
        workload = case.make(**case.seed_args)
        space = compile_space(workload.space_document())
        assert space.params and space.seeds, "a kernel workload ships known-good seeds"
        for seed in space.seeds:
            assert space.static_violation(seed, H200.to_dict()) is None, seed
            assert workload.static_check(seed, H200) is None, seed
        assert {m.name for m in workload.metric_specs()} and all(
            m.direction in ("maximize", "minimize") for m in workload.metric_specs()
        )

    def test_static_check_needs_neither_torch_nor_triton(self, case: ContractCase) -> None:
        code = _RESOLVE + (
            "import json, sys\n"
            "from tuner.workloads.base import DeviceInfo\n"
            f"w = resolve({case.workload!r})(**json.loads({json.dumps(case.args)!r}))\n"
            f"config = json.loads({json.dumps(case.ok_configs[0])!r})\n"
            "w.static_check(config, DeviceInfo(kind='cuda', name='NVIDIA H200', compute_capability=(9, 0),"
            " smem_per_block_bytes=232448, sm_count=132))\n"
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "[]"

    def test_statically_infeasible_configs_are_never_launched(
        self, case: ContractCase, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        workload = case.make()
        assert isinstance(workload.static_check(case.infeasible, CPU), str)
        monkeypatch.setattr(workload, "_launch", _must_not_launch)
        result = workload.run(case.infeasible, CPU, TrialContext())
        assert result.status == TrialStatus.INFEASIBLE_STATIC and result.error

    def test_runs_ok_on_the_interpreter_with_every_metric(self, case: ContractCase) -> None:
        self.require_interpreter()
        for config in case.ok_configs:
            check_runs_ok(case.make(), config)

    def test_a_kernel_that_writes_nothing_is_numerics_fail(
        self, case: ContractCase, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.require_interpreter()
        workload = case.make()
        monkeypatch.setattr(workload, "_launch", lambda config, case: None)
        result = workload.run(case.ok_configs[0], CPU, TrialContext())
        assert result.status == TrialStatus.NUMERICS_FAIL and result.error

    def test_triton_compile_failures_become_statuses(
        self, case: ContractCase, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.require_interpreter()
        for exc, status in COMPILE_FAILURES:
            workload = case.make()

            def fail(config: dict[str, Any], case: Any, exc: Exception = exc) -> None:
                raise exc

            monkeypatch.setattr(workload, "_launch", fail)
            result = workload.run(case.ok_configs[0], CPU, TrialContext())
            assert result.status == status and type(exc).__name__ in (result.error or ""), result.error


def check_runs_ok(workload: Workload, config: dict[str, Any]) -> None:
    """``config`` runs OK on the CPU with every declared metric finite, and its work and exports are usable."""
    assert workload.static_check(config, CPU) is None, config
    result = workload.run(config, CPU, TrialContext())
    assert result.status == TrialStatus.OK, (config, result.error)
    for metric in workload.metric_specs():
        assert metric.name in result.metrics and math.isfinite(result.metrics[metric.name]), (config, metric.name)
    assert result.samples_ms and all(s > 0 for s in result.samples_ms), config
    assert result.timing_comparable is False
    flops, moved, precision = workload.work(config)
    assert flops > 0 and moved > 0 and precision in ROOFLINE_PRECISIONS, config
    json.dumps(workload.export_config(config))
    compile(workload.export_python(config), "<export>", "exec")
    assert all(isinstance(v, str) for v in workload.export_env(config).values()), config
