"""Kernel-type table (kernel_types.yaml) and tensor layouts.

A layout reads the semantic axes of one row (GEMM `m, n, k` -- m rows of the output,
n columns, k the contraction; attention `batch, q_tokens, kv_len, heads, kv_heads,
head_dim`; elementwise `tokens, numel`) from its tensor slots, and writes the slots of
a row for given axes (used by the shape grid), following a template row's arity.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from perfcast.core.errors import ConfigError

Shape = tuple[int, ...]
Slots = tuple[Shape | None, ...]


@dataclass(frozen=True)
class KernelTypeSpec:
    kernel_type: str
    operation: str
    layout: str
    replay: str = ""
    args: tuple[int, ...] | None = None
    launch: str = ""      # "" = one process; "torchrun" = one process per EP rank (NPU only)
    not_replayable: str = ""  # why no replay exists (set exactly when `replay` is not)


LAUNCHES = ("", "torchrun")


@functools.cache
def kernel_type_table(path: str | None = None) -> dict[str, KernelTypeSpec]:
    src = Path(path) if path else Path(str(resources.files("perfcast.collect").joinpath(
        "kernel_types.yaml")))
    data = yaml.safe_load(src.read_text(encoding="utf-8")) or {}
    table = {}
    for name, entry in (data.get("kernel_types") or {}).items():
        if not isinstance(entry, dict) or "operation" not in entry or "layout" not in entry:
            raise ConfigError("needs operation and layout", source=str(src), field=name)
        if entry["layout"] not in LAYOUTS:
            raise ConfigError(f"unknown layout {entry['layout']!r}", source=str(src), field=name,
                              expected=" | ".join(sorted(LAYOUTS)))
        args = entry.get("args")
        launch = entry.get("launch", "") or ""
        if launch not in LAUNCHES:
            raise ConfigError(f"unknown launch {launch!r}", source=str(src), field=name,
                              expected=" | ".join(repr(x) for x in LAUNCHES))
        replay, reason = entry.get("replay") or "", entry.get("not_replayable") or ""
        if bool(replay) == bool(reason):
            raise ConfigError("needs exactly one of replay and not_replayable (the reason)",
                              source=str(src), field=name)
        table[name] = KernelTypeSpec(name, entry["operation"], entry["layout"], replay,
                                     tuple(args) if args is not None else None, launch,
                                     str(reason))
    return table


def replay_table(table: Mapping[str, KernelTypeSpec] | None = None) -> str:
    """The Markdown table of docs/collecting.md: each kernel type, its replay or why none."""
    rows = ["| kernel type | operation | replay (torch) | not replayable because |",
            "|---|---|---|---|"]
    for name, spec in (table or kernel_type_table()).items():
        replay = f"`{spec.replay}`" if spec.replay else "-"
        rows.append(f"| `{name}` | {spec.operation} | {replay} | {spec.not_replayable or '-'} |")
    return "\n".join(rows) + "\n"


def spec_for(kernel_type: str) -> KernelTypeSpec | None:
    """The spec of a kernel type, given as itself (`aten::mm`) or as its CSV file stem
    (`aten__mm`)."""
    table = kernel_type_table()
    return table.get(kernel_type) or _by_stem().get(kernel_type)


@functools.cache
def _by_stem() -> dict[str, KernelTypeSpec]:
    from perfcast.collect.tables import csv_name

    return {csv_name(k)[:-4]: spec for k, spec in kernel_type_table().items()}


# -- layouts -----------------------------------------------------------------------------
def _present(slots: Slots) -> list[Shape]:
    return [s for s in slots if s is not None]


def _matmul_axes(slots: Slots) -> dict[str, int] | None:
    """x (..., k) times a weight stored (k, n) or transposed (n, k) -- the orientation a
    FRACTAL_NZ weight restores to."""
    s = _present(slots)
    if len(s) < 2 or len(s[0]) < 2 or len(s[1]) != 2:
        return None
    x, w = s[0], s[1]
    if x[-1] == w[0]:
        n = w[1]
    elif x[-1] == w[1]:
        n = w[0]
    else:
        return None
    return {"m": math.prod(x[:-1]), "k": x[-1], "n": n}


def _addmm_axes(slots: Slots) -> dict[str, int] | None:
    s = _present(slots)
    return _matmul_axes(tuple(s[1:3])) if len(s) >= 3 else None


def _linear_axes(slots: Slots) -> dict[str, int] | None:
    s = _present(slots)
    if len(s) < 2 or len(s[0]) < 1 or len(s[1]) != 2 or s[0][-1] != s[1][1]:
        return None
    return {"m": math.prod(s[0][:-1]), "k": s[0][-1], "n": s[1][0]}


def _bmm_axes(slots: Slots) -> dict[str, int] | None:
    s = _present(slots)
    if len(s) < 2 or len(s[0]) != 3 or len(s[1]) != 3 or s[0][2] != s[1][1]:
        return None
    return {"batch": s[0][0], "m": s[0][1], "k": s[0][2], "n": s[1][2]}


def _transpose_bmm_axes(slots: Slots) -> dict[str, int] | None:
    s = _present(slots)  # x (m, batch, k) x w (batch, k, n) -> (m, batch, n)
    if len(s) < 2 or len(s[0]) != 3 or len(s[1]) != 3 or s[0][1] != s[1][0] or s[0][2] != s[1][1]:
        return None
    return {"batch": s[0][1], "m": s[0][0], "k": s[0][2], "n": s[1][2]}


def _sdpa_axes(slots: Slots) -> dict[str, int | str] | None:
    s = _present(slots)  # q (b, h, s, d), k (b, hkv, skv, d), v (b, hkv, skv, dv)
    if len(s) < 3 or any(len(x) != 4 for x in s[:3]):
        return None
    q, k, v = s[:3]
    phase = "decode" if q[2] == 1 and k[2] > 1 else "prefill"
    return {"batch": q[0], "heads": q[1], "q_tokens": q[2], "head_dim": q[3], "kv_heads": k[1],
            "kv_len": k[2], "v_head_dim": v[3], "phase": phase}


# FusedInferAttentionScore input slots (aclnnFusedInferAttentionScoreV4 order)
FIA_Q, FIA_K, FIA_V, FIA_SEQ_LENS, FIA_SEQ_LENS_KV, FIA_BLOCK_TABLE = 0, 1, 2, 5, 6, 14
# the row's mean KV length lives in a runtime column, not in the shapes
FIA_COLUMNS = {"avg_seq_len": "kv_len", "Runtime avg_seq_len": "kv_len",
               "Runtime num_key_value_heads": "kv_heads"}


def _slot(slots: Slots, i: int) -> Shape | None:
    return slots[i] if i < len(slots) else None


def _fia_axes(slots: Slots) -> dict[str, int | str] | None:
    """q (T, N, D) in TND layout; K/V either a paged cache (blocks, block_size, KVH*D) with
    a block table, or TND (T_kv, KVH, D); batch = len(actual_seq_lengths)."""
    q = _slot(slots, FIA_Q)
    if q is None or len(q) != 3:
        return None
    t, n, d = q
    axes: dict[str, int | str] = {"q_tokens_total": t, "heads": n, "head_dim": d}
    k = _slot(slots, FIA_K)
    if k is not None and len(k) == 3:
        if _slot(slots, FIA_BLOCK_TABLE) is not None and d and k[2] % d == 0:
            axes["kv_heads"] = k[2] // d
        elif _slot(slots, FIA_BLOCK_TABLE) is None:
            axes["kv_heads"] = k[1]
    lens = _slot(slots, FIA_SEQ_LENS) or _slot(slots, FIA_SEQ_LENS_KV)
    batch = lens[0] if lens else 0
    if batch and t % batch == 0:
        axes["batch"] = batch
        axes["q_tokens"] = t // batch
        axes["phase"] = "decode" if t == batch else "prefill"
    return axes


def _fia_slots(axes: Mapping[str, int], template: Slots) -> Slots:
    """A row in the template's FIA call: Q (B*q, N, D); a paged K/V cache keeping the
    template's block size and pool (grown when the batch needs more blocks) and a block
    table wide enough for kv_len; per-request length tensors (B,); other slots (mask,
    quant params) as in the template."""
    if len(template) <= FIA_V:
        return ()  # no K/V slots: not a template for FIA rows
    b, q, kv = axes["batch"], axes["q_tokens"], axes["kv_len"]
    n, kvh, d = axes["heads"], axes["kv_heads"], axes["head_dim"]
    out = list(template)
    out[FIA_Q] = (b * q, n, d)
    table = _slot(template, FIA_BLOCK_TABLE)
    k = _slot(template, FIA_K)
    if table is not None and k is not None and len(k) == 3:
        bs = k[1]
        per_req = -(-kv // bs)
        blocks = max(k[0], b * per_req)
        out[FIA_K] = out[FIA_V] = (blocks, bs, kvh * d)
        out[FIA_BLOCK_TABLE] = (b, max(table[1], per_req) if len(table) == 2 else per_req)
    else:
        out[FIA_K] = out[FIA_V] = (b * kv, kvh, d)
    for i in (FIA_SEQ_LENS, FIA_SEQ_LENS_KV):
        if _slot(template, i) is not None:
            out[i] = (b,)
    return tuple(out)


# -- grouped matmul (MoE experts): x (M, K), weight (E, K, N) -------------------------
def _grouped_axes(slots: Slots) -> dict[str, int] | None:
    x, w = _slot(slots, 0), _slot(slots, 1)
    if x is None or w is None or len(x) < 2 or len(w) != 3:
        return None
    if x[-1] == w[1]:
        n = w[2]
    elif x[-1] == w[2]:
        n = w[1]
    else:
        return None
    return {"m": math.prod(x[:-1]), "k": x[-1], "n": n, "experts": w[0]}


GROUPED_SUBSTITUTION_ORDER = ("experts", "n", "k", "m")


def _grouped_slots(axes: Mapping[str, int], template: Slots) -> Slots:
    """x (m, k) and weight (E, k, n); the template's other slots (group list (E,), scales
    (E, n), per-token scales (m,)) with each dimension equal to one of the template's axes
    replaced by the new value of that axis (experts first, then n, k, m)."""
    base = ((axes["m"], axes["k"]), (axes["experts"], axes["k"], axes["n"]))
    t_axes = _grouped_axes(template) or {}
    subst: dict[int, int] = {}
    for a in GROUPED_SUBSTITUTION_ORDER:
        if a in t_axes:
            subst.setdefault(t_axes[a], axes[a])
    tail = tuple(None if s is None else tuple(subst.get(dim, dim) for dim in s)
                 for s in template[2:])
    return base + tail


def _elementwise_axes(slots: Slots) -> dict[str, int] | None:
    s = _present(slots)
    if not s:
        return None
    x = s[0]
    return {"tokens": x[0] if x else 1, "numel": math.prod(x)}


def _embedding_axes(slots: Slots) -> dict[str, int] | None:
    s = _present(slots)  # weight (vocab, hidden), indices (...)
    if len(s) < 2 or len(s[0]) != 2:
        return None
    return {"tokens": math.prod(s[1]), "numel": math.prod(s[1]) * s[0][1]}


def _matmul_slots(axes: Mapping[str, int], template: Slots) -> Slots:
    return ((axes["m"], axes["k"]), (axes["k"], axes["n"]))


def _addmm_slots(axes: Mapping[str, int], template: Slots) -> Slots:
    return ((axes["n"],), (axes["m"], axes["k"]), (axes["k"], axes["n"]))


def _linear_slots(axes: Mapping[str, int], template: Slots) -> Slots:
    base = ((axes["m"], axes["k"]), (axes["n"], axes["k"]))
    return base + ((axes["n"],),) if len(template) >= 3 else base


def _bmm_slots(axes: Mapping[str, int], template: Slots) -> Slots:
    b = axes["batch"]
    return ((b, axes["m"], axes["k"]), (b, axes["k"], axes["n"]))


def _sdpa_slots(axes: Mapping[str, int], template: Slots) -> Slots:
    b, q, kv = axes["batch"], axes["q_tokens"], axes["kv_len"]
    d, dv = axes["head_dim"], axes.get("v_head_dim", axes["head_dim"])
    return ((b, axes["heads"], q, d), (b, axes["kv_heads"], kv, d), (b, axes["kv_heads"], kv, dv))


def _elementwise_slots(axes: Mapping[str, int], template: Slots) -> Slots:
    """Every template slot shaped like the first tensor becomes (tokens, width); in the
    others (a norm's gamma (H,), a quant scale (T, 1)) the template's width and token
    count are replaced by the new ones."""
    tokens, width = axes["tokens"], axes["numel"] // axes["tokens"]
    first = next((s for s in template if s is not None), None)
    if not first:
        return tuple((tokens, width) for _ in range(max(len(template), 1)))
    t_tokens = first[0]
    t_width = math.prod(first) // t_tokens if t_tokens else 0
    return tuple(None if s is None else (tokens, width) if s == first
                 else tuple(width if d == t_width else tokens if d == t_tokens else d for d in s)
                 for s in template)


@dataclass(frozen=True)
class Layout:
    name: str
    axes: Callable[[Slots], dict | None]
    slots: Callable[[Mapping[str, int], Slots], Slots] | None = None
    output: Callable[[Mapping[str, int]], Shape] | None = None
    # non-shape key columns a written row sets from its axes (column -> axis)
    columns: Mapping[str, str] | None = None


LAYOUTS: dict[str, Layout] = {
    "matmul": Layout("matmul", _matmul_axes, _matmul_slots, lambda a: (a["m"], a["n"])),
    "addmm": Layout("addmm", _addmm_axes, _addmm_slots, lambda a: (a["m"], a["n"])),
    "linear": Layout("linear", _linear_axes, _linear_slots, lambda a: (a["m"], a["n"])),
    "bmm": Layout("bmm", _bmm_axes, _bmm_slots, lambda a: (a["batch"], a["m"], a["n"])),
    "transpose_bmm": Layout("transpose_bmm", _transpose_bmm_axes),
    "sdpa": Layout("sdpa", _sdpa_axes, _sdpa_slots,
                   lambda a: (a["batch"], a["heads"], a["q_tokens"],
                              a.get("v_head_dim", a["head_dim"]))),
    "fia": Layout("fia", _fia_axes, _fia_slots,
                  lambda a: (a["batch"] * a["q_tokens"], a["heads"], a["head_dim"]),
                  columns=FIA_COLUMNS),
    "grouped_matmul": Layout("grouped_matmul", _grouped_axes, _grouped_slots,
                             lambda a: (a["m"], a["n"])),
    "opaque": Layout("opaque", lambda slots: None),
    "elementwise": Layout("elementwise", _elementwise_axes, _elementwise_slots,
                          lambda a: (a["tokens"], a["numel"] // a["tokens"])),
    "embedding": Layout("embedding", _embedding_axes),
}


FRACTAL_NZ = "FRACTAL_NZ"


def nd_slots(slots: Sequence[Shape | None], formats: Sequence[str] = ()) -> Slots:
    """Tensor slots with FRACTAL_NZ tiles restored to their ND shape."""
    from perfcast.evidence.profiling.shape_rules import fractal_nz_to_nd

    return tuple(fractal_nz_to_nd(s) if s is not None and i < len(formats)
                 and formats[i].strip().upper() == FRACTAL_NZ else s
                 for i, s in enumerate(slots))


def fractal_nz_like(nd_weight: Shape, template_nz: Shape) -> Shape | None:
    """A (k, n) ND weight in the FRACTAL_NZ tiling of a template slot
    (`[N/W0, K/H0, H0, W0]`), or None when the dims do not divide into tiles."""
    h0, w0 = template_nz[-2], template_nz[-1]
    k, n = nd_weight[-2], nd_weight[-1]
    if k % h0 or n % w0:
        return None
    return (*nd_weight[:-2], n // w0, k // h0, h0, w0)


def axes_of(spec: KernelTypeSpec, slots: Sequence[Shape | None],
            formats: Sequence[str] = (), row: Mapping[str, str] | None = None) -> dict | None:
    """Semantic axes of a row's slots; with `row`, also the axes the layout keeps in
    runtime columns (FIA `avg_seq_len` -> kv_len). A layout with such columns has no axes
    for a row that lacks them."""
    axes = LAYOUTS[spec.layout].axes(nd_slots(slots, formats))
    columns = LAYOUTS[spec.layout].columns
    if axes is None or row is None or not columns:
        return axes
    for column, axis in columns.items():
        value = (row.get(column) or "").strip()
        if value:
            try:
                number = float(value)
            except ValueError:
                return None
            if number < 0:
                return None  # TensorCast marks rows without a usable length with -1
            axes.setdefault(axis, int(round(number)))
    needed = set(columns.values()) - {"kv_heads"}
    return axes if needed <= set(axes) else None
