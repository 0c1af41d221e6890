"""`collect grid`: append theory shape rows (empty durations) for target models.

A database with an `op_mapping.yaml` (one the profiling model reads) gets the rows its
estimates look up (`query_grid_rows`): for every target model, layout (`tp_sizes` x
`ep_sizes`, EP only for MoE models and dividing TP) and step (prefill `batch x length`,
decode `batch x context`) the task graph is built as `perfcast estimate` builds it, and
each task's call is asked which kernel rows its lookup reads (`collect.query_rows`,
through the mapping and the query paths). Only calls whose lookup needs no row (zero
cost, accepted miss) or cannot have one (unmapped, no decomposer, an opaque kernel keyed
by runtime columns: `mlapo_quant`'s `mla_preprocess_0_mix_aic`) write nothing; they
are counted in `GridResult.no_row`.

A database without a mapping (torch-profiler kernels from `collect parse`) gets the
per-kernel-type grid below. For every CSV already in the database whose kernel type has a writable layout
(kernel_types.yaml), candidate axes come from the target models' configs across TP degrees:

* GEMM: m from a dense small-m grid up to 32768; (n, k) from each model's projections
  (qkv, o, gate_up, down, lm_head) at every TP degree that divides them;
* grouped GEMM (MoE experts, `GroupedMatmul`): m (routed rows) from the GEMM m grid x
  each MoE model's expert projections (gate_up (2I, H), down (H, I)) with E/ep local
  experts at every EP degree and I/tp at every TP degree;
* attention (SDPA and FusedInferAttentionScore): batch x (prefill q = kv, or decode
  q = 1 with kv on a grid uniform in sqrt space) x heads / KV heads under TP (FIA rows
  carry kv_len in their `avg_seq_len` column);
* norm / activation / elementwise: tokens x the widths the model uses;
* collectives (`hcom_*.csv`): message bytes in powers of two x the group sizes, dtypes
  and tiers the CSV already holds.

Each candidate is written in the dtypes, formats and arity of the CSV's existing rows
(its templates); candidates already present, or whose tensors exceed `max_memory_gb`,
are dropped; at most `rows` per CSV are kept, sampled with `seed` (deterministic).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfcast.collect.kernel_types import (
    FRACTAL_NZ,
    LAYOUTS,
    KernelTypeSpec,
    fractal_nz_like,
    nd_slots,
    spec_for,
)
from perfcast.collect.parse.torch_trace import INPUT_STRIDES
from perfcast.collect.replay.torch_ops import ASCEND_TO_TORCH_DTYPE
from perfcast.collect.tables import (
    COMM_PREFIX,
    CORE,
    INPUT_DTYPES,
    INPUT_FORMATS,
    INPUT_SHAPES,
    OUTPUT_DTYPES,
    OUTPUT_FORMATS,
    OUTPUT_SHAPES,
    STATE,
    KernelTable,
    format_shapes,
    load_database,
    parse_shapes,
    read_table,
    split_list,
    table_key,
    write_tables,
)
from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.op_mapping import MAPPING_FILE
from perfcast.workload.families.traits import NUM_EXPERTS_KEYS, MoeSpec
from perfcast.workload.model_spec import ModelSpec, builtin_models, load_model_spec

M_GRID = tuple(list(range(1, 17)) + list(range(24, 129, 8)) + [
    160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1536, 2048, 3072, 4096,
    6144, 8192, 12288, 16384, 24576, 32768])
BATCH_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_GRID = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
DECODE_KV_MIN, DECODE_KV_MAX, DECODE_KV_POINTS = 16, 131072, 24
TOKENS_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
MESSAGE_BYTES_GRID = tuple(2 ** e for e in range(10, 31))
TP_SIZES = (1, 2, 4, 8)
EP_SIZES = (1, 2, 4, 8, 16, 32)

_DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8,
                "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


@dataclass(frozen=True)
class GridResult:
    appended: dict[str, int]
    written: tuple[Path, ...]
    calls: int = 0                                   # distinct calls asked (query grid)
    no_row: dict[str, int] = field(default_factory=dict)  # why calls wrote no row


def sqrt_space(lo: int, hi: int, points: int) -> tuple[int, ...]:
    """`points` integers from lo to hi, evenly spaced in sqrt(x) (denser at short contexts,
    where attention cost bends)."""
    a, b = math.sqrt(lo), math.sqrt(hi)
    vals = {round((a + (b - a) * i / (points - 1)) ** 2) for i in range(points)}
    return tuple(sorted(vals))


def gemm_nk(models: Sequence[ModelSpec], tp_sizes: Iterable[int] = TP_SIZES) -> set[tuple[int, int]]:
    """(n, k) of every dense projection of the models at every TP degree dividing it."""
    out = set()
    for m in models:
        d, h = m.head_dim, m.hidden_size
        for tp in tp_sizes:
            if m.num_heads % tp:
                continue
            heads = m.num_heads // tp
            kv = max(1, m.num_kv_heads // tp)
            out.add(((heads + 2 * kv) * d, h))         # qkv_proj
            out.add((h, heads * d))                    # o_proj
            if m.intermediate_size and m.intermediate_size % tp == 0:
                inter = m.intermediate_size // tp
                out.add((2 * inter, h))                # gate_up_proj
                out.add((h, inter))                    # down_proj
            out.add((-(-m.vocab_size // tp), h))       # lm_head (vocab-parallel)
    return out


def grouped_gemm_points(models: Sequence[ModelSpec], tp_sizes: Iterable[int] = TP_SIZES,
                        ep_sizes: Iterable[int] = EP_SIZES) -> set[tuple[int, int, int]]:
    """(local experts, n, k) of the routed-expert GEMMs of every MoE model: E/ep experts of
    full width at each EP degree dividing E, or E experts of width I/tp at each TP degree
    dividing I; gate_up is (n=2I, k=H), down (n=H, k=I)."""
    out = set()
    for m in models:
        if not any(m.raw.get(key) for key in NUM_EXPERTS_KEYS):
            continue
        moe = MoeSpec.from_model(m)
        e, inter, h = moe.num_experts, moe.inter, m.hidden_size
        shards = {(e // ep, inter) for ep in ep_sizes if e % ep == 0}
        shards |= {(e, inter // tp) for tp in tp_sizes if inter % tp == 0}
        for experts, width in shards:
            out.add((experts, 2 * width, h))
            out.add((experts, h, width))
    return out


def attention_points(models: Sequence[ModelSpec], tp_sizes: Iterable[int] = TP_SIZES) -> set[tuple]:
    heads_set = set()
    for m in models:
        for tp in tp_sizes:
            if m.num_heads % tp == 0:
                heads_set.add((m.num_heads // tp, max(1, m.num_kv_heads // tp), m.head_dim))
    decode_kv = sqrt_space(DECODE_KV_MIN, DECODE_KV_MAX, DECODE_KV_POINTS)
    pts = set()
    for heads, kv_heads, d in heads_set:
        for b in BATCH_GRID:
            for s in PREFILL_GRID:
                pts.add((b, s, s, heads, kv_heads, d))
            for kv in decode_kv:
                pts.add((b, 1, kv, heads, kv_heads, d))
    return pts


def elementwise_widths(models: Sequence[ModelSpec], operation: str,
                       tp_sizes: Iterable[int] = TP_SIZES) -> set[int]:
    widths = set()
    for m in models:
        if operation == "activation":
            for tp in tp_sizes:
                if m.intermediate_size and m.intermediate_size % tp == 0:
                    widths |= {m.intermediate_size // tp, 2 * m.intermediate_size // tp}
        else:
            widths.add(m.hidden_size)
    return widths


def candidate_axes(spec: KernelTypeSpec, models: Sequence[ModelSpec],
                   tp_sizes: Sequence[int], ep_sizes: Sequence[int] = EP_SIZES
                   ) -> list[dict[str, int]]:
    layout = spec.layout
    if spec.operation == "gemm" and layout in ("matmul", "addmm", "linear"):
        return [{"m": m, "n": n, "k": k} for n, k in sorted(gemm_nk(models, tp_sizes))
                for m in M_GRID]
    if layout == "grouped_matmul":
        return [{"m": m, "n": n, "k": k, "experts": e}
                for e, n, k in sorted(grouped_gemm_points(models, tp_sizes, ep_sizes))
                for m in M_GRID]
    if spec.operation == "attention" and layout in ("sdpa", "fia"):
        return [{"batch": b, "q_tokens": q, "kv_len": kv, "heads": h, "kv_heads": kvh,
                 "head_dim": d} for b, q, kv, h, kvh, d in sorted(attention_points(models, tp_sizes))]
    if layout == "elementwise":
        return [{"tokens": t, "numel": t * w}
                for w in sorted(elementwise_widths(models, spec.operation, tp_sizes))
                for t in TOKENS_GRID]
    return []


def _bytes(shapes, dtypes) -> float:
    total = 0.0
    for i, s in enumerate(shapes):
        if s is None:
            continue
        dt = ASCEND_TO_TORCH_DTYPE.get(dtypes[i].upper() if i < len(dtypes) else "", "float32")
        total += math.prod(s) * _DTYPE_BYTES.get(dt, 4)
    return total


def strides_like(template_strides, template_shapes, shapes) -> tuple:
    """Dense strides for `shapes` that keep each template tensor's memory order (a
    transposed weight in the template stays transposed in the new row)."""
    out = []
    for i, shape in enumerate(shapes):
        t_st = template_strides[i] if i < len(template_strides) else None
        t_sh = template_shapes[i] if i < len(template_shapes) else None
        if shape is None or not t_st or t_sh is None or len(t_st) != len(shape):
            out.append(None if shape is None else _contiguous(shape))
            continue
        order = sorted(range(len(shape)), key=lambda d: (-t_st[d], d))  # outermost first
        strides = [0] * len(shape)
        step = 1
        for d in reversed(order):
            strides[d] = step
            step *= max(shape[d], 1)
        out.append(tuple(strides))
    return tuple(out)


def _contiguous(shape) -> tuple:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def _templates(table: KernelTable) -> list[dict[str, str]]:
    seen, out = set(), []
    for r in table.rows:
        sig = (len(parse_shapes(r.get(INPUT_SHAPES, ""))), r.get(INPUT_DTYPES, ""),
               r.get(INPUT_FORMATS, ""), r.get(OUTPUT_DTYPES, ""), r.get(OUTPUT_FORMATS, ""),
               r.get(STATE, ""), r.get(CORE, ""), _order_signature(r.get(INPUT_STRIDES, "")))
        if sig not in seen:
            seen.add(sig)
            out.append(r)
    return out


def _tiled_like_template(slots, template_slots, formats):
    """Write the slots whose template is FRACTAL_NZ in the template's tiling (None when a
    dimension does not divide into tiles)."""
    out = []
    for i, shape in enumerate(slots):
        fmt = formats[i].strip().upper() if i < len(formats) else ""
        t = template_slots[i] if i < len(template_slots) else None
        if fmt == FRACTAL_NZ and shape is not None and t is not None and len(t) >= 4:
            shape = fractal_nz_like(shape, t)
            if shape is None:
                return None
        out.append(shape)
    return tuple(out)


def _order_signature(strides_text: str) -> tuple:
    return tuple(None if st is None else tuple(sorted(range(len(st)), key=lambda d: (-st[d], d)))
                 for st in parse_shapes(strides_text))


def compute_rows(table: KernelTable, spec: KernelTypeSpec, models: Sequence[ModelSpec],
                 tp_sizes: Sequence[int], max_bytes: float,
                 ep_sizes: Sequence[int] = EP_SIZES) -> list[dict[str, str]]:
    layout = LAYOUTS[spec.layout]
    if layout.slots is None:
        return []
    axes_list = candidate_axes(spec, models, tp_sizes, ep_sizes)
    existing = {table.key_of(r) for r in table.rows}
    columns = {c: a for c, a in (layout.columns or {}).items() if c in table.header}
    rows = []
    for tmpl in _templates(table):
        in_dt = split_list(tmpl.get(INPUT_DTYPES, ""))
        out_dt = split_list(tmpl.get(OUTPUT_DTYPES, ""))
        in_fmt = split_list(tmpl.get(INPUT_FORMATS, ""))
        t_slots = parse_shapes(tmpl.get(INPUT_SHAPES, ""))
        t_nd = nd_slots(t_slots, in_fmt)
        if layout.axes(t_nd) is None:
            continue  # a row this layout cannot read is no template for it
        out_arity = max(1, len(parse_shapes(tmpl.get(OUTPUT_SHAPES, ""))))
        for axes in axes_list:
            slots = layout.slots(axes, t_nd)
            if len(slots) != len(t_slots):
                continue
            slots = _tiled_like_template(slots, t_slots, in_fmt)
            if slots is None:
                continue
            out_shape = layout.output(axes) if layout.output else None
            if max_bytes and _bytes(slots, in_dt) + (
                    _bytes([out_shape], out_dt or in_dt[:1]) if out_shape else 0) > max_bytes:
                continue
            row = {c: tmpl.get(c, "") for c in (STATE, CORE, INPUT_DTYPES, INPUT_FORMATS,
                                                  OUTPUT_DTYPES, OUTPUT_FORMATS)}
            row[INPUT_SHAPES] = format_shapes(slots)
            row[OUTPUT_SHAPES] = (format_shapes([out_shape] + [None] * (out_arity - 1))
                                  if out_shape and tmpl.get(OUTPUT_SHAPES) else "")
            row.update({c: str(axes[a]) for c, a in columns.items() if a in axes})
            if (tmpl.get(INPUT_STRIDES) or "").strip():
                row[INPUT_STRIDES] = format_shapes(strides_like(
                    parse_shapes(tmpl[INPUT_STRIDES]), parse_shapes(tmpl[INPUT_SHAPES]), slots))
            if table.key_of(row) not in existing:
                existing.add(table.key_of(row))
                rows.append(row)
    return rows


def comm_rows(table: KernelTable, max_bytes: float) -> list[dict[str, str]]:
    combos = sorted({(r.get("num_devices", ""), r.get("dtype", ""), r.get("topology_tier", ""))
                     for r in table.rows})
    existing = {(r.get("message_bytes", ""), r.get("num_devices", ""), r.get("dtype", ""),
                 r.get("topology_tier", "")) for r in table.rows}
    rows = []
    for n, dtype, tier in combos:
        for mb in MESSAGE_BYTES_GRID:
            if max_bytes and mb > max_bytes:
                continue
            key = (str(mb), n, dtype, tier)
            if key not in existing:
                rows.append({"message_bytes": str(mb), "num_devices": n, "dtype": dtype,
                             "topology_tier": tier})
    return rows


def generate_grid(database_path: Path, target_models: Sequence[str] = (), *, rows: int = 1000,
                  seed: int | None = None, max_memory_gb: float = 32.0,
                  tp_sizes: Sequence[int] = TP_SIZES, ops: Sequence[str] = (),
                  ep_sizes: Sequence[int] = EP_SIZES, device: str = "",
                  batch_sizes: Sequence[int] = BATCH_GRID,
                  prefill_lengths: Sequence[int] = PREFILL_GRID,
                  decode_lengths: Sequence[int] | None = None) -> GridResult:
    """Append theory rows to the CSVs of `database_path`. `rows=0` means no cap per CSV;
    `seed=None` samples with seed 0 (the result is always reproducible). Without
    `target_models` the grid is the full one: every built-in model config.

    With an `op_mapping.yaml` the rows are those the estimates of the models query on
    the database's device (`device` when it declares none) at the steps
    `batch_sizes` x (`prefill_lengths` | `decode_lengths`, default `decode_contexts()`)."""
    if rows < 0:
        raise ConfigError(f"has value {rows}", field="--rows", expected="0 or a positive integer")
    models = [load_model_spec(m) for m in target_models or builtin_models()]
    if not Path(database_path).is_dir():
        load_database(Path(database_path))  # the error for a missing folder
    max_bytes = max_memory_gb * 2**30 if max_memory_gb else 0.0
    rng = random.Random(0 if seed is None else seed)
    ops = [table_key(o) for o in ops]
    if (Path(database_path) / MAPPING_FILE).is_file():
        from perfcast.collect.devices import database_device
        from perfcast.hardware import load_system

        name = database_device(Path(database_path), device)
        if not name:
            raise ConfigError("declares no device, so no estimate's graph can be built",
                              source=str(database_path), field="--device",
                              expected="--device NAME (or `device:` in op_mapping.yaml)")
        batches = grid_batches(batch_sizes, prefill_lengths,
                               decode_contexts() if decode_lengths is None else decode_lengths)
        return generate_query_grid(Path(database_path), models, load_system(name), rows=rows,
                                   rng=rng, max_bytes=max_bytes, tp_sizes=tp_sizes,
                                   ep_sizes=ep_sizes, ops=ops, batches=batches)
    tables = load_database(Path(database_path))
    if not tables:
        raise ConfigError("holds no CSV to extend", source=str(database_path),
                          field="--database-path", expected="a database with {KernelType}.csv files")
    appended, changed = {}, []
    for ktype, table in sorted(tables.items()):
        if ops and ktype not in ops:
            continue
        if ktype.startswith(COMM_PREFIX):
            new = comm_rows(table, max_bytes)
        else:
            spec = spec_for(ktype)
            if spec is None:
                continue
            new = compute_rows(table, spec, models, tp_sizes, max_bytes, ep_sizes)
        if rows and len(new) > rows:
            new = rng.sample(new, rows)
        if new:
            table.rows.extend(new)
            appended[ktype] = len(new)
            changed.append(table)
    written = write_tables(changed) if changed else []
    return GridResult(appended=appended, written=tuple(written))


# -- the rows the estimates query (databases with op_mapping.yaml) ----------------------
def decode_contexts() -> tuple[int, ...]:
    return sqrt_space(DECODE_KV_MIN, DECODE_KV_MAX, DECODE_KV_POINTS)


def grid_layouts(model: ModelSpec, tp_sizes: Sequence[int], ep_sizes: Sequence[int]) -> list:
    """One `ParallelPlan` per TP degree (dp = 1), plus for a MoE model every EP degree
    > 1 that divides it (experts over EP ranks, the rest of TP inside each expert)."""
    from perfcast.workload import ParallelPlan

    moe = any(model.raw.get(key) for key in NUM_EXPERTS_KEYS)
    plans = []
    for tp in tp_sizes:
        plans.append(ParallelPlan(tp=tp))
        if moe:
            plans += [ParallelPlan(tp=tp, ep=ep) for ep in ep_sizes if 1 < ep <= tp and tp % ep == 0]
    return plans


def grid_batches(batch_sizes: Sequence[int], prefill_lengths: Sequence[int],
                 decode_lengths: Sequence[int]) -> list:
    from perfcast.workload import Batch

    return ([Batch.prefill(b, s) for b in batch_sizes for s in prefill_lengths]
            + [Batch.decode(b, kv) for b in batch_sizes for kv in decode_lengths])


def step_calls(model: ModelSpec, system, plan, batch) -> list:
    """The operator calls of one step as the profiling provider receives them: the task
    graph `perfcast estimate` builds (its stack for the device; TensorCast's MLA call,
    which `--mla-call auto` picks with the profiling model), one call per task."""
    from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
    from perfcast.evidence.queries import query_for_task
    from perfcast.plan.step import EstimateRequest, build_step_graph
    from perfcast.workload.quant import precision_for_model

    request = EstimateRequest(model=model, device=system, plan=plan, batch=batch,
                              precision=precision_for_model(model), mla_call="tensorcast")
    graph = build_step_graph(request, model, batch, system)
    return [OpInvokeInfo.from_query(query_for_task(t, system.name)) for t in graph.tasks]


@dataclass
class QueryRows:
    rows: dict[tuple[str, bool], list]          # (kernel type, communication) -> RowSpecs
    calls: int = 0
    no_row: dict[str, int] = field(default_factory=dict)
    skipped_layouts: list[str] = field(default_factory=list)


def query_grid_rows(database_path: Path, models: Sequence[ModelSpec], system,
                    tp_sizes: Sequence[int], ep_sizes: Sequence[int], batches: Sequence
                    ) -> QueryRows:
    """Every kernel row the profiling lookups of `models` read over the layouts and
    steps, in first-query order (each distinct row once)."""
    from perfcast.collect.query_rows import RowIndex, kernel_rows
    from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource

    out = QueryRows(rows={})
    seen_calls, index = set(), RowIndex()
    for model in models:
        for plan in grid_layouts(model, tp_sizes, ep_sizes):
            ds = ProfilingDataSource(database_path, system, plan)
            for batch in batches:
                try:
                    calls = step_calls(model, system, plan, batch)
                except ConfigError as exc:  # a layout the model cannot take (heads % tp)
                    out.skipped_layouts.append(f"{model.name} tp={plan.tp} ep={plan.ep}: {exc}")
                    break
                for op in calls:
                    key = (op.operator, op.inputs, op.outputs, tuple(sorted(op.dims.items())),
                           plan.ep)
                    if key in seen_calls:
                        continue
                    seen_calls.add(key)
                    out.calls += 1
                    specs, reason = kernel_rows(ds, op)
                    if reason:
                        out.no_row[reason] = out.no_row.get(reason, 0) + 1
                    for spec in specs:
                        if not index.answers(spec):  # else the lookup reads that row
                            index.add(spec)
                            out.rows.setdefault((spec.kernel_type, spec.communication),
                                                []).append(spec)
    return out


def _spec_row(spec, table: KernelTable, new: bool) -> dict[str, str]:
    """A RowSpec as a CSV row of `table` (runtime columns the table lacks are written
    only into a new table, except the avg_seq_len an attention row needs)."""
    from perfcast.collect.query_rows import csv_dtype

    row: dict[str, str] = {}
    if not spec.communication:
        row[INPUT_SHAPES] = format_shapes([s for s, _, _ in spec.inputs])
        row[INPUT_DTYPES] = ";".join(csv_dtype(d) for _, d, _ in spec.inputs)
        row[INPUT_FORMATS] = ";".join(f for _, _, f in spec.inputs)
        row[OUTPUT_SHAPES] = format_shapes([s for s, _ in spec.outputs])
        row[OUTPUT_DTYPES] = ";".join(csv_dtype(d) for _, d in spec.outputs)
        row[OUTPUT_FORMATS] = ";".join("ND" for _ in spec.outputs)
        if table.rows:
            row.update({c: table.rows[0].get(c, "") for c in (STATE, CORE) if c in table.header})
    for column, value in spec.columns:
        if column == "Runtime avg_seq_len" and column not in table.header \
                and "avg_seq_len" in table.header:
            column = "avg_seq_len"
        if new or column in table.header or column == "Runtime avg_seq_len":
            row[column] = value
    return row


def _spec_bytes(spec) -> float:
    from perfcast.core.dtypes import dtype_bytes

    return float(sum(math.prod(s) * dtype_bytes(d) for s, d, _ in spec.inputs)
                 + sum(math.prod(s) * dtype_bytes(d) for s, d in spec.outputs))


def generate_query_grid(database_path: Path, models: Sequence[ModelSpec], system, *,
                        rows: int, rng: random.Random, max_bytes: float,
                        tp_sizes: Sequence[int], ep_sizes: Sequence[int], ops: Sequence[str],
                        batches: Sequence) -> GridResult:
    from perfcast.collect.tables import COMM_COLUMNS, SHAPE_COLUMNS, STAT_COLUMNS, csv_name
    from perfcast.evidence.profiling.op_mapping import load_op_mapping

    found = query_grid_rows(database_path, models, system, tp_sizes, ep_sizes, batches)
    mapping = load_op_mapping(database_path)
    comm_dir = ((database_path / mapping.communication_data_ref).resolve()
                if mapping.communication_data_ref else database_path)
    appended, changed = {}, []
    for (kernel, comm), specs in found.rows.items():
        if ops and table_key(kernel) not in ops:
            continue
        path = (comm_dir if comm else database_path) / csv_name(kernel)
        new = not path.is_file()
        if new:
            extra = [c for s in specs for c, _ in s.columns]
            header = list(COMM_COLUMNS) if comm else (
                list(SHAPE_COLUMNS) + list(dict.fromkeys(extra)) + list(STAT_COLUMNS))
            table = KernelTable(table_key(kernel), header, [], path)
        else:
            table = read_table(path)
        candidates = [_spec_row(s, table, new) for s in specs
                      if not max_bytes or _spec_bytes(s) <= max_bytes]
        for row in candidates:
            table.ensure_columns([c for c in row if c not in table.header])
        existing = {table.key_of(r) for r in table.rows}
        added = []
        for row in candidates:
            if table.key_of(row) not in existing:
                existing.add(table.key_of(row))
                added.append(row)
        if rows and len(added) > rows:
            added = rng.sample(added, rows)
        if added:
            table.rows.extend(added)
            appended[table.kernel_type] = len(added)
            changed.append(table)
    written = write_tables(changed) if changed else []
    return GridResult(appended=appended, written=tuple(written), calls=found.calls,
                      no_row=dict(sorted(found.no_row.items())))

