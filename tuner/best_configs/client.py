"""A small client of the best-config registry for users' code: standard library only (Triton imported lazily).

    from tuner.client import best_config, autotune_configs, nccl_env

    call = best_call("triton_gemm", m=8192, n=14336, k=4096)  # {"function", "kwargs", "params"}
    c = load_function(call["function"])(a, b, **call["kwargs"])
    kwargs = best_config("triton_gemm", m=8192, n=14336, k=4096)  # the kwargs; .function, .params
    configs = autotune_configs("triton_gemm", m=8192, n=14336, k=4096, k_configs=4)  # for @triton.autotune
    os.environ.update(nccl_env("all_reduce", 64 * 2**20, 8))

The server is ``$TUNER_URL`` (default ``http://127.0.0.1:8000``), its token ``$TUNER_API_TOKEN``. Every
answer is kept in a JSON cache (``$TUNER_CONFIG_CACHE``, default ``~/.cache/tuner/configs.json``); when
the server cannot be reached, or ``offline=True`` (``TUNER_OFFLINE=1``), answers come from the cache, so a
job on a machine without the network runs with what an earlier run looked up. Lookups are for the device
the caller runs on unless ``gpu=`` says otherwise: the local GPU's name with CUDA, ``cpu`` without it (the
entries a study under the Triton interpreter published), ``gpu="any"`` for any GPU. This file imports
nothing from the rest of the project and may be copied into another code base as it is.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
#: Fields of a kernel's export form that a launcher takes beside its ``kwargs`` (an answer without the call
#: form, from an older server or cache, is flattened with them).
LAUNCH_FIELDS = ("num_warps", "num_stages", "precision")
#: ``gpu=`` value that asks for the entries of any GPU (the server's default) rather than the local device's.
ANY_GPU = "any"


class ConfigNotFound(LookupError):
    """No entry at or near the shape (the server's reason), or none in the cache while offline."""


class RegistryClient:
    """Lookups against one registry server, with a local JSON cache of every answer.

    ``gpu``: the device whose entries to use (e.g. ``"NVIDIA H200"``; ``"cpu"`` for entries measured under
    the interpreter; ``"any"``: any GPU); None: the device this process runs on (:func:`local_device`).
    ``timeout_s``: per request."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        cache_path: str | Path | None = None,
        gpu: str | None = None,
        offline: bool | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.url = (url or os.environ.get("TUNER_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("TUNER_API_TOKEN")
        default_cache = Path.home() / ".cache" / "tuner" / "configs.json"
        self.cache_path = Path(cache_path or os.environ.get("TUNER_CONFIG_CACHE") or default_cache)
        self.gpu = gpu
        self.offline = offline if offline is not None else os.environ.get("TUNER_OFFLINE") == "1"
        self.timeout_s = timeout_s

    # lookups -------------------------------------------------------------------
    def lookup(self, workload: str, *, gpu: str | None = None, top: int = 1, **shape: Any) -> dict[str, Any]:
        """``GET /api/configs``: the best entry's fields, ``exact``, ``matches`` (the ``top`` nearest, each with
        its ``distance``). Shape args and fixed args (``precision="fp16"``) are keyword arguments."""
        params = {"workload": workload, **{name: _query_value(v) for name, v in shape.items()}, "top": str(top)}
        device = self._device(gpu)
        if device is not None:
            params["gpu"] = device
        return self._get_json("/api/configs", params)

    def best_call(self, workload: str, *, gpu: str | None = None, **shape: Any) -> dict[str, Any]:
        """The best entry as the call that uses it: ``{"function", "kwargs", "params"}``, the function's dotted
        name (None for a config that is no one function's, e.g. ``collective``'s NCCL settings), its keyword
        arguments and the params the study measured::

            call = best_call("triton_gemm", m=4096, n=4096, k=4096)
            c = load_function(call["function"])(a, b, **call["kwargs"])
        """
        return call_of(self.lookup(workload, gpu=gpu, **shape))

    def best_config(self, workload: str, *, gpu: str | None = None, **shape: Any) -> BestConfig:
        """The best entry's config as the keyword arguments of the function it is for (:meth:`best_call`'s
        ``kwargs``), a dict that also carries ``function`` (the dotted name), ``params`` and ``load()``::

            kwargs = best_config("triton_gemm", m=4096, n=4096, k=4096)
            c = kwargs.load()(a, b, **kwargs)
        """
        return BestConfig(self.best_call(workload, gpu=gpu, **shape))

    def _device(self, gpu: str | None) -> str | None:
        """The ``gpu`` query value: the call's, else the client's, else the local device's; None for any GPU."""
        device = gpu if gpu is not None else self.gpu
        if device is None:
            device = local_device()
        return None if device is None or device.lower() == ANY_GPU else device

    def autotune_configs(self, workload: str, *, k_configs: int = 4, gpu: str | None = None, **shape: Any) -> list[Any]:
        """The configs of the ``k_configs`` entries nearest the shape as a ``triton.Config`` list, for
        ``@triton.autotune(configs=...)``: Triton's autotuner picks among tuned candidates at run time."""
        import triton

        answer = self.lookup(workload, gpu=gpu, top=k_configs, **shape)
        out, seen = [], set()
        for match in answer["matches"]:
            exported = match["exported"]
            if "kwargs" not in exported:
                raise ConfigNotFound(f"{workload}'s entries are not kernel configs (no kwargs in {sorted(exported)})")
            key = json.dumps(
                [exported["kwargs"], exported.get("num_warps"), exported.get("num_stages")], sort_keys=True
            )
            if key in seen:
                continue
            seen.add(key)
            launch = {f: exported[f] for f in ("num_warps", "num_stages") if exported.get(f) is not None}
            out.append(triton.Config(dict(exported["kwargs"]), **launch))
        return out

    def nccl_env(self, op: str, size_bytes: int, world_size: int, *, gpu: str | None = None, **fixed: Any) -> dict:
        """The NCCL environment variables of the nearest ``collective`` entry (set them before the process
        group is created); fixed args such as ``dtype="bf16"`` narrow the lookup."""
        answer = self.lookup("collective", gpu=gpu, op=op, size_bytes=size_bytes, world_size=world_size, **fixed)
        return dict(answer["exported"].get("env") or {})

    def nccl_tuner_conf(self, path: str | Path | None = None, *, gpu: str | None = None) -> str:
        """The registry's collective entries as NCCL's example tuner plugin's CSV (``nccl_tuner.conf``);
        written to ``path`` when given (point ``NCCL_TUNER_CONFIG_FILE`` at it)."""
        device = self._device(gpu)
        text = self._get_text("/api/configs/nccl_tuner.conf", {"gpu": device} if device else {})
        if path is not None:
            Path(path).write_text(text)
        return text

    # transport and cache -------------------------------------------------------
    def _get_json(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        return json.loads(self._get_text(path, params))

    def _get_text(self, path: str, params: dict[str, str]) -> str:
        key = path + "?" + urllib.parse.urlencode(sorted(params.items()))
        if self.offline:
            return self._cached(key, "offline")
        request = urllib.request.Request(self.url + key)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise ConfigNotFound(_detail(exc)) from None
            raise
        except (urllib.error.URLError, OSError) as exc:  # unreachable: what an earlier run looked up
            return self._cached(key, f"{self.url} unreachable ({exc})")
        self._store(key, text)
        return text

    def _load(self) -> dict[str, str]:
        try:
            return json.loads(self.cache_path.read_text())
        except (OSError, ValueError):
            return {}

    def _cached(self, key: str, why: str) -> str:
        cache = self._load()
        if key not in cache:
            raise ConfigNotFound(f"{why}, and the cache {self.cache_path} has no answer for {key}")
        return cache[key]

    def _store(self, key: str, text: str) -> None:
        """Add an answer to the cache, replacing the file atomically (parallel jobs never see half of one)."""
        cache = self._load()
        cache[key] = text
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.cache_path.parent, prefix=".configs-", suffix=".json")
        with os.fdopen(fd, "w") as handle:
            json.dump(cache, handle, indent=1, sort_keys=True)
        os.replace(tmp, self.cache_path)


class BestConfig(dict):
    """A config as the keyword arguments of its function (``fn(a, b, **config)``), with ``function`` (its
    dotted name, or None) and ``params`` (the params measured) beside; :meth:`load` imports the function."""

    def __init__(self, call: dict[str, Any]) -> None:
        super().__init__(call["kwargs"])
        self.function: str | None = call["function"]
        self.params: dict[str, Any] = dict(call["params"])

    def load(self) -> Any:
        """The function the config is for (:func:`load_function`)."""
        if self.function is None:
            raise ConfigNotFound(f"this config is no one function's (its params: {sorted(self.params)})")
        return load_function(self.function)


def load_function(dotted: str) -> Any:
    """The function of a dotted name (``kernels.gemm.gemm.matmul``), imported."""
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def call_of(answer: dict[str, Any]) -> dict[str, Any]:
    """A lookup's answer as ``{"function", "kwargs", "params"}``; an answer without the call form (an older
    server's, or the cache's) from its export form."""
    exported = answer.get("exported") or {}
    params = dict(answer.get("params") or answer.get("config") or {})
    if "kwargs" in answer:
        return {"function": answer.get("function"), "kwargs": dict(answer["kwargs"]), "params": params}
    return {"function": exported.get("function"), "kwargs": flat_kwargs(exported), "params": params}


def local_device() -> str | None:
    """The device this process runs on as the registry names it: the current CUDA GPU's name, ``cpu``
    without CUDA; None (any GPU) when torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return "cpu"
    return torch.cuda.get_device_name(torch.cuda.current_device())


def flat_kwargs(exported: dict[str, Any]) -> dict[str, Any]:
    """A kernel's export form (``kwargs`` + launch fields) as one dict of launcher keyword arguments."""
    if "kwargs" not in exported:
        return dict(exported)
    out = dict(exported["kwargs"])
    out.update({name: exported[name] for name in LAUNCH_FIELDS if name in exported})
    return out


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read().decode()).get("detail"))
    except (ValueError, AttributeError):
        return f"HTTP {exc.code}"


_default: RegistryClient | None = None


def configure(url: str | None = None, **options: Any) -> RegistryClient:
    """Set the client the module's functions use (``RegistryClient``'s arguments); returns it."""
    global _default
    _default = RegistryClient(url, **options)
    return _default


def _client() -> RegistryClient:
    return _default if _default is not None else configure()


def best_config(workload: str, **shape: Any) -> BestConfig:
    """:meth:`RegistryClient.best_config` of the module's client (:func:`configure`)."""
    return _client().best_config(workload, **shape)


def best_call(workload: str, **shape: Any) -> dict[str, Any]:
    """:meth:`RegistryClient.best_call` of the module's client."""
    return _client().best_call(workload, **shape)


def autotune_configs(workload: str, *, k_configs: int = 4, **shape: Any) -> list[Any]:
    """:meth:`RegistryClient.autotune_configs` of the module's client."""
    return _client().autotune_configs(workload, k_configs=k_configs, **shape)


def nccl_env(op: str, size_bytes: int, world_size: int, **fixed: Any) -> dict[str, str]:
    """:meth:`RegistryClient.nccl_env` of the module's client."""
    return _client().nccl_env(op, size_bytes, world_size, **fixed)


def nccl_tuner_conf(path: str | Path | None = None, **options: Any) -> str:
    """:meth:`RegistryClient.nccl_tuner_conf` of the module's client."""
    return _client().nccl_tuner_conf(path, **options)
