"""Engine defaults per serving backend, read from `backends/<name>.yaml`.

Each value in those files carries a `<field>_source` line; the loader refuses a file
whose numeric field lacks one, so that no constant enters the simulator unexplained.
Users can pass their own YAML path instead of a built-in name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from perfcast.core.errors import ConfigError



class Policy(StrEnum):
    """Engine scheduling policy (one module per family in perfcast.serving.engines)."""

    DECODE_FIRST = "decode_first"     # vLLM V1
    PREFILL_FIRST = "prefill_first"   # SGLang
    INFLIGHT = "inflight"             # TensorRT-LLM


class Admission(StrEnum):
    """KV admission: `incremental` allocates as tokens are computed and preempts when
    the cache runs out (vLLM; TRT-LLM MAX_UTILIZATION); `reserve_full` admits only when
    the prompt and every output token fit (TRT-LLM GUARANTEED_NO_EVICT)."""

    INCREMENTAL = "incremental"
    RESERVE_FULL = "reserve_full"


POLICIES = tuple(p.value for p in Policy)
ADMISSIONS = tuple(a.value for a in Admission)


def _enum(cls, value, field: str):
    try:
        return cls(value)
    except ValueError:
        label = "scheduler policy" if cls is Policy else "KV admission"
        raise ConfigError(f"unknown {label} {value!r}", field=field,
                          expected=" | ".join(m.value for m in cls)) from None


@dataclass(frozen=True)
class SchedulerConfig:
    """Documented scheduler policy plus its parameters (see docs/serving.md)."""

    policy: Policy = Policy.DECODE_FIRST
    token_budget: int = 8192
    max_running_requests: int = 1024
    chunked_prefill: bool = True
    mix_decode_and_prefill: bool = True
    # requests the client keeps in flight to one engine (0: no cap); unlike
    # max_running_requests it is the client's, so it neither scales with attention-DP
    # nor changes what the runtime sizes at start-up (e.g. vLLM's sampler profile run)
    client_in_flight: int = 0
    # SGLang: reserve future decode tokens of running requests when admitting
    # (new_token_ratio = 0.7 x this, decaying); 0 admits on the prompt alone
    schedule_conservativeness: float = 0.0
    # SGLang enable_mixed_chunk: decodes ride along with a prefill chunk
    enable_mixed_chunk: bool = False
    # TRT-LLM attention_dp_config (llmapi/llm_args.py AttentionDpConfig defaults):
    # enable_balance holds context requests back until every attention-DP rank has one
    attention_dp_balance: bool = False
    attention_dp_timeout_iters: int = 50
    attention_dp_batching_wait_iters: int = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", _enum(Policy, self.policy, "policy"))
        if self.schedule_conservativeness < 0:
            raise ConfigError("schedule_conservativeness must be >= 0 (0: off)",
                              field="schedule_conservativeness",
                              expected="a non-negative number (SGLang's default is 1.0)")
        if self.client_in_flight < 0:
            raise ConfigError("client_in_flight must be >= 0 (0: no cap)",
                              field="client_in_flight", expected="a non-negative integer")
        if self.token_budget < 1 or self.max_running_requests < 1:
            raise ConfigError("token_budget and max_running_requests must be >= 1",
                              field="scheduler", expected="positive integers")


@dataclass(frozen=True)
class KVCacheConfig:
    admission: Admission = Admission.INCREMENTAL
    block_tokens: int = 16
    memory_fraction: float = 0.9
    fraction_of: str = "total"          # total | free_after_weights
    activation_reserve_gib: float = 0.0
    sampler_profile_bytes_per_logit: float = 0.0  # x max running requests x vocab

    def __post_init__(self) -> None:
        object.__setattr__(self, "admission", _enum(Admission, self.admission, "admission"))
        if self.fraction_of not in ("total", "free_after_weights"):
            raise ConfigError(f"unknown value {self.fraction_of!r}", field="fraction_of",
                              expected="total | free_after_weights")


@dataclass(frozen=True)
class CudaGraphConfig:
    decode_only: bool = True
    max_batch: int = 0
    capture_sizes: tuple[int, ...] = ()

    def padded(self, requests: int) -> int | None:
        """Captured batch size that serves `requests` (None: runs eagerly)."""
        if requests > self.max_batch:
            return None
        for size in self.capture_sizes:
            if size >= requests:
                return size
        return None


@dataclass(frozen=True)
class Overheads:
    kernel_launch_eager_s: float = 4e-6
    kernel_launch_graph_s: float = 1e-6
    step_overhead_s: float = 0.0
    per_request_overhead_s: float = 0.0
    frontend_overhead_s: float = 0.0
    first_chunk_overhead_s: float = 0.0
    frontend_request_service_s: float = 0.0
    host_overlapped: bool = False


@dataclass(frozen=True)
class BackendDefaults:
    name: str
    description: str
    scheduler: SchedulerConfig
    kv_cache: KVCacheConfig
    cuda_graph: CudaGraphConfig
    overheads: Overheads
    source: str = ""

    def with_scheduler(self, **changes) -> BackendDefaults:
        changes = {k: v for k, v in changes.items() if v is not None}
        return replace(self, scheduler=replace(self.scheduler, **changes)) if changes else self

    def with_overheads(self, **changes) -> BackendDefaults:
        changes = {k: v for k, v in changes.items() if v is not None}
        return replace(self, overheads=replace(self.overheads, **changes)) if changes else self


def builtin_backends() -> list[str]:
    folder = Path(str(resources.files("perfcast.serving").joinpath("backends")))
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load_backend(name_or_path: str) -> BackendDefaults:
    """A built-in backend name (vllm, sglang, trtllm) or a YAML file of the same layout."""
    path = Path(name_or_path)
    if not path.is_file():
        folder = Path(str(resources.files("perfcast.serving").joinpath("backends")))
        path = folder / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ConfigError(f"unknown backend {name_or_path!r}", field="backend",
                              expected="a YAML path or one of " + ", ".join(builtin_backends()))
    return _load_file(str(path.resolve()), path.stat().st_mtime_ns)


@lru_cache(maxsize=64)
def _load_file(path: str, mtime_ns: int) -> BackendDefaults:
    """Parsed once per file version (BackendDefaults is immutable)."""
    return _parse(yaml.safe_load(Path(path).read_text(encoding="utf-8")), path)


def _section(doc: dict, key: str, source: str) -> dict:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise ConfigError("is missing or not a mapping", source=source, field=key)
    for field, item in value.items():
        if field.endswith("_source") or field == "value_source":
            continue
        if isinstance(item, (int, float, list)) and not isinstance(item, bool):
            if f"{field}_source" not in value and not _sourced_by_prefix(field, value):
                raise ConfigError("has no source line", source=source, field=f"{key}.{field}",
                                  expected=f"a '{field}_source' entry naming where it comes from")
    return value


def _sourced_by_prefix(field: str, section: dict) -> bool:
    """`kernel_launch_eager_us` may be documented by `kernel_launch_eager_source`."""
    for suffix in ("_us", "_gib"):
        if field.endswith(suffix) and f"{field[: -len(suffix)]}_source" in section:
            return True
    return False


def _parse(doc: object, source: str) -> BackendDefaults:
    if not isinstance(doc, dict) or "backend" not in doc:
        raise ConfigError("is not a backend defaults file", source=source, field="backend")
    sch = _section(doc, "scheduler", source)
    kv = _section(doc, "kv_cache", source)
    cg = _section(doc, "cuda_graph", source)
    ov = _section(doc, "overheads", source)
    try:
        return BackendDefaults(
            name=str(doc["backend"]), description=str(doc.get("description", "")),
            scheduler=SchedulerConfig(
                policy=str(sch["policy"]), token_budget=int(sch["token_budget"]),
                max_running_requests=int(sch["max_running_requests"]),
                chunked_prefill=bool(sch["chunked_prefill"]),
                mix_decode_and_prefill=bool(sch["mix_decode_and_prefill"]),
                schedule_conservativeness=float(sch.get("schedule_conservativeness", 0.0)),
                enable_mixed_chunk=bool(sch.get("enable_mixed_chunk", False)),
                attention_dp_balance=bool(sch.get("attention_dp_balance", False)),
                attention_dp_timeout_iters=int(sch.get("attention_dp_timeout_iters", 50)),
                attention_dp_batching_wait_iters=int(
                    sch.get("attention_dp_batching_wait_iters", 10))),
            kv_cache=KVCacheConfig(
                admission=str(kv["admission"]), block_tokens=int(kv["block_tokens"]),
                memory_fraction=float(kv["memory_fraction"]),
                fraction_of=str(kv.get("fraction_of", "total")),
                activation_reserve_gib=float(kv.get("activation_reserve_gib", 0.0)),
                sampler_profile_bytes_per_logit=float(
                    kv.get("sampler_profile_bytes_per_logit", 0.0))),
            cuda_graph=CudaGraphConfig(
                decode_only=bool(cg["decode_only"]), max_batch=int(cg["max_batch"]),
                capture_sizes=tuple(sorted(int(x) for x in cg["capture_sizes"]))),
            overheads=Overheads(
                kernel_launch_eager_s=float(ov["kernel_launch_eager_us"]) * 1e-6,
                kernel_launch_graph_s=float(ov["kernel_launch_graph_us"]) * 1e-6,
                step_overhead_s=float(ov["step_overhead_us"]) * 1e-6,
                per_request_overhead_s=float(ov["per_request_overhead_us"]) * 1e-6,
                frontend_overhead_s=float(ov.get("frontend_overhead_us", 0.0)) * 1e-6,
                first_chunk_overhead_s=float(ov.get("first_chunk_overhead_us", 0.0)) * 1e-6,
                frontend_request_service_s=float(
                    ov.get("frontend_request_service_us", 0.0)) * 1e-6,
                host_overlapped=bool(ov.get("host_overlapped", False))),
            source=source)
    except KeyError as exc:
        raise ConfigError("is missing", source=source, field=str(exc.args[0])) from None
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc), source=source) from None
