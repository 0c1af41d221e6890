"""Engine defaults per serving backend, read from `backends/<name>.yaml`.

Each value in those files carries a `<field>_source` line; the loader refuses a file
whose numeric field lacks one, so that no constant enters the simulator unexplained.
Users can pass their own YAML path instead of a built-in name.

A file may hold `version_ranges`: engine releases whose defaults differ from the base
sections, each range overriding some fields (every overriding value with its source),
and `when` entries that override fields for deployments matching conditions (GPU
memory, device, TP/PP), at file level or inside a range. `load_backend(name, version,
system=..., tp=..., pp=...)` applies the base, the matching file-level `when` entries,
the range the version selects and its matching `when` entries, in that order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache
from importlib import resources
from pathlib import Path

from perfcast.core.errors import ConfigError
from perfcast.core.yamlio import safe_load



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
class ReservedMemory:
    """An engine that derives its memory fraction from the memory it holds back for
    activations and CUDA graphs (SGLang's mem_fraction_static when not given):
    fraction = round((device MiB - reserved MiB) / device MiB, 3) with reserved MiB =
    base + per_chunk_token x max(chunk, min_chunk_tokens) + per_cuda_graph_batch x
    graph max batch + per_parallel_gpu x GPUs of a stage x PP; with attention DP
    + attention_dp + attention_dp_per_graph_batch_rank x graph max batch x DP ranks
    (x (1 + attention_dp_large_factor) above attention_dp_large_graph_batch); at least
    floor on devices above floor_above_gib; + speculative with a draft model."""

    base_mib: float = 0.0
    per_chunk_token_mib: float = 0.0
    min_chunk_tokens: int = 0
    per_cuda_graph_batch_mib: float = 0.0
    per_parallel_gpu_mib: float = 0.0
    attention_dp_mib: float = 0.0
    attention_dp_per_graph_batch_rank_mib: float = 0.0
    attention_dp_large_graph_batch: int = 0
    attention_dp_large_factor: float = 0.0
    floor_mib: float = 0.0
    floor_above_gib: float = 0.0
    speculative_mib: float = 0.0

    def reserved_mib(self, *, memory_gib: float, chunk_tokens: int, graph_max_batch: int,
                     stage_gpus: int, pp: int, dp: int, speculative: bool = False) -> float:
        chunk = max(chunk_tokens, self.min_chunk_tokens)
        mib = (self.base_mib + self.per_chunk_token_mib * chunk
               + self.per_cuda_graph_batch_mib * graph_max_batch
               + self.per_parallel_gpu_mib * stage_gpus * pp)
        if dp > 1:
            per_rank = self.attention_dp_per_graph_batch_rank_mib * graph_max_batch * dp
            large = self.attention_dp_large_graph_batch
            if large and graph_max_batch > large:
                per_rank *= 1 + self.attention_dp_large_factor
            mib += self.attention_dp_mib + per_rank
        if memory_gib > self.floor_above_gib:
            mib = max(mib, self.floor_mib)
        return mib + (self.speculative_mib if speculative else 0.0)

    def fraction(self, *, memory_gib: float, **facts) -> float:
        device_mib = memory_gib * 1024
        return round((device_mib - self.reserved_mib(memory_gib=memory_gib, **facts))
                     / device_mib, 3)


RESERVED_MEMORY_FIELDS = tuple(ReservedMemory.__dataclass_fields__)


@dataclass(frozen=True)
class KVCacheConfig:
    admission: Admission = Admission.INCREMENTAL
    block_tokens: int = 16
    memory_fraction: float = 0.9
    fraction_of: str = "total"          # total | free_after_weights
    activation_reserve_gib: float = 0.0
    sampler_profile_bytes_per_logit: float = 0.0  # x max running requests x vocab
    # the engine derives its fraction from this (None: memory_fraction as given); a
    # launch setting of the fraction replaces it (`with_memory_fraction`)
    reserved_memory: ReservedMemory | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "admission", _enum(Admission, self.admission, "admission"))
        if self.fraction_of not in ("total", "free_after_weights"):
            raise ConfigError(f"unknown value {self.fraction_of!r}", field="fraction_of",
                              expected="total | free_after_weights")

    def with_memory_fraction(self, fraction: float) -> KVCacheConfig:
        """A fraction set at launch: the engine's own derivation no longer applies."""
        return replace(self, memory_fraction=float(fraction), reserved_memory=None)


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
    # disaggregated serving: from a prefill worker's end of a request to the decode
    # worker taking it in, beyond moving the KV bytes (fitted: serving_disagg_handoff)
    disagg_handoff_s: float = 0.0
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
    version: str = ""          # the engine version asked for ("" : none given)
    version_range: str = ""    # the range whose defaults apply ("" : the file has none)
    version_note: str = ""     # why that range, when the version is not inside it
    conditions: tuple[str, ...] = ()   # `when` entries applied, each with its source

    def with_scheduler(self, **changes) -> BackendDefaults:
        changes = {k: v for k, v in changes.items() if v is not None}
        return replace(self, scheduler=replace(self.scheduler, **changes)) if changes else self

    def with_overheads(self, **changes) -> BackendDefaults:
        changes = {k: v for k, v in changes.items() if v is not None}
        return replace(self, overheads=replace(self.overheads, **changes)) if changes else self


def defaults_json(backend: BackendDefaults) -> dict:
    """Which engine defaults a run used: the version range, why it (note), and the
    deployment-dependent entries applied, for the serve and search records."""
    return {"file": Path(backend.source).name if backend.source else None,
            "version_range": backend.version_range or None,
            "note": backend.version_note or None, "conditions": list(backend.conditions)}


def defaults_lines(defaults: dict | None) -> list[str]:
    """The table-output lines of `defaults_json` (the range, and the note if any)."""
    if not defaults or not defaults.get("version_range"):
        return []
    lines = [f"defaults   {defaults['file']} range {defaults['version_range']}"]
    if defaults.get("note"):
        lines.append(f"           note: {defaults['note']}")
    return lines


def builtin_backends() -> list[str]:
    folder = Path(str(resources.files("perfcast.serving").joinpath("backends")))
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load_backend(name_or_path: str, version: str = "", *, system=None,
                 tp: int | None = None, pp: int | None = None) -> BackendDefaults:
    """A built-in backend name (vllm, sglang, trtllm) or a YAML file of the same layout,
    with the defaults of engine release `version` (its range, or the nearest one with a
    note) for a deployment on `system` (a `hardware.System`; its device memory and name
    select `when` entries) laid out with `tp` x `pp`; `tp` counts every GPU of a
    pipeline stage, attention-DP ranks included (SGLang's tp_size). Facts not given
    match no condition that needs them."""
    path = Path(name_or_path)
    if not path.is_file():
        folder = Path(str(resources.files("perfcast.serving").joinpath("backends")))
        path = folder / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ConfigError(f"unknown backend {name_or_path!r}", field="backend",
                              expected="a YAML path or one of " + ", ".join(builtin_backends()))
    memory_gib = system.device.memory.capacity_bytes / 2**30 if system is not None else None
    device = system.name if system is not None else None
    return _load_selected(str(path.resolve()), path.stat().st_mtime_ns, version.strip(),
                          _Deployment(memory_gib, device, tp, pp))


@dataclass(frozen=True)
class _Deployment:
    """The facts `when` conditions test (None: not known to the caller)."""

    memory_gib: float | None = None
    device: str | None = None
    tp: int | None = None
    pp: int | None = None


SECTIONS = ("scheduler", "kv_cache", "cuda_graph", "overheads")
CONDITIONS = ("memory_gib_at_least", "memory_gib_below", "devices", "devices_excluded",
              "tp_at_least", "tp_below", "pp_at_least")
_VERSION = re.compile(r"v?\d+(\.\d+)*((a|b|rc|dev|post|\.post|\.dev)\d*)*")


@lru_cache(maxsize=256)
def _load_selected(path: str, mtime_ns: int, version: str, where: _Deployment) -> BackendDefaults:
    """Parsed once per file version, engine version and deployment facts
    (BackendDefaults is immutable)."""
    doc, ranges = _load_file(path, mtime_ns)
    merged = {k: dict(doc[k]) for k in SECTIONS}
    applied = _apply_when(merged, doc.get("when"), where)
    chosen, note = select_range(ranges, version)
    if chosen is not None:
        _override(merged, chosen.entry)
        applied += _apply_when(merged, chosen.entry.get("when"), where)
    out = _parse({**doc, **merged}, path)
    return replace(out, version=version, version_range=chosen.label if chosen else "",
                   version_note=note, conditions=tuple(applied))


@lru_cache(maxsize=64)
def _load_file(path: str, mtime_ns: int) -> tuple[dict, tuple[VersionRange, ...]]:
    """The file's document (its base checked by parsing it) and its version ranges."""
    doc = safe_load(Path(path).read_text(encoding="utf-8"))
    _parse(doc, path)
    _check_when(doc.get("when"), path, "when")
    return doc, _ranges(doc.get("version_ranges"), path)


@dataclass(frozen=True)
class VersionRange:
    """Engine releases `since` <= v < `until` (either end open when empty)."""

    since: str
    until: str
    default: bool
    entry: dict

    @property
    def label(self) -> str:
        if self.since and self.until:
            return f">={self.since},<{self.until}"
        return f">={self.since}" if self.since else f"<{self.until}"

    def contains(self, key: tuple) -> bool:
        return ((not self.since or key >= _key(self.since))
                and (not self.until or key < _key(self.until)))


def is_version(text: str) -> bool:
    """A release number such as 0.5.8.post1 or 1.2.0rc6 (not a label like glm5-hopper)."""
    return bool(_VERSION.fullmatch(text.lower()))


_STAGE = {"dev": 0, "a": 1, "b": 2, "rc": 3, "": 4, "post": 5}


def _key(text: str) -> tuple:
    """Order of a release number: 1.2.0rc6 < 1.2.0 < 1.2.0.post1 < 1.2.1."""
    m = re.match(r"v?(\d+(?:\.\d+)*)(.*)", text.lower())
    release = tuple(int(x) for x in m.group(1).split("."))
    release += (0,) * (4 - len(release))
    tags = tuple((_STAGE[t], int(n or 0))
                 for t, n in re.findall(r"(dev|a|b|rc|post)(\d*)", m.group(2)))
    if not tags or tags[0][0] == _STAGE["post"]:
        tags = ((_STAGE[""], 0),) + tags
    return release, tags


def _release_gap(a: str, b: str) -> tuple:
    """How far apart two releases are, major first (0.18 is 4 minor releases from 0.14)."""
    return tuple(abs(x - y) for x, y in zip(_key(a)[0][:3], _key(b)[0][:3]))


def select_range(ranges: tuple[VersionRange, ...], version: str
                 ) -> tuple[VersionRange | None, str]:
    """The range whose defaults apply to `version`, and a note when `version` is not
    inside it: no version or a label that is no release number takes the file's default
    range; a release older (newer) than every range takes the first (last) range, one in
    a gap between ranges the range with the nearer end by release numbers (ties to the
    older range)."""
    if not ranges:
        return None, ""
    default = next(r for r in ranges if r.default)
    if not version or not is_version(version):
        what = "no engine version given" if not version else (
            f"backend version {version!r} is not a release number")
        return default, f"{what}: defaults of the default range {default.label} used"
    key = _key(version)
    for r in ranges:
        if r.contains(key):
            return r, ""
    if ranges[0].since and key < _key(ranges[0].since):
        best, where = ranges[0], "older than every range"
    elif ranges[-1].until and key >= _key(ranges[-1].until):
        best, where = ranges[-1], "newer than every range"
    else:   # in a gap: the range with the nearer end (ties to the older)
        best = min(ranges, key=lambda r: min(_release_gap(version, e)
                                             for e in (r.since, r.until) if e))
        where = "between ranges"
    return best, (f"backend version {version} is {where} of the file: defaults of the "
                  f"nearest range {best.label} used")


def _ranges(value: object, source: str) -> tuple[VersionRange, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise ConfigError("is not a non-empty list", source=source, field="version_ranges")
    out = []
    for i, entry in enumerate(value):
        field = f"version_ranges[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError("is not a mapping", source=source, field=field)
        since, until = str(entry.get("since") or ""), str(entry.get("until") or "")
        if not since and not until:
            raise ConfigError("has neither 'since' nor 'until'", source=source, field=field)
        for end in (since, until):
            if end and not is_version(end):
                raise ConfigError(f"{end!r} is not a release number", source=source,
                                  field=field)
        if since and until and _key(since) >= _key(until):
            raise ConfigError(f"since {since} is not before until {until}", source=source,
                              field=field)
        if not str(entry.get("source") or "").strip():
            raise ConfigError("has no source", source=source, field=f"{field}.source",
                              expected="release notes or code defaults naming what changed")
        _check_overrides(entry, source, field)
        _check_when(entry.get("when"), source, f"{field}.when")
        out.append(VersionRange(since, until, bool(entry.get("default", False)), entry))
    out.sort(key=lambda r: _key(r.since or r.until))
    for a, b in zip(out, out[1:]):
        if not a.until or not b.since or _key(a.until) > _key(b.since):
            raise ConfigError(f"ranges {a.label} and {b.label} overlap", source=source,
                              field="version_ranges")
    if sum(r.default for r in out) != 1:
        raise ConfigError("must mark exactly one range 'default: true'", source=source,
                          field="version_ranges",
                          expected="the range used when no release number is given")
    return tuple(out)


def _check_overrides(entry: dict, source: str, field: str) -> None:
    """Every overriding value needs its `<name>_source` (booleans and strings too)."""
    for key in SECTIONS:
        section = entry.get(key)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise ConfigError("is not a mapping", source=source, field=f"{field}.{key}")
        for name in section:
            if name.endswith("_source"):
                continue
            if f"{name}_source" not in section and not _sourced_by_prefix(name, section):
                raise ConfigError("has no source line", source=source,
                                  field=f"{field}.{key}.{name}",
                                  expected=f"a '{name}_source' entry naming where it comes from")


def _check_when(value: object, source: str, field: str) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        raise ConfigError("is not a list", source=source, field=field)
    for i, entry in enumerate(value):
        where = f"{field}[{i}]"
        cond = entry.get("if") if isinstance(entry, dict) else None
        if not isinstance(cond, dict) or not cond or set(cond) - set(CONDITIONS):
            raise ConfigError("needs an 'if' mapping of known conditions", source=source,
                              field=f"{where}.if", expected=" | ".join(CONDITIONS))
        if not str(entry.get("source") or "").strip():
            raise ConfigError("has no source", source=source, field=f"{where}.source")
        _check_overrides(entry, source, where)


def _apply_when(merged: dict, value: object, where: _Deployment) -> list[str]:
    applied = []
    for entry in value or ():
        if _matches(entry["if"], where):
            _override(merged, entry)
            cond = ", ".join(f"{k} {v}" for k, v in entry["if"].items())
            applied.append(f"{cond}: {entry['source']}")
    return applied


def _matches(cond: dict, where: _Deployment) -> bool:
    tests = {
        "memory_gib_at_least": lambda v: where.memory_gib is not None and where.memory_gib >= v,
        "memory_gib_below": lambda v: where.memory_gib is not None and where.memory_gib < v,
        "devices": lambda v: where.device is not None and where.device in v,
        "devices_excluded": lambda v: where.device is not None and where.device not in v,
        "tp_at_least": lambda v: where.tp is not None and where.tp >= v,
        "tp_below": lambda v: where.tp is not None and where.tp < v,
        "pp_at_least": lambda v: where.pp is not None and where.pp >= v,
    }
    return all(tests[k](v) for k, v in cond.items())


def _override(merged: dict, entry: dict) -> None:
    for key in SECTIONS:
        merged[key].update(entry.get(key) or {})


def _reserved_memory(value: object, source: str) -> ReservedMemory | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - set(RESERVED_MEMORY_FIELDS):
        raise ConfigError("is not a mapping of known terms", source=source,
                          field="kv_cache.reserved_memory",
                          expected=" | ".join(RESERVED_MEMORY_FIELDS))
    counts = ("min_chunk_tokens", "attention_dp_large_graph_batch")
    try:
        return ReservedMemory(**{k: int(v) if k in counts else float(v)
                                 for k, v in value.items()})
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc), source=source, field="kv_cache.reserved_memory") from None


def _section(doc: dict, key: str, source: str) -> dict:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise ConfigError("is missing or not a mapping", source=source, field=key)
    for field, item in value.items():
        if field.endswith("_source") or field == "value_source":
            continue
        if isinstance(item, (int, float, list, dict)) and not isinstance(item, bool):
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
                    kv.get("sampler_profile_bytes_per_logit", 0.0)),
                reserved_memory=_reserved_memory(kv.get("reserved_memory"), source)),
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
