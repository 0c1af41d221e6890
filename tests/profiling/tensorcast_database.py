"""A profiling database holding one row per kernel call of a real TensorCast run.

`write_database(case, root)` reads a TensorCast `--compile --dump-input-shapes` run
(`tests/fixtures/tensorcast/<case>.json`: its calls with input/output shapes and dtypes,
and its command-line flags) and writes, under `root`, the layout of TensorCast's own
databases (`data/{device}/vllm_ascend/{version}/` and `data/{device}/hccl/v8.5/`):

* `op_mapping.yaml`: the real CANN 8.5 mapping, verbatim;
* `{kernel_type}.csv` in the real per-kernel format (the columns of the real fixtures
  `fia_fixture_*.csv`: `Input Shapes`, `Input Data Types`, `Input Formats`, `Output
  Shapes`, `Output Data Types`, `Output Formats`, `Average Duration(us)`; FIA rows add
  `avg_seq_len`);
* `hccl/v8.5/{kernel_type}.csv` (`message_bytes,num_devices,topology_tier,Duration(us)`,
  the columns TensorCast's `_query_comm_csv` reads).

The rows are derived from TensorCast's calls, never from perfcast's graph, by the
declarations of the mapping (`kernel_type`, `kernel_types_by_input_rank`,
`tc_input_count`, `expected_input_formats`, `sub_kernels`, `query_mode`, `category`,
the notes on what the NPU CSV holds) and the matching rules of TensorCast's
`profiling_data_source.py` (msModeling commit of the fixtures), each row inverting the
rule TensorCast applies to that call:

* R0: `zero_cost` (and unmapped) operators get no row (TensorCast returns 0 without a CSV).
* R1 communication (`category: communication`): a row of `hccl/v8.5/{kernel_type}.csv`
  with `message_bytes` = bytes of the first tensor (`_lookup_comm`; reduce-scatter
  divided by the group size), `num_devices` = the run's `--tp-size` (the only group of
  a dense TP run), `topology_tier` = `get_topology_tier` of ranks 0..n-1 on the A3 die
  grid (48, 8, 2) with tiers {0, 1, 2} (`tensor_cast/device.py` A3_INTERCONNECT).
* R2 `attention_special`: a `FusedInferAttentionScore` row whose q slot is TensorCast's
  `_normalize_fia_q_shape` of the query ((T, H) -> (T, H/d, d), d = key.shape[-1]), the
  other slots the remaining tensors as passed, and `avg_seq_len` = mean of `seq_lens`
  = `--context-length` + `--query-length` of the run (the dump has shapes, not values).
* R3 `elementwise`: inputs and outputs with a leading 1 stripped (`_strip_batch_dim`:
  "TC keeps (1, seq, dim), profiling flattens: (seq, dim)"); TensorCast matches the
  first output shape and dtype.
* R4 `composite` with static `sub_kernels`: a row of the first compute sub-kernel with
  the call's inputs (truncated to `tc_input_count`): `_lookup_composite` takes the first
  compute sub-kernel that matches; and for each `hcom_*` sub-kernel (MC2) a collective
  row as R1 with `message_bytes` = mat1.shape[0] x mat2.shape[-1] x the output element
  size, 2 bytes for int8/fp8 inputs (`_lookup_comm_for_composite`, `full_output`).
* R5 compute (everything else): the kernel is the first of
  `kernel_types_by_input_rank[rank of input 0]` when declared, else `kernel_type`;
  scalar tensors are dropped (`_extract_tensor_inputs`), tensors of list arguments
  appended (ditto); then per kernel family, the inverse of `_inputs_match`:
  - SwiGlu: one input, gate and up concatenated on the last dim (`_SWIGLU_KERNELS`);
  - RoPE kernels (`_ROPE_KERNELS`): `_normalize_rope_inputs` (inputs 0 and 1 swapped,
    (B,H,S,D) -> (B,S,H,D)), then the cos table as passed; the second slot recorded as
    FLOAT, as TensorCast's tests say real `_triton_rope` rows are ("K as FLOAT");
  - reshape-and-cache kernels: `_normalize_reshape_and_cache_inputs` ((N,D) -> (N,1,D),
    the (2, ...) cache split into cache_k and cache_v, slot mapping last);
  - matmul kernels (`_MATMUL_KERNELS`): the weight (input 1) in FRACTAL_NZ when the
    mapping's `expected_input_formats` says so (int8 (N/32, K/16, 16, 32), 16-bit
    (K/16, N/16, 16, 16), the tiles `fractal_nz_to_nd` restores), else ND stored (N, K)
    ("CSV stores (N,K), TC sees (K,N)");
  - a matmul's 2-D activation as passed (TensorCast's mm inputs are (T, K), T may be 1);
  - every other tensor with a leading 1 stripped (`_strip_batch_dim`);
  and after the first `tc_input_count` inputs, the tensors the mapping's notes name:
  Index the index tensors ("TC passes self + variable-length index tensors; match on
  self shape only"), GatherV2 `axis` (1,) INT64 ("NPU CSV has (weight, indices, axis)"),
  AddRmsNormBias `bias` (h,) ("4 inputs (extra NPU-internal param)"),
  QuantBatchMatmulV3 two (N,) scales ("NPU CSV has (x, weight_NZ, scale, scale)"),
  AscendQuantV2 (h,) scale and offset ("with internal scale/offset inputs").
* R8 `query_mode: moe_fused` with `project_full_shape` (DispatchFFNCombine): one row
  with TensorCast's `_project_dispatch_ffn_combine_inputs` of the call: x (3-D x
  flattened to 2-D), the gate-up weight list stacked as (E, h, 2I) and the down weight
  list as (E, I, h) (`_stacked_expert_weight_shape`: E = the list's length, the hidden
  size h = x's last dim put on axis 1 for gate-up and on the last axis for down), the
  expert indices as INT32, INT64 workspaces (E*2I,) and (E*h,), FLOAT probabilities
  shaped like the indices; and `EP Size` = the run's `--ep-size` (`_lookup_moe`
  matches it exactly when the CSV has the column).
* R7 a call the mapping's notes say has no NPU kernel gets no row: `aten.index.Tensor` on
  the (40960, 128) RoPE cos/sin table ("Qwen3 (40960,128) remains an ordinary MISS
  because NPU has no corresponding Index kernel").
* R6 where a mapping's notes name the kernel of a decode step ("v0.18.0: Decode uses
  reshape_and_cache_200000000", "CANN dispatch to GatherV2AiCore in Decode mode"), the
  decode rows go to that alternate kernel's CSV.

Dtypes follow TensorCast's `DTYPE_MAP` (float16 and bfloat16 -> DT_BF16). Rows of one
kernel with the same inputs are written once (the first call's; TensorCast matches
compute rows on their inputs). Latencies are illustrative round numbers (10 us
per kernel, 20 us per collective), not measurements: the tests built on these
databases check which calls hit, not what they cost.
"""

from __future__ import annotations

import csv
import json
import shutil
from math import prod
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
TENSORCAST = FIXTURES / "tensorcast"
REAL_MAPPING = FIXTURES / "msmodeling" / "op_mapping.vllm0.18.0_torch2.9.0_cann8.5.yaml"

DEVICE = "ATLAS_800_A3_752T_128G_DIE"
VERSION = "0.18.0"
COLUMNS = ["Input Shapes", "Input Data Types", "Input Formats", "Output Shapes",
           "Output Data Types", "Output Formats", "Average Duration(us)"]
FIA_COLUMNS = COLUMNS + ["avg_seq_len"]
MOE_COLUMNS = COLUMNS + ["EP Size"]
COMM_COLUMNS = ["message_bytes", "num_devices", "topology_tier", "Duration(us)"]
KERNEL_US, COMM_US = 10.0, 20.0

# TensorCast's DTYPE_MAP (profiling_data_source.py)
DTYPE_MAP = {"bfloat16": "DT_BF16", "float16": "DT_BF16", "int8": "INT8", "int32": "INT32",
             "int64": "INT64", "float32": "FLOAT", "bool": "BOOL"}
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int8": 1, "int32": 4, "int64": 8}
MATMUL_KERNELS = {"MatMulV2", "MatMulV3", "MatMulCommon", "MatMul", "QuantBatchMatmulV3",
                  "BatchMatMulV2", "TransposeBatchMatMul", "GroupedMatmul",
                  "GroupedMatmulSwigluQuant"}
ROPE_KERNELS = {"ApplyRotaryPosEmb", "_triton_rope", "split_qkv_rmsnorm_rope_kernel"}
CACHE_KERNELS = {"ReshapeAndCacheNdKernel", "reshape_and_cache_200000000"}
# R6: decode kernels the mapping's notes name
DECODE_KERNELS = {"tensor_cast.reshape_and_cache.default": "reshape_and_cache_200000000",
                  "aten.embedding.default": "GatherV2AiCore"}
# R7: (operator, first input) the mapping's notes say the NPU runs no kernel for
NO_NPU_KERNEL = {("aten.index.Tensor", (40960, 128))}
# A3 die grid and its tiers (tensor_cast/device.py A3_INTERCONNECT)
A3_GRID, A3_TIERS = (48, 8, 2), (0, 1, 2)


def strip(shape):
    """TensorCast's `_strip_batch_dim`."""
    return tuple(shape[1:]) if len(shape) > 1 and shape[0] == 1 else tuple(shape)


def topology_tier(ranks, grid=A3_GRID, tiers=A3_TIERS) -> int:
    """TensorCast's `get_topology_tier`: the fastest tier covering the outermost grid
    dimension where the ranks differ."""
    def coord(r):
        out = []
        for n in reversed(grid):
            out.insert(0, r % n)
            r //= n
        return out
    coords = [coord(r) for r in ranks]
    diff = next((d for d in range(len(grid)) if any(c[d] != coords[0][d] for c in coords)), -1)
    if diff == -1:
        return max(tiers)
    return next(t for t in sorted(tiers, reverse=True) if t <= diff)


def run_flags(args: list[str]) -> dict:
    def value(flag, default):
        return int(args[args.index(flag) + 1]) if flag in args else default
    return {"tp": value("--tp-size", 1), "query_length": value("--query-length", 1),
            "context_length": value("--context-length", 0), "decode": "--decode" in args,
            "ep": value("--ep-size", 1)}


def tensors(call: dict) -> list[tuple[tuple, str]]:
    """Non-scalar tensors of a call, list arguments' tensors appended
    (`_extract_tensor_inputs`)."""
    out = [(tuple(s), d) for s, d in call["inputs"] if len(s) > 0]
    for _, lst in sorted((call.get("list_inputs") or {}).items(), key=lambda kv: int(kv[0])):
        out += [(tuple(x[0]), x[1]) for x in lst if x is not None and len(x[0]) > 0]
    return out


def fractal_nz(kn: tuple, dtype: str) -> tuple:
    """The FRACTAL_NZ tiles of a (K, N) weight that `fractal_nz_to_nd` restores."""
    k, n = kn
    if dtype == "int8":
        return (n // 32, k // 16, 16, 32)
    return (k // 16, n // 16, 16, 16)


def project_dfc(call: dict) -> list[tuple[tuple, str]]:
    """R8: TensorCast's `_project_dispatch_ffn_combine_inputs` of a DFC call (weights:
    list argument 2 gate-up, 4 down for the bf16 op, 7 down for the quantised ones)."""
    (x, xdt), (idx, _) = [(tuple(s), d) for s, d in call["inputs"][:2]]
    x = x if len(x) == 2 else (x[0] * x[1], x[2])
    h = x[-1]
    lists = call["list_inputs"]
    down = "4" if call["op"].endswith("dispatch_ffn_combine.default") else "7"
    g1, g2 = lists["2"], lists[down]
    e, w1, w2 = len(g1), tuple(g1[0][0]), tuple(g2[0][0])
    gmm1 = (e, *w1) if w1[0] == h else (e, w1[1], w1[0])   # hidden on axis 1
    gmm2 = (e, *w2) if w2[1] == h else (e, w2[1], w2[0])   # hidden on the last axis
    return [(x, xdt), (gmm1, g1[0][1]), (gmm2, g2[0][1]), (idx, "int32"),
            ((e * gmm1[-1],), "int64"), ((e * h,), "int64"), (idx, "float32")]


def cell(shapes) -> str:
    return ";".join(",".join(map(str, s)) for s in shapes)


def compute_row(m: dict, kernel: str, ins: list, outs: list) -> dict:
    """R5: the CSV inputs of one compute call (see the module docstring)."""
    n = m.get("tc_input_count")
    full, ins = ins, (ins[:n] if n is not None else ins)
    formats = list(m.get("expected_input_formats") or [])
    shapes, dtypes, fmts = [], [], []

    def add(shape, dtype, fmt="ND"):
        shapes.append(tuple(shape))
        dtypes.append(dtype)
        fmts.append(fmt)

    if kernel == "SwiGlu":
        (g, dt), (u, _) = ins
        g, u = strip(g), strip(u)
        add(g[:-1] + (g[-1] + u[-1],), DTYPE_MAP[dt])
    elif kernel in ROPE_KERNELS:
        (a, _), (b, db) = ins[0], ins[1]
        def bshd(s):
            return (s[0], s[2], s[1], s[3]) if len(s) == 4 else s
        add(strip(bshd(b)), DTYPE_MAP[db])
        add(strip(bshd(a)), "FLOAT")
        if len(full) > 2:  # "NPU _triton_rope has (K, Q, cos)"
            add(strip(full[2][0]), DTYPE_MAP[full[2][1]])
    elif kernel in CACHE_KERNELS:
        (k, dk), (v, dv), (c, dc), (s, ds) = ins
        add((k[0], 1, k[1]), DTYPE_MAP[dk])
        add((v[0], 1, v[1]), DTYPE_MAP[dv])
        add(c[1:], DTYPE_MAP[dc])
        add(c[1:], DTYPE_MAP[dc])
        add(s, DTYPE_MAP[ds])
    else:
        for i, (s, dt) in enumerate(ins):
            if kernel in MATMUL_KERNELS and i == 1 and len(s) == 2:
                if i < len(formats) and formats[i] == "FRACTAL_NZ":
                    add(fractal_nz(s, dt), DTYPE_MAP[dt], "FRACTAL_NZ")
                else:
                    add((s[1], s[0]), DTYPE_MAP[dt])
            elif kernel in MATMUL_KERNELS and len(s) == 2:
                add(s, DTYPE_MAP[dt])  # TensorCast's mm activation is (T, K) already
            else:
                add(strip(s), DTYPE_MAP[dt])
    # NPU-internal inputs after the first tc_input_count the mapping's notes name
    if kernel.startswith("GatherV2"):
        add((1,), "INT64")
    elif kernel == "AddRmsNormBias":
        add(shapes[-1], dtypes[-1])
    elif kernel == "QuantBatchMatmulV3":
        nn = outs[0][0][-1]
        add((nn,), "FLOAT")
        add((nn,), "FLOAT")
    elif kernel == "Index":
        for sh, dt in full[1:]:
            add(sh, DTYPE_MAP[dt])
    elif kernel.startswith("AscendQuantV2"):
        h = shapes[0][-1]
        add((h,), "FLOAT")
        add((h,), "FLOAT")
    return {"Input Shapes": cell(shapes), "Input Data Types": ";".join(dtypes),
            "Input Formats": ";".join(fmts)}


def outputs_cell(outs: list) -> dict:
    outs = [(strip(s), d) for s, d in outs if len(s) > 0]
    return {"Output Shapes": cell(s for s, _ in outs),
            "Output Data Types": ";".join(DTYPE_MAP.get(d, d) for _, d in outs),
            "Output Formats": ";".join("ND" for _ in outs)}


def rows_for_call(call: dict, mappings: dict, flags: dict):
    """[(kernel_type, communication?, row)] of one call; [] for R0 and R7."""
    op = call["op"].removeprefix("torch.ops.")
    m = mappings.get(op)
    if m is None or m.get("zero_cost") or m.get("accepted_miss"):
        return []
    ins = tensors(call)
    if ins and (op, ins[0][0]) in NO_NPU_KERNEL:                              # R7
        return []
    outs = [(tuple(s), d) for s, d in call.get("outputs", [])]
    if m.get("category") == "communication":                                  # R1
        x, dt = ins[0]
        n = flags["tp"]
        mb = prod(x) * BYTES[dt]
        if op == "tensor_cast.reduce_scatter.default":
            mb //= n
        return [(m["kernel_type"], True, {"message_bytes": mb, "num_devices": n,
                                          "topology_tier": topology_tier(range(n)),
                                          "Duration(us)": COMM_US})]
    if m.get("query_mode") == "attention_special":                            # R2
        (q, dq), (k, _) = ins[0], ins[1]
        d = k[-1]
        q3 = q if len(q) == 3 else (q[0], q[1] // d, d) if len(q) == 2 else (q[0], q[1], q[3])
        shapes = [q3] + [s for s, _ in ins[1:]]
        avg = flags["context_length"] + flags["query_length"]
        row = {"Input Shapes": cell(shapes),
               "Input Data Types": ";".join(DTYPE_MAP[t] for _, t in ins),
               "Input Formats": ";".join("ND" for _ in ins),
               **outputs_cell(outs), "Average Duration(us)": KERNEL_US, "avg_seq_len": avg,
               # for databases with runtime columns: TensorCast's values of this call
               "Runtime avg_seq_len": avg, "Runtime sparse_mode": 3,
               "Runtime num_key_value_heads": k[-2], "Runtime input_layout": "TND"}
        return [(m["kernel_type"], False, row)]
    if m.get("query_mode") == "moe_fused" and m.get("project_full_shape"):   # R8
        ins = project_dfc(call)
        row = {"Input Shapes": cell(s for s, _ in ins),
               "Input Data Types": ";".join(DTYPE_MAP[t] for _, t in ins),
               "Input Formats": ";".join("ND" for _ in ins),
               **outputs_cell(outs), "Average Duration(us)": KERNEL_US,
               "EP Size": flags["ep"]}
        return [(m["kernel_type"], False, row)]
    if m.get("query_mode") == "elementwise":                                  # R3
        row = {"Input Shapes": cell(strip(s) for s, _ in ins),
               "Input Data Types": ";".join(DTYPE_MAP[t] for _, t in ins),
               "Input Formats": ";".join("ND" for _ in ins),
               **outputs_cell(outs), "Average Duration(us)": KERNEL_US}
        return [(m["kernel_type"], False, row)]
    comm_rows = []
    if m.get("composite"):                                                    # R4
        kernel = next(k for k in m.get("sub_kernels", []) if not k.startswith("hcom_"))
        n = flags["tp"]
        for hcom in (k for k in m.get("sub_kernels", []) if k.startswith("hcom_")):
            (a, da), (b, _) = ins[0], ins[1]
            elem = 2 if da in ("int8", "uint8") or da.startswith("float8") else BYTES[da]
            comm_rows.append((hcom, True, {"message_bytes": a[0] * b[-1] * elem,
                                           "num_devices": n,
                                           "topology_tier": topology_tier(range(n)),
                                           "Duration(us)": COMM_US}))
    else:                                                                     # R5
        by_rank = m.get("kernel_types_by_input_rank") or {}
        ranked = by_rank.get(len(ins[0][0])) if ins else None
        kernel = ranked[0] if ranked else m["kernel_type"]
        if flags["decode"] and DECODE_KERNELS.get(op) in m.get("alternate_kernel_types", []):
            kernel = DECODE_KERNELS[op]                                       # R6
    row = {**compute_row(m, kernel, ins, outs), **outputs_cell(outs),
           "Average Duration(us)": KERNEL_US}
    return [(kernel, False, row), *comm_rows]


def unanswerable_calls(case: str | Path, mapping_file: Path = REAL_MAPPING) -> dict[str, int]:
    """{operator: calls} of a TensorCast run that no database under the mapping answers:
    operators the mapping has no entry for, and R7 calls (no NPU kernel). TensorCast's
    own lookup misses these too (`metrics_collector.py` counts them in M1's total)."""
    path = Path(case) if Path(case).suffix == ".json" else TENSORCAST / f"{case}.json"
    doc = json.loads(path.read_text())
    mapping = yaml.safe_load(Path(mapping_file).read_text())["operator_mappings"]
    out: dict[str, int] = {}
    for call in doc["calls"]:
        op = call["op"].removeprefix("torch.ops.")
        ins = tensors(call)
        if op not in mapping or (ins and (op, ins[0][0]) in NO_NPU_KERNEL):
            out[op] = out.get(op, 0) + int(call.get("count", 1))
    return out


def row_key(row: dict) -> tuple:
    """What TensorCast matches a row on: its inputs (compute), message size and group
    (communication)."""
    keys = ("Input Shapes", "Input Data Types", "Input Formats", "message_bytes",
            "num_devices", "topology_tier", "EP Size")
    return (*(row.get(k) for k in keys), row.get("avg_seq_len") or row.get("Runtime avg_seq_len"))


def database_rows(case: str | Path, mapping_file: Path = REAL_MAPPING
                  ) -> dict[tuple[str, bool], list[dict]]:
    """{(kernel_type, communication?): rows} of a TensorCast fixture case under a mapping."""
    path = Path(case) if Path(case).suffix == ".json" else TENSORCAST / f"{case}.json"
    doc = json.loads(path.read_text())
    flags = run_flags(doc["provenance"]["tensorcast_args"])
    mapping = yaml.safe_load(Path(mapping_file).read_text())["operator_mappings"]
    tables: dict[tuple[str, bool], list[dict]] = {}
    for call in doc["calls"]:
        for kernel, is_comm, row in rows_for_call(call, mapping, flags):
            rows = tables.setdefault((kernel, is_comm), [])
            if all(row_key(row) != row_key(r) for r in rows):
                rows.append(row)
    return tables


def write_rows(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Write `rows` to the CSV `path`, appending to it (under its own header) if it
    exists; rows whose `row_key` it already holds are left out."""
    have: list[dict] = []
    if path.exists():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            columns = list(reader.fieldnames or columns)
            have = list(reader)
    seen = {row_key(r) for r in have}
    new = [r for r in rows if row_key({k: str(v) for k, v in r.items()}) not in seen]
    with open(path, "a" if have else "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        if not have:
            w.writeheader()
        w.writerows(new)


def write_database(case: str | Path, root: Path, mapping_file: Path = REAL_MAPPING) -> Path:
    """Write the database of a TensorCast fixture case under `root` in TensorCast's
    layout; return the kernel CSV directory (the `--profiling-database`)."""
    data = Path(root) / "data" / DEVICE
    db = data / "vllm_ascend" / VERSION
    comm = data / "hccl" / "v8.5"
    db.mkdir(parents=True, exist_ok=True)
    comm.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(mapping_file, db / "op_mapping.yaml")
    for (kernel, is_comm), rows in database_rows(case, mapping_file).items():
        columns = COMM_COLUMNS if is_comm else FIA_COLUMNS if "avg_seq_len" in rows[0] \
            else MOE_COLUMNS if "EP Size" in rows[0] else COLUMNS
        write_rows((comm if is_comm else db) / f"{kernel}.csv", rows, columns)
    return db
