"""The one exception classifier: what an exception raised by a trial means, as a :class:`TrialStatus`.

Every place that turns an exception into a status calls :func:`classify_exception`: the trial
template (:mod:`tuner.workloads.template`) for the failures a workload reports itself, the worker
(:mod:`tuner.run.worker`) for what a workload lets through, and a rank of a multi-GPU trial
(:mod:`tuner.run.gang_rank`). It reads the exception's class names (its whole MRO, so subclasses count)
before its text, and the text only for the few messages that have no class of their own:

1. out of memory: torch's ``OutOfMemoryError`` (CUDA), the CPU allocator's and cuBLAS's messages;
2. out of resources: Triton's ``OutOfResources`` (shared memory, registers);
3. compile errors: Triton's, ptxas', MLIR's and torch.compile's exceptions (dynamo, AOTAutograd,
   inductor), and the messages of compilers that raise a plain ``RuntimeError``;
4. in a process group, a collective that timed out (gloo's "Timed out waiting", the NCCL watchdog);
5. an exception raised while compiling ahead (``prepare``) is a compile error whatever its class;
6. anything else is a runtime error.

:class:`TrialFailure` lets a workload end a trial with a status from anywhere in it.
"""

from __future__ import annotations

from tuner.workloads.base import TrialResult, TrialStatus

MAX_ERROR_CHARS = 4000

OOM_CLASSES = frozenset({"OutOfMemoryError"})
OOM_TEXTS = ("out of memory", "can't allocate memory", "cublas_status_alloc_failed")
OUT_OF_RESOURCES_CLASSES = frozenset({"OutOfResources"})
OUT_OF_RESOURCES_TEXTS = ("out of resource",)
COMPILE_CLASSES = frozenset(
    {
        # Triton
        "CompilationError",
        "CompileTimeAssertionFailure",
        "MLIRCompilationError",
        "PTXASError",
        # torch.compile (dynamo, AOTAutograd, inductor)
        "BackendCompilerFailed",
        "InductorError",
        "LoweringException",
        "TorchDynamoException",
        "Unsupported",
    }
)
#: Messages of compilers that raise a plain RuntimeError. Deliberately narrower than "compil" and
#: "error": every CUDA error of torch ends with "Compile with `TORCH_USE_CUDA_DSA`", and an illegal
#: memory access is a runtime error, not a compile error.
COMPILE_TEXTS = (
    "compilation error",
    "compilation failed",
    "compile error",
    "failed to compile",
    "passmanager::run failed",
    "ptx codegen error",
)
#: Text of the errors a hung collective ends with (gloo's "Timed out waiting ... for recv", the NCCL watchdog).
TIMEOUT_TEXTS = ("timed out", "timeout", "watchdog caught collective")


class TrialFailure(Exception):
    """Raised by a workload to end its trial with ``status`` and ``message`` (the template returns it
    as the trial's result; it never reaches the worker as an exception)."""

    def __init__(self, status: TrialStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _class_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def classify_exception(exc: BaseException, *, prepare: bool = False, process_group: bool = False) -> TrialStatus:
    """The status of an exception raised by a trial (see the module docstring for the order of the rules).

    ``prepare``: it was raised while compiling ahead; ``process_group``: by a rank of a multi-GPU
    trial, where a timed-out collective is ``timeout``."""
    if isinstance(exc, TrialFailure):
        return exc.status
    names = _class_names(exc)
    text = f"{type(exc).__name__}: {exc}".lower()
    if names & OOM_CLASSES or any(t in text for t in OOM_TEXTS):
        return TrialStatus.OOM
    if names & OUT_OF_RESOURCES_CLASSES or any(t in text for t in OUT_OF_RESOURCES_TEXTS):
        return TrialStatus.OUT_OF_RESOURCES
    if names & COMPILE_CLASSES or any(t in text for t in COMPILE_TEXTS):
        return TrialStatus.COMPILE_ERROR
    if process_group and any(t in text for t in TIMEOUT_TEXTS):
        return TrialStatus.TIMEOUT
    if prepare:
        return TrialStatus.COMPILE_ERROR
    return TrialStatus.RUNTIME_ERROR


def short_error(text: str) -> str:
    """An error text as a trial stores it: its last :data:`MAX_ERROR_CHARS` characters."""
    return text if len(text) <= MAX_ERROR_CHARS else "...\n" + text[-MAX_ERROR_CHARS:]


def failure_result(exc: BaseException, status: TrialStatus, comparable: bool) -> TrialResult:
    """The result of a trial that ended with ``exc``, classified as ``status``: the error names the class."""
    text = str(exc) if isinstance(exc, TrialFailure) else f"{type(exc).__name__}: {exc}"
    return TrialResult(status, error=text[:MAX_ERROR_CHARS], timing_comparable=comparable)
