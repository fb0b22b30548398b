"""A small client of the best-config registry for users' code: standard library only (Triton imported lazily).

    from tuner.client import best_config, autotune_configs, nccl_env

    kwargs = best_config("triton_gemm", m=8192, n=14336, k=4096, gpu="NVIDIA H200")
    configs = autotune_configs("triton_gemm", m=8192, n=14336, k=4096, k_configs=4)  # for @triton.autotune
    os.environ.update(nccl_env("all_reduce", 64 * 2**20, 8))

The server is ``$TUNER_URL`` (default ``http://127.0.0.1:8000``), its token ``$TUNER_API_TOKEN``. Every
answer is kept in a JSON cache (``$TUNER_CONFIG_CACHE``, default ``~/.cache/tuner/configs.json``); when
the server cannot be reached, or ``offline=True`` (``TUNER_OFFLINE=1``), answers come from the cache, so a
job on a machine without the network runs with what an earlier run looked up. This file imports nothing
from the rest of the project and may be copied into another code base as it is.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
#: Fields of a kernel's export form that a launcher takes beside its ``kwargs`` (``best_config`` flattens them).
LAUNCH_FIELDS = ("num_warps", "num_stages", "precision")


class ConfigNotFound(LookupError):
    """No entry at or near the shape (the server's reason), or none in the cache while offline."""


class RegistryClient:
    """Lookups against one registry server, with a local JSON cache of every answer.

    ``gpu``: the device whose entries to use (e.g. ``torch.cuda.get_device_name()``; ``"cpu"`` for
    entries measured under the interpreter); None: any GPU. ``timeout_s``: per request."""

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
        device = gpu if gpu is not None else self.gpu
        if device is not None:
            params["gpu"] = device
        return self._get_json("/api/configs", params)

    def best_config(self, workload: str, *, gpu: str | None = None, **shape: Any) -> dict[str, Any]:
        """The best entry's config as keyword arguments of the kernel's launcher: a kernel's export form
        (``kwargs``, ``num_warps``, ``num_stages``, ``precision``) flattened into one dict, e.g.
        ``kernels.gemm.gemm.matmul(a, b, **best_config("triton_gemm", m=..., n=..., k=...))``; other workloads'
        export form as it is (``tuner export``'s ``config``)."""
        exported = self.lookup(workload, gpu=gpu, **shape)["exported"]
        return flat_kwargs(exported)

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
        device = gpu if gpu is not None else self.gpu
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


def best_config(workload: str, **shape: Any) -> dict[str, Any]:
    """:meth:`RegistryClient.best_config` of the module's client (:func:`configure`)."""
    return _client().best_config(workload, **shape)


def autotune_configs(workload: str, *, k_configs: int = 4, **shape: Any) -> list[Any]:
    """:meth:`RegistryClient.autotune_configs` of the module's client."""
    return _client().autotune_configs(workload, k_configs=k_configs, **shape)


def nccl_env(op: str, size_bytes: int, world_size: int, **fixed: Any) -> dict[str, str]:
    """:meth:`RegistryClient.nccl_env` of the module's client."""
    return _client().nccl_env(op, size_bytes, world_size, **fixed)


def nccl_tuner_conf(path: str | Path | None = None, **options: Any) -> str:
    """:meth:`RegistryClient.nccl_tuner_conf` of the module's client."""
    return _client().nccl_tuner_conf(path, **options)
