"""Step cost model: the latency of one engine iteration for any batch composition.

An iteration runs `decode` requests (one new token each, over their cached context)
and prefill chunks (`q` new tokens over `c` cached ones) together. Its latency is the
resolver-costed task graph of that batch, split into two additive parts:

* context-free tasks (every task whose work has no `kv_len` axis: GEMMs, norms,
  collectives, ...). They depend on the step's token count `T` and, through the LM
  head, on the number of sequences `R` that need logits:
  `free(T, R) = body(T) + head(R)` with `body(T)` the tasks of one T-token sequence
  and `head(R) = free(R tokens, R seqs) - body(R)` (exact for additive task costs);
* context tasks (attention): one term per segment, `attn_decode(R, ctx)` for the
  decode requests (at their mean context, exact for a memory-bound kernel) and
  `attn_prefill(q, c)` per chunk.

Each term comes from building and costing the real graph of a small batch (never
per token) and is cached by its shape key. With `interpolate=True` (the default) the
terms are sampled on a geometric grid of token counts and contexts (1, 2, 3, 4, 6, 8,
12, ...) and linearly interpolated between grid nodes, so a simulation of thousands
of steps costs a few dozen graphs. Kernel-launch cost is added per kernel from the
backend file: replayed CUDA graphs pay `kernel_launch_graph_s`, eager steps
`kernel_launch_eager_s`; the host's per-iteration work is added on top, or overlapped
with the GPU's (the longer of the two) for engines with an overlap scheduler.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from perfcast.evidence.contracts import CostQueryContext
from perfcast.evidence.queries import query_for_task
from perfcast.evidence.resolver import CostResolver
from perfcast.hardware import System
from perfcast.serving.backends import CudaGraphConfig, Overheads
from perfcast.workload import Batch, BatchSegment, ModelSpec, ParallelPlan, Precision, TaskKind
from perfcast.workload.build import build_task_graph
from perfcast.workload.stacks import OpStack, resolve_mla_call, resolve_stack


def grid_nodes(limit: int, *, with_zero: bool = False) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ... up to the first node >= limit."""
    nodes = [0] if with_zero else []
    x = 1
    while True:
        for v in (x, x + x // 2) if x >= 2 else (x,):
            nodes.append(v)
            if v >= limit:
                return nodes
        x *= 2


_NODES = grid_nodes(1 << 26)
_NODES0 = [0, *_NODES]
# longest decode run StepCostModel.decode_run_head returns: numpy sums arrays of up to 7
# floats one after another (longer ones pairwise), so plain sums match them bit for bit
RUN_HEAD_MAX = 7
RUN_NODES_MAX = 4096   # bound of StepCostModel's node arrays for decode runs


@dataclass(frozen=True)
class Part:
    """Kernel time, kernel count and the communication share of the kernel time (the
    collective tasks) of one additive term of a step."""

    kernel_s: float
    kernels: float
    comm_s: float = 0.0

    def __add__(self, other: Part) -> Part:
        return Part(self.kernel_s + other.kernel_s, self.kernels + other.kernels,
                    self.comm_s + other.comm_s)

    def __sub__(self, other: Part) -> Part:
        return Part(self.kernel_s - other.kernel_s, self.kernels - other.kernels,
                    self.comm_s - other.comm_s)

    def scaled(self, w: float) -> Part:
        return Part(self.kernel_s * w, self.kernels * w, self.comm_s * w)


ZERO = Part(0.0, 0.0)


def weighted_sum(terms) -> Part:
    """`ZERO + p1.scaled(w1) + p2.scaled(w2) + ...` of (part, weight) pairs; for plain
    Parts in floats, the same operations in the same order (bit-identical)."""
    k = n = c = 0.0
    for p, w in terms:
        if type(p) is not Part:   # a subclass (e.g. a stage split) adds its own way
            out = ZERO
            for q, v in terms:
                out = out + q.scaled(v)
            return out
        k = k + p.kernel_s * w
        n = n + p.kernels * w
        c = c + p.comm_s * w
    return Part(k, n, c)


def part_sum(terms) -> Part:
    """`p1 + p2 + ...` of at least one part; for plain Parts in floats (bit-identical)."""
    first = terms[0]
    if type(first) is Part:
        k, n, c = first.kernel_s, first.kernels, first.comm_s
        for p in terms[1:]:
            if type(p) is not Part:
                break
            k = k + p.kernel_s
            n = n + p.kernels
            c = c + p.comm_s
        else:
            return Part(k, n, c)
    out = first
    for p in terms[1:]:
        out = out + p
    return out


def graph_part(tasks, resolver: CostResolver, system_name: str,
               context: CostQueryContext, keep=None) -> Part:
    """Kernel time, kernel count and communication time of `tasks`, costed by `resolver`
    (views and zero-cost tasks left out; `keep`, when given, selects tasks)."""
    latency = n = comm = 0.0
    for task, latency_s in costed_tasks(tasks, resolver, system_name, context, keep):
        latency += latency_s * task.count
        n += task.count
        if task.kind is TaskKind.COMMUNICATION:
            comm += latency_s * task.count
    return Part(latency, n, comm)


def costed_tasks(tasks, resolver: CostResolver, system_name: str, context: CostQueryContext,
                 keep=None):
    """(task, latency of one call) of the tasks `graph_part` adds up."""
    for task in tasks:
        if task.kind is TaskKind.VIEW or (keep is not None and not keep(task)):
            continue
        est = resolver.resolve(query_for_task(task, system_name, context)).estimate
        if est.latency_s != 0.0:
            yield task, est.latency_s


# built graphs by content: (model, plan, precision, stack, batch segments) -> their tasks split
# into the context-free and the context half, and the graph's memory facts. Deployments
# that differ only in evidence or engine (backend versions, the layouts of a search
# sharing a plan) build each batch's graph once; bounded (least recently used out).
# Most builds are asked for their context half only (attention at a grid node: 1-2
# tasks, ~3-8 KiB kept, against ~26-79 KiB with the context-free half of a 70B dense,
# 30B MoE or DeepSeek-V3 decode graph), so the bound holds the ~5,300 distinct graphs
# of the H100 silicon file.
_BUILT: OrderedDict = OrderedDict()
BUILT_GRAPHS_MAX = 8192


def built_halves(model: ModelSpec, plan: ParallelPlan, precision: Precision | None,
                 batch: Batch, segments: tuple, stack: OpStack | None = None, *,
                 keep_free: bool = True) -> tuple[tuple[list | None, list], object]:
    """((context-free tasks, context tasks), memory facts) of `batch`'s graph, whose
    segments' (requests, q tokens, context tokens) are `segments`, under `stack`
    (`perfcast.workload.stacks`; None: `default`) and its MLA call. `keep_free=False`:
    the caller needs the context half only, and the context-free one may be None (not
    kept); a later call that needs it builds the graph again."""
    key = (model.digest, plan.digest, precision, None if stack is None else stack.name,
           batch.phase, segments)
    hit = _BUILT.get(key)
    if hit is not None and (hit[0][0] is not None or not keep_free):
        _BUILT.move_to_end(key)
        return hit
    graph = build_task_graph(model, plan, batch, precision, **stack_options(stack))
    free, ctx = [], []
    for t in graph.tasks:
        (ctx if "kv_len" in t.work.axes else free).append(t)
    hit = _BUILT[key] = ((free if keep_free else None, ctx), graph.memory)
    _BUILT.move_to_end(key)
    if len(_BUILT) > BUILT_GRAPHS_MAX:
        _BUILT.popitem(last=False)
    return hit


def stack_options(stack: OpStack | None) -> dict:
    """The `build_task_graph` options of a serving step under `stack` (None: the
    builder's defaults): the stack and its MLA call, resolved as `perfcast estimate`
    resolves `--mla-call auto` (`stacks.resolve_mla_call`)."""
    if stack is None:
        return {}
    return {"stack": stack, "mla_call": resolve_mla_call("auto", stack)}


@dataclass(frozen=True)
class StepShape:
    """What one iteration computes: decode requests at a mean context, prefill chunks."""

    decode_requests: int = 0
    decode_context: float = 0.0
    prefill: tuple[tuple[int, int], ...] = ()  # (q_tokens, context_tokens) per chunk

    @property
    def tokens(self) -> int:
        n = self.decode_requests
        for q, _ in self.prefill:
            n += q
        return n

    @property
    def sequences(self) -> int:
        return self.decode_requests + len(self.prefill)


class StepCostModel:
    """Latency of engine iterations of one deployment (model, plan, precision, system)."""

    def __init__(self, model: ModelSpec, plan: ParallelPlan, system: System,
                 resolver: CostResolver, *, precision: Precision | None = None,
                 context: CostQueryContext | None = None, overheads: Overheads | None = None,
                 cuda_graph: CudaGraphConfig | None = None, interpolate: bool = True,
                 graph_cache: dict | None = None, terms_cache: dict | None = None,
                 stack: str | OpStack = "auto") -> None:
        """`graph_cache`: costed graphs shared by step models of the same deployment and
        resolver that differ only in overheads or CUDA-graph settings; `terms_cache`:
        their exact and interpolated terms (which depend on neither), for models that
        also share `interpolate` (serving.deploy.StepModelCache). `stack`: the operator
        conventions every graph is built with (`perfcast.workload.stacks`; `auto` picks
        them from the device vendor, as `perfcast estimate --stack auto` does)."""
        self.stack = stack if isinstance(stack, OpStack) else resolve_stack(
            stack, system.device.vendor)
        self.graph_options = stack_options(self.stack)
        self.model = model
        self.plan = plan
        self.system = system
        self.resolver = resolver
        self.precision = precision
        self.context = context or CostQueryContext()
        self.overheads = overheads or Overheads()
        self.cuda_graph = cuda_graph or CudaGraphConfig()
        self.interpolate = interpolate
        self._graphs: dict[tuple, tuple[Part, Part]] = {} if graph_cache is None else graph_cache
        self._memory = None
        self.graphs_built = 0
        self.dp = plan.dp
        # memo of terms by primitive shape keys
        self._terms: dict[tuple, Part] = {} if terms_cache is None else terms_cache
        self._last_parts: tuple = (None, None, None)
        self._fixed: dict[int, tuple] = {}   # _decode_fixed's, by requests
        self._decode_ys: dict[int, dict[int, float]] = {}      # its grid-node latencies
        self._run_nodes: dict[tuple, tuple] = {}   # decode_run_s's node arrays, by segment
        self._padded: dict[int, int | None] = {}   # graph_padded's sizes, by token count
        cls = type(self)   # decode_run_head mirrors these two (not a subclass's own)
        self._run_head = interpolate and cls.decode_run_s is StepCostModel.decode_run_s \
            and cls.with_host is StepCostModel.with_host
        # _decode_gpu_at mirrors these (not a subclass's own)
        self._plain_decode = interpolate and all(
            getattr(cls, name) is getattr(StepCostModel, name)
            for name in ("attn_decode", "context_term", "_interp2", "_bilinear_terms",
                         "_bracket", "gpu_s", "attn_decode_exact"))

    # -- exact terms (one costed graph per key) -----------------------------------------
    def _split(self, batch: Batch, context_tasks: bool) -> Part:
        """Kernel time and count of the context tasks (those with a `kv_len` axis) or of
        the context-free ones, of one batch's graph; only that half is resolved."""
        key = (context_tasks,) + tuple((s.num_requests, s.q_tokens, s.context_tokens)
                                       for s in batch.segments)
        hit = self._graphs.get(key)
        if hit is not None:
            return hit
        # a context-free term builds batches at context 0 or 1 only (body: prefill at
        # context 0, head: decode at context 1): of any other batch only the context
        # half is kept
        halves, memory = built_halves(self.model, self.plan, self.precision, batch, key[1:],
                                      self.stack, keep_free=not context_tasks or all(
                                          c <= 1 for _, _, c in key[1:]))
        out = self._part_of(halves[context_tasks])
        if self._memory is None:
            self._memory = memory
        self.graphs_built += 1
        self._graphs[key] = out
        return out

    def _part_of(self, tasks) -> Part:
        """The term of costed tasks (serving.pipeline keeps it split by stage)."""
        return graph_part(tasks, self.resolver, self.system.name, self.context)

    def _memo(self, key: tuple, fn) -> Part:
        hit = self._terms.get(key)
        if hit is None:
            hit = self._terms[key] = fn()
        return hit

    def body_exact(self, tokens: int) -> Part:
        """Context-free tasks when every attention-DP rank computes `tokens` tokens."""
        key = ("body", tokens)
        hit = self._terms.get(key)
        if hit is None:
            hit = self._terms[key] = self._split(Batch.prefill(self.dp, tokens), False)
        return hit

    def head_exact(self, sequences: int) -> Part:
        if sequences <= 1:
            return ZERO
        key = ("head", sequences)
        hit = self._terms.get(key)
        if hit is None:
            per_rank = -(-sequences // self.dp)
            hit = self._terms[key] = self._split(Batch.decode(sequences, 1), False) \
                - self.body_exact(per_rank)
        return hit

    def attn_decode_exact(self, requests: int, context: int) -> Part:
        key = ("dec", requests, context)
        hit = self._terms.get(key)
        if hit is None:
            hit = self._terms[key] = self._split(Batch.decode(requests, max(context, 1)), True)
        return hit

    def attn_prefill_exact(self, q_tokens: int, context: int) -> Part:
        """Attention of one chunk on one rank."""
        key = ("pre", q_tokens, context)
        hit = self._terms.get(key)
        if hit is None:
            hit = self._terms[key] = self._split(Batch.prefill(self.dp, q_tokens, context), True)
        return hit

    # -- interpolated terms ---------------------------------------------------------------
    @staticmethod
    def _bracket(x: float, with_zero: bool = False) -> tuple[int, int, float]:
        nodes = _NODES0 if with_zero else _NODES
        i = bisect.bisect_left(nodes, x)
        if nodes[i] == x or i == 0:
            return nodes[i], nodes[i], 0.0
        lo, hi = nodes[i - 1], nodes[i]
        return lo, hi, (x - lo) / (hi - lo)

    def _interp1(self, fn, x: float, with_zero: bool = False) -> Part:
        if not self.interpolate:
            return fn(int(round(x)))
        lo, hi, w = self._bracket(x, with_zero)
        if w == 0.0:
            return fn(lo)
        a, b = fn(lo), fn(hi)
        if type(a) is Part and type(b) is Part:   # the Part arithmetic below, unrolled
            u = 1 - w
            return Part(a.kernel_s * u + b.kernel_s * w, a.kernels * u + b.kernels * w,
                        a.comm_s * u + b.comm_s * w)
        return a.scaled(1 - w) + b.scaled(w)

    def _interp2(self, fn, x: float, y: float, *, y_with_zero: bool = False) -> Part:
        """Bilinear interpolation of `fn(x, y)` between the grid nodes bracketing x and y."""
        return weighted_sum(self._bilinear_terms(fn, x, y, y_with_zero))

    def _bilinear_terms(self, fn, x: float, y: float, y_with_zero: bool = False) -> list:
        """(fn at a grid node, weight) of `_interp2`, nodes of weight 0 left out."""
        x0, x1, wx = self._bracket(x)
        y0, y1, wy = self._bracket(y, with_zero=y_with_zero)
        terms = []
        for xi, a in ((x0, 1 - wx), (x1, wx)):
            if a == 0.0:
                continue
            for yi, b in ((y0, 1 - wy), (y1, wy)):
                if b == 0.0:
                    continue
                terms.append((fn(xi, yi), a * b))
        return terms

    def body(self, tokens: int) -> Part:
        hit = self._terms.get(("ibody", tokens))
        if hit is None:
            hit = self._terms[("ibody", tokens)] = self._interp1(self.body_exact, tokens)
        return hit

    def head(self, sequences: int) -> Part:
        hit = self._terms.get(("ihead", sequences))
        if hit is None:
            hit = self._terms[("ihead", sequences)] = self._interp1(self.head_exact, sequences)
        return hit

    def attn_decode(self, requests: int, context: float) -> Part:
        return self.context_term(self.attn_decode_exact, requests, context)

    def context_term(self, exact, requests: int, context: float) -> Part:
        """`exact(requests, context)` at a mean context: rounded without interpolation,
        else interpolated between grid nodes; ZERO without requests."""
        if requests <= 0:
            return ZERO
        if not self.interpolate:
            return exact(requests, int(round(context)))
        return self._interp2(exact, requests, max(context, 1.0))

    def attn_prefill(self, q_tokens: int, context: int) -> Part:
        if not self.interpolate:
            return self.attn_prefill_exact(q_tokens, context)
        key = ("ipre", q_tokens, context)
        hit = self._terms.get(key)
        if hit is None:
            hit = self._terms[key] = self._interp2(self.attn_prefill_exact, q_tokens, context,
                                                   y_with_zero=True)
        return hit

    # -- whole steps ------------------------------------------------------------------------
    def busiest_rank(self, shape: StepShape) -> tuple[int, tuple[tuple[int, int], ...]]:
        """(tokens, prefill chunks) of the most loaded attention-DP rank: decodes split
        evenly, chunks placed greedily on the least loaded rank (largest first)."""
        if self.dp == 1:
            return shape.tokens, shape.prefill
        decode = -(-shape.decode_requests // self.dp)
        loads = [decode] * self.dp
        placed: list[list[tuple[int, int]]] = [[] for _ in range(self.dp)]
        for chunk in sorted(shape.prefill, reverse=True):
            i = min(range(self.dp), key=loads.__getitem__)
            loads[i] += chunk[0]
            placed[i].append(chunk)
        i = max(range(self.dp), key=loads.__getitem__)
        return loads[i], tuple(placed[i])

    def graph_padded(self, shape: StepShape, rank_tokens: int | None = None) -> int | None:
        """Per-rank token count of the CUDA graph that replays this step, or None."""
        if self.cuda_graph.max_batch <= 0:
            return None
        if shape.prefill and self.cuda_graph.decode_only:
            return None
        if rank_tokens is None:
            rank_tokens = self.busiest_rank(shape)[0]
        hit = self._padded.get(rank_tokens, 0)
        if hit == 0:
            hit = self._padded[rank_tokens] = self.cuda_graph.padded(rank_tokens)
        return hit

    def kernel_parts(self, shape: StepShape) -> tuple[Part, int | None]:
        tokens, chunks = self.busiest_rank(shape)
        padded = self.graph_padded(shape, tokens)
        terms = [self.body(padded or tokens), self.head(max(shape.sequences, 1))]
        requests = shape.decode_requests
        if requests > 0 and self._plain_decode:   # attn_decode, unrolled (same floats)
            context = shape.decode_context
            sums = self._attn_decode_sums(requests, context if context >= 1.0 else 1.0)
            terms.append(Part(*sums) if sums is not None
                         else self.attn_decode(requests, context))
        elif requests:
            terms.append(self.attn_decode(requests, shape.decode_context))
        for q, c in chunks:
            terms.append(self.attn_prefill(q, c))
        return part_sum(terms), padded

    def step_s(self, shape: StepShape) -> float:
        """Latency of one iteration, host overheads included."""
        if shape.tokens <= 0:
            raise ValueError("an engine step needs at least one token")
        part, padded = self.kernel_parts(shape)
        self._last_parts = (shape, part, padded)   # iteration_split of the same step
        return float(self.with_host(self.gpu_s(part, padded), shape.sequences))

    def gpu_s(self, part: Part, padded: int | None) -> float:
        """GPU time of an iteration's kernels: kernel time plus the gap each launch
        leaves (replayed CUDA graph or eager launch)."""
        ov = self.overheads
        launch = ov.kernel_launch_graph_s if padded else ov.kernel_launch_eager_s
        return part.kernel_s + part.kernels * launch

    def with_host(self, gpu_s, sequences: int):
        """Iteration time from its GPU time and the host's per-iteration work
        (`step_overhead_s + per_request_overhead_s x sequences`: scheduling, input
        preparation, sampling bookkeeping, response handling). An engine whose host
        prepares iteration n+1 while n runs (`host_overlapped` in the backend file:
        TRT-LLM's overlap scheduler, vLLM's async scheduling from 0.14) takes the longer
        of the two; otherwise they add up. Works on floats and numpy arrays."""
        ov = self.overheads
        host = ov.step_overhead_s + ov.per_request_overhead_s * sequences
        if not ov.host_overlapped:
            return gpu_s + host
        if type(gpu_s) is float:   # np.maximum's value, without a numpy scalar
            return gpu_s if gpu_s >= host else host
        return np.maximum(gpu_s, host)

    def iteration_split(self, shape: StepShape, total_s: float,
                        steps: int = 1) -> tuple[float, float, float, float]:
        """(compute, communication, kernel launch, host) seconds of `steps` iterations
        of `shape` that took `total_s` together; they add up to `total_s`. Host time
        counts whole without an overlap scheduler and only its excess over the GPU time
        with one. For a decode run (`steps` > 1) the per-step parts are those of its
        first step (communication, launch and host time do not depend on the context);
        compute is the remainder."""
        last = self._last_parts
        part, padded = last[1:] if last[0] is shape else self.kernel_parts(shape)
        ov = self.overheads
        launch = part.kernels * (ov.kernel_launch_graph_s if padded else ov.kernel_launch_eager_s)
        host = ov.step_overhead_s + ov.per_request_overhead_s * shape.sequences
        if ov.host_overlapped:
            host = max(0.0, host - (part.kernel_s + launch))
        comm_t, launch_t, host_t = part.comm_s * steps, launch * steps, host * steps
        compute = max(0.0, total_s - comm_t - launch_t - host_t)
        return compute, comm_t, launch_t, total_s - compute - comm_t - launch_t

    def decode_run_s(self, requests: int, context0: float, steps: int) -> np.ndarray:
        """Latencies of `steps` consecutive decode-only iterations of `requests` requests
        whose mean context starts at `context0` and grows by one token per step."""
        if steps <= 0:
            return np.zeros(0)
        contexts = context0 + np.arange(steps, dtype=float)
        fixed, padded, _ = self._decode_fixed(requests, context0)
        if not self.interpolate or steps <= 2:
            return self.with_host(np.array([
                self.gpu_s(fixed + self.attn_decode(requests, float(c)), padded)
                for c in contexts]), requests)
        lo_c = max(contexts[0], 1.0)
        hi_c = max(contexts[-1], 1.0)
        i0 = max(bisect.bisect_right(_NODES, lo_c) - 1, 0)
        i1 = bisect.bisect_left(_NODES, hi_c)
        key = (requests, i0, i1)
        arrays = self._run_nodes.get(key)
        if arrays is None:   # the latencies at the grid nodes of the run, kept per segment
            nodes = _NODES[i0: i1 + 1]
            arrays = (np.array(nodes, dtype=float),
                      np.array([self._node_latency(requests, n, fixed, padded) for n in nodes]))
            if len(self._run_nodes) >= RUN_NODES_MAX:
                self._run_nodes.clear()
            self._run_nodes[key] = arrays
        xs, ys = arrays
        return self.with_host(np.interp(np.maximum(contexts, 1.0), xs, ys), requests)

    def _decode_fixed(self, requests: int, context0: float) -> tuple[Part, int | None, float]:
        """(context-free terms, CUDA-graph size, host seconds) of a decode-only iteration
        of `requests` requests (none depends on the context), kept per request count."""
        hit = self._fixed.get(requests)
        if hit is None:
            padded = self.graph_padded(StepShape(requests, context0))
            fixed = self.body(padded or -(-requests // self.dp)) + self.head(requests)
            ov = self.overheads
            hit = self._fixed[requests] = (
                fixed, padded, ov.step_overhead_s + ov.per_request_overhead_s * requests)
        return hit

    def decode_run_head(self, requests: int, context0: float, steps: int, clock: float,
                        limit: float) -> list[float] | None:
        """The iterations of `decode_run_s(requests, context0, steps)` that start before
        `limit` (at least one) when there are at most RUN_HEAD_MAX of them, in plain
        floats and bit-identical to the array path (same interpolation formula, same
        sequential sums as numpy's for short arrays); None when there are more, without
        interpolation, or for a subclass with its own decode_run_s or with_host. Only the
        grid nodes of the steps returned are costed (terms are pure: costing fewer, or
        in another order, changes no value)."""
        if not self._run_head:
            return None
        fixed, padded, host = self._decode_fixed(requests, context0)
        overlapped = self.overheads.host_overlapped
        ys = self._decode_ys.get(requests)
        if ys is None:
            ys = self._decode_ys[requests] = {}
        out: list[float] = []
        cum = 0.0
        for i in range(steps):
            if i and clock + cum >= limit:
                break
            if i == RUN_HEAD_MAX:
                return None
            c = context0 + float(i)
            if steps <= 2:   # each step at its own context, as decode_run_s costs them
                g = self._decode_gpu_at(requests, c, fixed, padded)
            else:   # np.interp's formula on the grid segment of the context
                x = c if c >= 1.0 else 1.0
                j = bisect.bisect_right(_NODES, x) - 1
                x0 = _NODES[j]
                y0 = ys.get(x0)
                if y0 is None:
                    y0 = ys[x0] = self._node_latency(requests, x0, fixed, padded)
                if x == x0:
                    g = y0
                else:
                    x1 = _NODES[j + 1]
                    y1 = ys.get(x1)
                    if y1 is None:
                        y1 = ys[x1] = self._node_latency(requests, x1, fixed, padded)
                    g = (y1 - y0) / (x1 - x0) * (x - x0) + y0
            d = (g if g >= host else host) if overlapped else g + host
            out.append(d)
            cum = d if i == 0 else cum + d
        return out

    def _decode_gpu_at(self, requests: int, context: float, fixed: Part,
                       padded: int | None) -> float:
        """`gpu_s(fixed + attn_decode(requests, context), padded)` with the interpolation
        of `context_term` / `weighted_sum` unrolled in floats for plain Parts (the same
        operations in the same order; the communication share is not needed)."""
        if not self._plain_decode or requests <= 0 or type(fixed) is not Part:
            return self.gpu_s(fixed + self.attn_decode(requests, context), padded)
        sums = self._attn_decode_sums(requests, context if context >= 1.0 else 1.0)
        if sums is None:
            return self.gpu_s(fixed + self.attn_decode(requests, context), padded)
        k, n, _ = sums
        ov = self.overheads
        launch = ov.kernel_launch_graph_s if padded else ov.kernel_launch_eager_s
        return (fixed.kernel_s + k) + (fixed.kernels + n) * launch

    def _attn_decode_sums(self, requests: int, y: float) -> tuple[float, float, float] | None:
        """(kernel_s, kernels, comm_s) of `attn_decode(requests, y)` (y >= 1, requests
        > 0, interpolating): `_bracket`, `_bilinear_terms` and `weighted_sum` unrolled in
        floats (no term list, no Part per term), the same operations in the same order;
        None when a grid node's term is not a plain Part (the caller takes the generic
        path)."""
        bracket = self._bracket
        x0, x1, wx = bracket(requests)
        y0, y1, wy = bracket(y)
        exact = self.attn_decode_exact
        k = n = c = 0.0
        for xi, a in ((x0, 1 - wx), (x1, wx)):
            if a == 0.0:
                continue
            for yi, b in ((y0, 1 - wy), (y1, wy)):
                if b == 0.0:
                    continue
                p = exact(xi, yi)
                if type(p) is not Part:
                    return None
                w = a * b
                k = k + p.kernel_s * w
                n = n + p.kernels * w
                c = c + p.comm_s * w
        return k, n, c

    def _node_latency(self, requests: int, node: int, fixed: Part, padded: int | None) -> float:
        """GPU seconds of a decode-only iteration at a context grid node (decode_run_s's
        node values)."""
        return self.gpu_s(fixed + self._memo(("idec", requests, node),
                                             lambda: self.attn_decode(requests, node)), padded)

    # -- memory facts -----------------------------------------------------------------------
    def memory_facts(self):
        """MemoryFacts of the deployment (weights, KV bytes per token per device)."""
        if self._memory is None:
            probe = Batch.decode(max(self.plan.dp, 1), 1024)
            self._memory = build_task_graph(self.model, self.plan, probe, self.precision,
                                            **self.graph_options).memory
        return self._memory


def as_batch(shape: StepShape) -> Batch:
    """The workload Batch of a step shape (for `perfcast estimate`-style inspection)."""
    segs = []
    if shape.decode_requests:
        segs.append(BatchSegment(shape.decode_requests, 1, max(int(round(shape.decode_context)), 1)))
    segs.extend(BatchSegment(1, q, c) for q, c in shape.prefill)
    return Batch.mixed(tuple(segs)) if len(segs) > 1 else Batch(tuple(segs),
                                                                  "decode" if shape.decode_requests else "prefill")
