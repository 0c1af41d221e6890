"""One deployment end to end: model + layout + backend + clients -> serving metrics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from perfcast.core.errors import ConfigError
from perfcast.evidence.contracts import CostProvider, CostQueryContext
from perfcast.evidence.factory import build_resolver, providers_digest
from perfcast.hardware import System, load_system
from perfcast.serving.backends import BackendDefaults, load_backend
from perfcast.serving.engine import Engine
from perfcast.serving.kv_transfer import KVLinks, kv_tier, transfer_s
from perfcast.serving.pipeline import StagedStepCostModel, replica_kv_tokens, virtual_engines
from perfcast.serving.requests import (BlockLRU, Client, ClosedLoopClient, DeclaredHitRate,
                                      LengthDistribution, OpenLoopClient, TraceClient,
                                      TraceRequest)
from perfcast.serving.simulator import SimulationResult, simulate
from perfcast.serving.speculative import SpeculativeConfig, speculative_step
from perfcast.serving.step_cost import StepCostModel
from perfcast.workload import ModelSpec, ParallelPlan, Precision, load_model_spec
from perfcast.workload.stacks import resolve_stack

GIB = 1024 ** 3


@dataclass(frozen=True)
class Pool:
    """Workers of one role, each laid out by `plan`."""

    plan: ParallelPlan
    workers: int = 1

    @property
    def gpus(self) -> int:
        return self.plan.num_devices * self.workers


@dataclass(frozen=True)
class ServeConfig:
    model: str | ModelSpec
    system: str | System = "h100_sxm"
    backend: str | BackendDefaults = "vllm"
    backend_version: str = ""
    precision: Precision | None = None
    mode: str = "agg"                      # agg | disagg
    pool: Pool = field(default_factory=lambda: Pool(ParallelPlan()))   # agg replicas / prefill pool
    decode_pool: Pool | None = None        # disagg only
    # disagg: running requests per decode worker (per attention-DP rank), e.g. TRT-LLM's
    # decode max_batch_size; None: the backend's max_running_requests, as the prefill pool
    decode_max_running_requests: int | None = None
    # disagg: the decode workers' engine settings where their launch differs from the
    # prefill workers' (memory fraction, CUDA-graph batch, ...); None: `backend`'s
    decode_backend: BackendDefaults | None = None
    isl: int = 1024
    osl: int = 128
    range_ratio: float = 1.0
    concurrency: int | None = 8            # closed loop (total client concurrency)
    request_rate_per_s: float | None = None  # open loop (Poisson)
    arrival_times_s: tuple[float, ...] | None = None  # open loop (trace)
    trace: tuple[TraceRequest, ...] | None = None     # replay: arrivals and lengths
    trace_block_tokens: int | None = None  # tokens per block hash of the trace's requests
    # fraction of each prompt found in the prefix cache; None: the trace's block hashes
    # decide (an LRU of one engine's KV capacity), or no prefix caching without them
    prefix_cache_hit_rate: float | None = None
    num_requests: int | None = None        # default 10 x concurrency (closed) or 200
    warmup_requests: int = 0
    seed: int = 0
    interpolate: bool = True
    record_trace: bool = False
    explain: bool = False                  # record per-request phases (serve --explain)
    speculative: SpeculativeConfig | None = None  # draft + verify decoding (serve --speculative)
    # operator conventions of every step graph (perfcast.workload.stacks; serve --stack):
    # auto picks them from the device vendor, as `perfcast estimate --stack auto` does
    stack: str = "auto"


class StepModelCache:
    """Reuses costed graphs across simulations of the same deployment: terms are keyed
    by the digests of model, plan, precision, system, evidence providers (`evidence.
    factory.providers_digest`), query context and operator stack (not by scheduler,
    overheads or CUDA-graph settings, which only change how terms are combined)."""

    def __init__(self) -> None:
        self._graphs: dict[tuple, dict] = {}
        self._resolvers: dict[tuple, object] = {}
        self._models: dict[tuple, StepCostModel] = {}

    def get(self, model: ModelSpec, plan: ParallelPlan, system: System,
            backend: BackendDefaults, precision: Precision | None,
            evidence: Sequence[CostProvider], context: CostQueryContext,
            interpolate: bool, stack: str = "auto") -> StepCostModel:
        ev_key = (system.digest, providers_digest(evidence))
        op_stack = resolve_stack(stack, system.device.vendor)
        base = (model.digest, plan.digest, precision, context.digest, ev_key, op_stack.name)
        key = (base, backend.overheads, backend.cuda_graph, interpolate)
        hit = self._models.get(key)
        if hit is None:
            if ev_key not in self._resolvers:
                # kernel launch is the step model's (per kernel, eager vs. CUDA graph)
                self._resolvers[ev_key] = build_resolver(system, evidence,
                                                         launch_in_kernel_times=False)
            # pp > 1: the same terms kept split by stage (serving.pipeline)
            cls = StagedStepCostModel if plan.pp > 1 else StepCostModel
            hit = cls(model, plan, system, self._resolvers[ev_key],
                      precision=precision, context=context,
                      overheads=backend.overheads, cuda_graph=backend.cuda_graph,
                      interpolate=interpolate, graph_cache=self._graphs.setdefault(base, {}),
                      terms_cache=self._graphs.setdefault((base, interpolate), {}),
                      stack=op_stack)
            self._models[key] = hit
        return hit


def sampler_reserve_bytes(step: StepCostModel, backend: BackendDefaults) -> float:
    """Memory a runtime's start-up profiling run holds for sampling a full batch: logits
    over the whole vocabulary for every running request, in the per-logit bytes of the
    backend file (e.g. vLLM's dummy sampler run: fp32 logits, probabilities and sorted
    values plus int64 sort indices). Every tensor-parallel rank samples the gathered
    logits, so the vocabulary is not divided."""
    per_logit = backend.kv_cache.sampler_profile_bytes_per_logit
    return per_logit * backend.scheduler.max_running_requests * step.model.vocab_size


def reserved_memory_facts(backend: BackendDefaults, system: System, plan: ParallelPlan,
                          draft_model: bool = False) -> dict:
    """The deployment facts an engine's own memory rule (`ReservedMemory`) reads: device
    memory, chunk size, CUDA-graph batch and layout. `draft_model`: a speculative draft
    model or MTP layers are loaded."""
    return dict(memory_gib=system.device.memory.capacity_bytes / GIB,
                chunk_tokens=backend.scheduler.token_budget,
                graph_max_batch=backend.cuda_graph.max_batch,
                stage_gpus=plan.devices_per_stage, pp=plan.pp, dp=plan.dp,
                speculative=draft_model)


def memory_fraction(step: StepCostModel, backend: BackendDefaults,
                    draft_model: bool = False) -> float:
    """The share of device memory the engine gives weights and KV cache: the backend
    file's (or launch setting's) fraction, or the engine's own derivation
    (`reserved_memory_facts`)."""
    kv = backend.kv_cache
    if kv.reserved_memory is None:
        return kv.memory_fraction
    return kv.reserved_memory.fraction(
        **reserved_memory_facts(backend, step.system, step.plan, draft_model))


def kv_capacity_tokens(step: StepCostModel, backend: BackendDefaults,
                       context_hint: int = 2048, draft_model: bool = False) -> int:
    """KV tokens one engine holds over all its attention-DP ranks: device memory x
    fraction - weights - reserve, divided by the KV bytes per token on the most loaded
    device (at `context_hint` tokens per request, for sliding-window layers)."""
    memory = step.memory_facts()
    weights = memory.weights
    per_token = memory.kv_bytes_per_request(context_hint) / context_hint
    kv = backend.kv_cache
    fraction = memory_fraction(step, backend, draft_model)
    total = step.system.device.memory.capacity_bytes
    reserve = kv.activation_reserve_gib * GIB + sampler_reserve_bytes(step, backend)
    if kv.fraction_of == "free_after_weights":
        free = (total - weights) * fraction - reserve
    else:
        free = total * fraction - weights - reserve
    if free <= 0 or per_token <= 0:
        raise ConfigError(
            f"weights take {weights / GIB:.1f} GiB of {total / GIB:.0f} GiB per device: no room "
            f"for a KV cache under {backend.name}'s memory fraction {fraction}"
            + (f" (the engine's own, from {backend.scheduler.token_budget}-token chunks and "
               f"CUDA graphs up to batch {backend.cuda_graph.max_batch})"
               if kv.reserved_memory is not None else ""),
            field="tp_size/pp_size", expected="more devices per replica or a smaller dtype")
    return int(free // per_token) * memory.dp_ranks


def kv_links(prefill: Pool, decode: Pool, prefill_step: StepCostModel,
             decode_step: StepCostModel, system: System) -> KVLinks:
    """The prefill -> decode KV moves of one deployment (`serving.kv_transfer`): over
    the tier that joins the two pools, each request's whole prompt cache, as many bytes
    per device as the larger of its shard on a prefill and on a decode device; one
    channel per attention-DP rank of each worker."""
    tier = kv_tier(system, prefill.gpus, decode.gpus)
    pmem, dmem = prefill_step.memory_facts(), decode_step.memory_facts()

    def duration(r) -> float:
        return transfer_s(max(pmem.kv_bytes_per_request(r.input_tokens),
                              dmem.kv_bytes_per_request(r.input_tokens)), tier)

    return KVLinks(duration, lambda engine: max(engine.cost.plan.dp, 1))


def prefix_cache(cfg: ServeConfig, client: Client, capacity_tokens: int):
    """The prefix cache the client's requests meet: the declared hit rate, else an LRU
    of the trace's block hashes holding as many blocks as one (prefill) engine's KV
    cache, else none."""
    if cfg.prefix_cache_hit_rate is not None:
        return DeclaredHitRate(cfg.prefix_cache_hit_rate)
    if client.block_hashes and any(client.block_hashes) and cfg.trace_block_tokens:
        return BlockLRU(capacity_tokens // cfg.trace_block_tokens, cfg.trace_block_tokens)
    return None


def run_serving(cfg: ServeConfig, *, evidence: Sequence[CostProvider] = (),
                evidence_context: CostQueryContext | None = None,
                cache: StepModelCache | None = None, itl_summary: bool = True
                ) -> SimulationResult:
    """Simulate one deployment. `evidence` are measured providers (ahead of the analytic
    models); `evidence_context` the query context that selects them (runtime, collected
    version, kernel implementations). `itl_summary=False`: no ITL statistics (the
    metrics' `itl_ms` is empty), for callers that read none."""
    cache = cache or StepModelCache()
    model = cfg.model if isinstance(cfg.model, ModelSpec) else load_model_spec(cfg.model)
    system = cfg.system if isinstance(cfg.system, System) else load_system(cfg.system)
    backend = cfg.backend if isinstance(cfg.backend, BackendDefaults) else load_backend(
        cfg.backend, cfg.backend_version, system=system, tp=cfg.pool.plan.devices_per_stage,
        pp=cfg.pool.plan.pp)
    context = evidence_context or CostQueryContext(runtime=backend.name,
                                                   runtime_revision=cfg.backend_version)
    lengths = LengthDistribution(cfg.isl, cfg.osl, cfg.range_ratio)
    if cfg.mode not in ("agg", "disagg"):
        raise ConfigError(f"unknown mode {cfg.mode!r}", field="mode", expected="agg | disagg")
    if cfg.trace:
        n = cfg.num_requests or len(cfg.trace) - cfg.warmup_requests
        client = TraceClient(cfg.trace, n, cfg.warmup_requests)
    elif cfg.arrival_times_s:
        n = cfg.num_requests or len(cfg.arrival_times_s) - cfg.warmup_requests
        client = OpenLoopClient(lengths, n, arrival_times_s=list(cfg.arrival_times_s),
                                warmup_requests=cfg.warmup_requests, seed=cfg.seed)
    elif cfg.concurrency:
        n = cfg.num_requests or 10 * cfg.concurrency
        client = ClosedLoopClient(cfg.concurrency, lengths, n, cfg.warmup_requests, cfg.seed)
    else:
        n = cfg.num_requests or 200
        client = OpenLoopClient(lengths, n, rate_per_s=cfg.request_rate_per_s,
                                warmup_requests=cfg.warmup_requests, seed=cfg.seed)

    def engines(pool: Pool, role: str) -> tuple[list[Engine], StepCostModel]:
        bk = cfg.decode_backend if role == "decode" and cfg.decode_backend else backend
        step = speculative_step(cache.get(model, pool.plan, system, bk, cfg.precision,
                                          evidence, context, cfg.interpolate, cfg.stack),
                                cfg.speculative)
        capacity = kv_capacity_tokens(step, bk, context_hint=cfg.isl + cfg.osl,
                                      draft_model=cfg.speculative is not None
                                      and cfg.speculative.loads_draft)
        # attention-DP ranks step together (one engine); each rank has its own budget,
        # request limit and KV cache, so the engine's limits scale with dp
        dp = pool.plan.dp
        sched = bk.scheduler
        if role == "decode" and cfg.decode_max_running_requests is not None:
            # a decode worker's step has one token per running request: its budget (the
            # recipes' decode max_num_tokens) is the prefill pool's or its slots, the larger
            slots = cfg.decode_max_running_requests
            sched = replace(sched, max_running_requests=slots,
                            token_budget=max(sched.token_budget, slots))
        if dp > 1:
            sched = replace(sched, token_budget=sched.token_budget * dp,
                            max_running_requests=sched.max_running_requests * dp)
        if sched.client_in_flight:  # the client's connections spread over the replicas
            sched = replace(sched, client_in_flight=-(-sched.client_in_flight // pool.workers))
        if pool.plan.pp > 1:   # PP virtual engines per replica on shared stages
            if cfg.speculative is not None:
                raise ConfigError("speculative decoding with pipeline parallelism is not "
                                  "modelled", field="--speculative", expected="--pp-size 1")
            return [e for i in range(pool.workers) for e in virtual_engines(
                f"{role}{i}", step, sched, bk.kv_cache, capacity, role=role,
                record_trace=cfg.record_trace, explain=cfg.explain)], step
        return [Engine(f"{role}{i}", step, sched, bk.kv_cache, capacity,
                       role=role, record_trace=cfg.record_trace, explain=cfg.explain)
                for i in range(pool.workers)], step

    if cfg.mode == "agg":
        front, _ = engines(cfg.pool, "agg")
        client.prefix_cache = prefix_cache(cfg, client, replica_kv_tokens(front))
        return simulate(client, front, num_gpus=cfg.pool.gpus,
                        frontend_s=backend.overheads.frontend_overhead_s,
                        first_chunk_s=backend.overheads.first_chunk_overhead_s,
                        frontend_service_s=backend.overheads.frontend_request_service_s,
                        itl_summary=itl_summary)
    if cfg.decode_pool is None:
        raise ConfigError("disaggregated mode needs a decode pool", field="decode_pool",
                          expected="decode workers and their layout")
    if cfg.decode_max_running_requests is not None and cfg.decode_max_running_requests < 1:
        raise ConfigError(f"must be >= 1, got {cfg.decode_max_running_requests}",
                          field="--decode-max-running-requests",
                          expected="running requests per decode worker")
    front, pstep = engines(cfg.pool, "prefill")
    back, dstep = engines(cfg.decode_pool, "decode")
    client.prefix_cache = prefix_cache(cfg, client, replica_kv_tokens(front))
    links = kv_links(cfg.pool, cfg.decode_pool, pstep, dstep, system)
    return simulate(client, front, decode_engines=back, kv_transfer=links,
                    frontend_s=backend.overheads.frontend_overhead_s,
                    first_chunk_s=backend.overheads.first_chunk_overhead_s,
                    frontend_service_s=backend.overheads.frontend_request_service_s,
                    handoff_s=backend.overheads.disagg_handoff_s,
                    num_gpus=cfg.pool.gpus + cfg.decode_pool.gpus, itl_summary=itl_summary)
