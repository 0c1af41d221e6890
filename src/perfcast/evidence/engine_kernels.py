"""Measured evidence asked for what the engine would actually run.

`EngineKernelView` sits in front of the measured providers of one deployment
(`evidence.deployment`, for `serve`, `search`, `validate` and `estimate --implementation
auto` alike) and, per query:

1. **version per family**: asks the records of the query's operation family at the
   collected version chosen for that family (`family_versions`: GEMM at 0.24.0 need not
   force MoE and attention to 0.24.0 when 0.19.0 tables are nearer), or, for a data type
   that version lacks, at the nearest version that has it (key `operation@dtype`);
2. **kernel by dispatch**: for operations with engine dispatch rules
   (`evidence/dispatch/<engine>.yaml`), asks the records of the kernel the engine runs for
   this version, GPU architecture, weight format and shape. When the table lacks that
   kernel, the engine's next admissible candidate that the table holds answers and says
   so; a table that names no kernel (one collector label such as `vllm_default`) answers
   with its rows, which are what its engine version dispatched; otherwise the view
   misses and the calibrated analytic model answers. Without a rule, a table with several kernels for the operation answers from
   the one with the most rows, and says so;
3. **corrections**: the measured providers it wraps (`MeasuredView`) correct the answer
   for the chosen kernel (`evidence.importers.aiconfigurator_corrections`: the harness
   fixed cost under CUDA graphs among them);
4. **plausibility**: flags an answer more than `plausibility.SLOW_FACTOR` times its
   roofline time plus one launch.

Each step that changes or qualifies an answer adds an assumption; the provider's name
and revision stay the wrapped provider's, so provenance is unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from perfcast.evidence.contracts import CostQuery, Miss
from perfcast.evidence.measured_view import evidence_dtype
from perfcast.evidence.plausibility import screen_latency
from perfcast.evidence.work_model import matrix_peak


class EngineKernelView:
    def __init__(self, inner, *, system, engine_version: str,
                 family_versions: dict[str, str] | None = None,
                 held: dict[str, tuple[str, ...]] | None = None,
                 dispatch=None, model_type: str | None = None) -> None:
        """`held`: per `operation@dtype`, the kernels the tables hold, most rows first;
        `family_versions`: collected version per operation, or per `operation@dtype`
        where that differs; `dispatch`: the engine's `KernelDispatch` (None: no rules);
        `model_type`: the checkpoint's, for rules that exclude model types."""
        self.inner = inner
        self.name = inner.name
        self.revision = inner.revision
        self.system = system
        self.engine_version = engine_version
        self.family_versions = dict(family_versions or {})
        self.held = dict(held or {})
        self.dispatch = dispatch
        self.model_type = model_type
        self._contexts: dict[tuple, object] = {}
        self._asked: dict[tuple, tuple] = {}
        self._digest = ""

    @property
    def digest(self) -> str:
        """What decides its answers: the wrapped provider, the engine version and the
        rule set that covers it, the family versions, the held kernels, the model type."""
        if not self._digest:
            from perfcast.core.canonical import content_digest
            from perfcast.evidence.contracts import provider_digest

            rules = self.dispatch.rule_set(self.engine_version) if self.dispatch else None
            self._digest = content_digest("perfcast.EngineKernelView", [
                provider_digest(self.inner), self.system.digest, self.engine_version,
                self.dispatch.engine if self.dispatch else "",
                rules.name if rules else "", sorted(self.family_versions.items()),
                sorted((k, list(v)) for k, v in self.held.items()), self.model_type or ""])
        return self._digest

    # -- query rewriting ---------------------------------------------------------------
    def _kernel(self, query: CostQuery, dtype: str) -> tuple[str | None, str, str]:
        """(kernel or None to keep the context's, note, miss reason)."""
        op = query.operation
        kernels = self.held.get(f"{op}@{dtype}", ())
        if self.dispatch is None or not kernels:
            return None, "", ""
        dims = query.dims
        m, n, k = (dims.get(d) for d in ("m", "n", "k"))
        choice = self.dispatch.choose(
            version=self.engine_version, device=self.system.name, operation=op,
            weight_format=dtype, m=m if isinstance(m, int) else None,
            n=n if isinstance(n, int) else None, k=k if isinstance(k, int) else None,
            model_type=self.model_type)
        if choice is None:
            if len(kernels) == 1:
                return None, "", ""
            why = self.dispatch.why_not(version=self.engine_version, device=self.system.name,
                                        operation=op, weight_format=dtype)
            return None, (f"{op} at {dtype}: {why}; the kernel with the most measured rows "
                          f"({kernels[0]}) of {len(kernels)} answers"), ""
        if choice.kernel in kernels:
            return choice.kernel, f"{op} at {dtype}: {choice.describe()}", ""
        for alt in choice.candidates:
            if alt in kernels:
                return alt, (f"{op} at {dtype}: the engine runs {choice.kernel} (rule "
                             f"{choice.rule}), which the tables lack; nearest admissible "
                             f"measured kernel of the same family: {alt}"), ""
        if len(kernels) == 1:
            # a collector label, not a kernel name: the rows are what the engine of the
            # table's version dispatched for each shape
            return kernels[0], (f"{op} at {dtype}: the engine runs {choice.kernel} (rule "
                                f"{choice.rule}); the table names no kernel ({kernels[0]!r}): "
                                "its rows are what its engine version dispatched per shape"), ""
        return None, "", (f"{op} at {dtype}: the engine runs {choice.kernel} (rule "
                          f"{choice.rule}); the tables hold none of its candidates "
                          f"({', '.join(kernels)})")

    def _context(self, ctx, op: str, dtype: str, kernel: str | None):
        version = self.family_versions.get(f"{op}@{dtype}") or \
            self.family_versions.get(op, ctx.runtime_revision)
        if kernel is None and version == ctx.runtime_revision:
            return ctx
        key = (ctx.digest, op, dtype, kernel, version)
        hit = self._contexts.get(key)
        if hit is not None:
            return hit
        impls = ctx.implementations.replace(**{f"{op}@{dtype}": kernel}) if kernel \
            else ctx.implementations
        new = replace(ctx, runtime_revision=version, implementations=impls)
        self._contexts[key] = new
        return new

    def _ask(self, query: CostQuery) -> tuple[CostQuery, str, str, str]:
        """(query for the tables, note, dtype, miss reason)."""
        key = (query.operation, query.dtype, query.dims, query.context.digest,
               tuple(t.dtype for t in query.inputs[1:2]))
        hit = self._asked.get(key)
        if hit is not None:
            q_ctx, note, dtype, miss = hit   # q_ctx None: the query's own context
            return (query if q_ctx is None else replace(query, context=q_ctx),
                    note, dtype, miss)
        dtype = evidence_dtype(query)
        kernel, note, miss = self._kernel(query, dtype)
        ctx = self._context(query.context, query.operation, dtype, kernel)
        if len(self._asked) > 65536:
            self._asked.clear()
        self._asked[key] = (None if ctx is query.context else ctx, note, dtype, miss)
        return (query if ctx is query.context else replace(query, context=ctx)), note, dtype, miss

    # -- provider protocol --------------------------------------------------------------
    def supports(self, query: CostQuery):
        q, _, _, miss = self._ask(query)
        if miss:
            return Miss(miss)
        return self.inner.supports(q)

    def estimate(self, query: CostQuery):
        q, note, dtype, miss = self._ask(query)
        if miss:
            return Miss(miss)
        answer = self.inner.estimate(q)
        if isinstance(answer, Miss):
            return answer
        notes = [note] if note else []
        flag = self._screen(query, answer.latency_s)
        notes += [flag] if flag else []
        if notes:
            answer = replace(answer, assumptions=(*answer.assumptions, *notes))
        return answer

    def _memory_bound_s(self, query: CostQuery) -> float:
        return (query.bytes_read + query.bytes_written) / self.system.device.memory.bw_bytes_per_s

    def _screen(self, query: CostQuery, latency_s: float) -> str:
        if not query.flops and not (query.bytes_read + query.bytes_written):
            return ""
        try:
            compute = query.flops / matrix_peak(self.system, query.dtype) if query.flops else 0.0
        except (LookupError, ValueError):
            compute = 0.0
        roofline = max(compute, self._memory_bound_s(query))
        return screen_latency(latency_s, roofline, self.system.device.launch_overhead_s)
