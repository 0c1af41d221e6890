"""How many of TensorCast's operator calls perfcast's task graph reproduces.

    .venv/bin/python benchmarks/tensorcast_fidelity.py [CASE ...] [--dumps DIR]
        [--inputs table|all] [--format table|json] [--examples N]

Reads real TensorCast (msModeling) dumps: the fixtures under tests/fixtures/tensorcast/
(default) or fresh dump folders made by benchmarks/tensorcast/dump.py (`--dumps DIR`,
DIR/<case>/{calls,summary}.json). For each case it runs the matching perfcast estimate
in-process (same model, device atlas_800_a3_752t_128g_die, layout, batch, quantisation:
TensorCast's flags mapped one to one, see `perfcast_args`; the stack profile from its
`--compilation-config` fusion passes, see `stack_for`) and reports

* TensorCast's calls, view and alias ops aside (`VIEW_OPS`, plus any call TensorCast
  itself costs as zero: `is_view_op` / `copy_(x, x)`);
* how many have a perfcast call with the same operator name and the same input shapes
  (multiset matching: a signature TensorCast calls n times and perfcast m times matches
  min(n, m) calls) and the fraction; also with dtypes required to agree;
* the unmatched calls grouped by operator, with counts and examples of both sides;
* FLOPs per device, perfcast (sum of work.flops x count on one device) vs TensorCast
  (sum of its mma_ops + gp_ops), and the matrix part alone; TensorCast records no FLOPs
  for its fused calls (matmul_all_reduce, dispatch_ffn_combine), so the FLOPs outside
  perfcast's fused tasks are compared as well.

Inputs: `--inputs table` (default) compares the top-level tensor arguments, the
convention of TensorCast's `--dump-input-shapes` table (tensors inside list arguments,
e.g. the indices of `aten.index.Tensor`, are not listed there); `--inputs all` appends the
tensors of TensorCast's list arguments, list by list, after the top-level tensors.
Operator names are compared after removing a `torch.ops.` prefix only.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "tensorcast"
DEVICE = "atlas_800_a3_752t_128g_die"

# Zero-work ops (shape/stride/alias changes), by aten name without overload.
VIEW_OPS = frozenset({
    "aten.view", "aten._unsafe_view", "aten.reshape", "aten._reshape_alias", "aten.expand",
    "aten.permute", "aten.transpose", "aten.slice", "aten.select", "aten.alias", "aten.t",
    "aten.unsqueeze", "aten.squeeze", "aten.detach", "aten.split", "aten.split_with_sizes",
    "aten.unbind", "aten.as_strided", "aten.narrow", "aten.view_as", "aten.unflatten",
    "aten.chunk", "aten.lift_fresh", "aten.view_as_real", "aten.view_as_complex",
})

# TensorCast's dtype names (str(torch.dtype) without "torch.") -> perfcast's.
DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
          "float8_e4m3fn": "fp8", "float8_e5m2": "fp8_e5m2", "int8": "int8", "uint8": "uint8",
          "int16": "int16", "int32": "int32", "int64": "int64", "bool": "bool"}


def op_name(name: str) -> str:
    return name.removeprefix("torch.ops.")


def is_view(name: str) -> bool:
    base = op_name(name).rsplit(".", 1)[0] if op_name(name).count(".") >= 2 else op_name(name)
    return base in VIEW_OPS


def tc_dtype(name: str) -> str:
    return DTYPES.get(name, name)


@dataclass
class TCCase:
    """One TensorCast dump: its flags, totals and calls grouped by unique signature."""
    case: str
    model: str
    tensorcast_args: list[str]
    totals: dict
    calls: list[dict]            # {"op", "inputs", "outputs", "list_inputs"?, "zero_cost", "count", ...}
    provenance: dict = field(default_factory=dict)


def load_fixture(path: Path) -> TCCase:
    d = json.loads(Path(path).read_text())
    return TCCase(d["case"], d["model"], d["provenance"]["tensorcast_args"], d["totals"],
                  d["calls"], d["provenance"])


def load_dump(folder: Path) -> TCCase:
    """A dump folder of benchmarks/tensorcast/dump.py, grouped like the fixtures."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "tensorcast"))
    try:
        from dump import compact
    finally:
        sys.path.pop(0)
    d = compact(Path(folder))
    return TCCase(d["case"], d["model"], d["provenance"]["tensorcast_args"], d["totals"],
                  d["calls"], d["provenance"])


def tc_signature(call: dict, inputs: str = "table") -> tuple:
    """(op, ((shape...), ...)) and the same with dtypes, for one TensorCast call group."""
    specs = [tuple(x) for x in call["inputs"]]
    if inputs == "all" and call.get("list_inputs"):
        # tensors of list arguments (aten.index.Tensor's indices, cat's inputs), after
        # the top-level tensors, list by list in argument order
        specs = specs + [tuple(x) for _, lst in sorted(call["list_inputs"].items(),
                                                       key=lambda kv: int(kv[0]))
                         for x in lst if x is not None]
    shapes = tuple(tuple(s[0]) for s in specs)
    dtypes = tuple(tc_dtype(s[1]) for s in specs)
    return (op_name(call["op"]), shapes), dtypes


# TensorCast --compilation-config option -> the perfcast fusion pattern it switches on
# (tensor_cast/core/compilation_config.py; patterns in perfcast.workload.fusions)
COMPILATION_FUSIONS = {"enable_matmul_allreduce": "matmul_all_reduce",
                       "enable_dispatch_ffn_combine": "dispatch_ffn_combine"}


def compilation_config(tc_args: list[str]) -> list[str]:
    """The values of TensorCast's `--compilation-config` (nargs="*"), snake case."""
    if "--compilation-config" not in tc_args:
        return []
    out = []
    for a in tc_args[tc_args.index("--compilation-config") + 1:]:
        if a.startswith("--"):
            break
        out.append(a.replace("-", "_"))
    return out


def stack_for(tc_args: list[str]) -> tuple[str, list[str]]:
    """The stack profile a case runs under: of the profiles with TensorCast's tensors,
    the one with the fewest fusions that holds every fusion the case switched on;
    returns (name, fusions it runs that the case left off)."""
    from perfcast.workload.stacks import load_stack, stack_names

    options = compilation_config(tc_args)
    unknown = [o for o in options if o not in COMPILATION_FUSIONS]
    if unknown:
        raise ValueError(f"--compilation-config {unknown} has no perfcast fusion")
    wanted = {COMPILATION_FUSIONS[o] for o in options}
    fits = [load_stack(n) for n in stack_names()]
    fits = [s for s in fits if s.tensorcast_tensors and wanted <= set(s.fusions)]
    if not fits:
        raise ValueError(f"no stack in stacks.yaml runs the fusions {sorted(wanted)}")
    best = min(fits, key=lambda s: len(s.fusions))
    return best.name, [f for f in best.fusions if f not in wanted]


def perfcast_args(tc_args: list[str]) -> dict:
    """perfcast EstimateArgs fields from TensorCast's text_generate flags (the stack:
    `stack_for`)."""
    out = {"device": DEVICE, "num_queries": 1, "query_length": 1, "context_length": 0,
           "decode": False, "tp_size": 1, "ep_size": 1,
           # TensorCast's default --quantize-linear-action (cli/inference/text_generate.py)
           "quantize_linear_action": "W8A8_DYNAMIC"}
    flags = {"--num-queries": ("num_queries", int), "--query-length": ("query_length", int),
             "--context-length": ("context_length", int), "--tp-size": ("tp_size", int),
             "--ep-size": ("ep_size", int), "--num-devices": ("num_devices", int),
             "--quantize-linear-action": ("quantize_linear_action", str),
             "--dp-size": ("dp_size", int), "--moe-tp-size": ("moe_tp_size", int)}
    i = 1  # tc_args[0] is the model folder
    while i < len(tc_args):
        a = tc_args[i]
        if a == "--decode":
            out["decode"] = True
        elif a in flags:
            key, conv = flags[a]
            out[key] = conv(tc_args[i + 1])
            i += 1
        elif a == "--device":
            out["device"] = tc_args[i + 1].lower()
            i += 1
        i += 1
    out["stack"] = stack_for(tc_args)[0]
    return out


def perfcast_graph(case: TCCase):
    from perfcast.cli.estimate import EstimateArgs, run_estimate

    run = run_estimate(EstimateArgs(model=case.model, **perfcast_args(case.tensorcast_args)))
    return run.results["analytic"].graph


def perfcast_calls(graph) -> list[dict]:
    """The graph's tasks as call groups: {"op", "inputs", "count", "flops", "engine"}."""
    from perfcast.workload.tensors import TaskKind

    out = []
    for t in graph.tasks:
        # a task's inputs after `list_inputs` are the tensors of list arguments, which
        # TensorCast's dump table does not show (compared with --inputs all only)
        top = int(t.attributes.get("list_inputs", len(t.inputs)))
        out.append({"op": op_name(t.operator), "lineage": t.lineage,
                    "inputs": [[list(s.shape), s.dtype] for s in t.inputs[:top]],
                    "all_inputs": [[list(s.shape), s.dtype] for s in t.inputs],
                    "count": t.count, "flops": t.work.flops * t.count,
                    "matrix": t.work.engine.value == "matrix",
                    "fused": bool(t.attributes.get("fusion")),
                    "view": t.kind is TaskKind.VIEW or is_view(t.operator)})
    return out


def match(tc_groups: list[tuple[tuple, tuple, int]], pc_groups: list[tuple[tuple, tuple, int]]):
    """Multiset match of (signature, dtypes, count) lists. Returns (total, matched,
    matched_with_dtypes, tc_left, pc_left) with the leftovers as Counters by signature."""
    tc, pc = collections.Counter(), collections.Counter()
    tc_dt, pc_dt = collections.Counter(), collections.Counter()
    for sig, dt, n in tc_groups:
        tc[sig] += n
        tc_dt[(sig, dt)] += n
    for sig, dt, n in pc_groups:
        pc[sig] += n
        pc_dt[(sig, dt)] += n
    matched = sum(min(n, pc[s]) for s, n in tc.items())
    matched_dt = sum(min(n, pc_dt[k]) for k, n in tc_dt.items())
    return sum(tc.values()), matched, matched_dt, tc - pc, pc - tc


def fmt_sig(sig: tuple, dtypes: dict | None = None) -> str:
    op, shapes = sig
    dts = (dtypes or {}).get(sig)
    parts = [f"{list(s)} {dts[i]}" if dts else str(list(s)) for i, s in enumerate(shapes)]
    return f"[{', '.join(parts)}]"


def compare(case: TCCase, graph=None, inputs: str = "table", examples: int = 2) -> dict:
    """The fidelity record of one case (see the module docstring)."""
    graph = graph if graph is not None else perfcast_graph(case)
    pcs = perfcast_calls(graph)
    tc_groups, tc_views, tc_dtypes = [], collections.Counter(), {}
    for c in case.calls:
        if is_view(c["op"]) or c.get("zero_cost"):
            tc_views[op_name(c["op"])] += c["count"]
            continue
        sig, dt = tc_signature(c, inputs)
        tc_groups.append((sig, dt, c["count"]))
        tc_dtypes.setdefault(sig, dt)
    pc_groups, pc_dtypes, pc_views = [], {}, collections.Counter()
    for c in pcs:
        if c["view"]:
            pc_views[c["op"]] += c["count"]
            continue
        specs = c["inputs"] if inputs == "table" else c["all_inputs"]
        sig = (c["op"], tuple(tuple(s[0]) for s in specs))
        dt = tuple(s[1] for s in specs)
        pc_groups.append((sig, dt, c["count"]))
        pc_dtypes.setdefault(sig, dt)
    total, matched, matched_dt, tc_left, pc_left = match(tc_groups, pc_groups)

    by_op: dict[str, dict] = {}
    for sig, n in tc_left.items():
        g = by_op.setdefault(sig[0], {"tensorcast": 0, "perfcast": 0, "tc": [], "pc": []})
        g["tensorcast"] += n
        g["tc"].append((n, sig))
    for sig, n in pc_left.items():
        g = by_op.setdefault(sig[0], {"tensorcast": 0, "perfcast": 0, "tc": [], "pc": []})
        g["perfcast"] += n
        g["pc"].append((n, sig))
    unmatched = []
    for op, g in sorted(by_op.items(), key=lambda kv: -max(kv[1]["tensorcast"], kv[1]["perfcast"])):
        unmatched.append({
            "operator": op, "tensorcast_calls": g["tensorcast"], "perfcast_calls": g["perfcast"],
            "tensorcast_examples": [{"inputs": fmt_sig(s, tc_dtypes), "count": n}
                                    for n, s in sorted(g["tc"], key=lambda x: -x[0])[:examples]],
            "perfcast_examples": [{"inputs": fmt_sig(s, pc_dtypes), "count": n}
                                  for n, s in sorted(g["pc"], key=lambda x: -x[0])[:examples]],
        })
    pc_flops = sum(c["flops"] for c in pcs)
    pc_matrix = sum(c["flops"] for c in pcs if c["matrix"])
    # TensorCast's PerformanceProperties of its fused calls (matmul_all_reduce,
    # dispatch_ffn_combine) hold no FLOPs: compare the rest too
    pc_unfused = sum(c["flops"] for c in pcs if not c["fused"])
    tc_flops = case.totals.get("flops_per_device")
    tc_mma = case.totals.get("mma_ops_per_device")
    return {
        "case": case.case, "model": case.model, "tensorcast_args": case.tensorcast_args,
        "perfcast_args": perfcast_args(case.tensorcast_args), "inputs": inputs,
        "compilation_config": compilation_config(case.tensorcast_args),
        "stack": stack_for(case.tensorcast_args)[0],
        "stack_fusions_left_off_by_case": stack_for(case.tensorcast_args)[1],
        "tensorcast_calls": total, "matched": matched,
        "fraction": matched / total if total else None,
        "matched_with_dtypes": matched_dt,
        "fraction_with_dtypes": matched_dt / total if total else None,
        "perfcast_calls": sum(n for _, _, n in pc_groups),
        "views_excluded": {"tensorcast": dict(tc_views), "perfcast": dict(pc_views)},
        "flops_per_device": {"perfcast": pc_flops, "tensorcast": tc_flops,
                             "ratio": pc_flops / tc_flops if tc_flops else None},
        "flops_per_device_outside_fused_calls": {
            "perfcast": pc_unfused, "tensorcast": tc_flops,
            "ratio": pc_unfused / tc_flops if tc_flops else None},
        "matrix_flops_per_device": {"perfcast": pc_matrix, "tensorcast": tc_mma,
                                    "ratio": pc_matrix / tc_mma if tc_mma else None},
        "tensorcast_latency_s": case.totals.get("latency_s"),
        "unmatched": unmatched,
        "provenance": {k: case.provenance.get(k) for k in ("msmodeling_commit", "versions", "shim")},
    }


def load_cases(names: list[str], dumps: str | None) -> list[TCCase]:
    if dumps:
        root = Path(dumps)
        folders = [root / n for n in names] if names else sorted(
            p for p in root.iterdir() if (p / "calls.json").exists())
        return [load_dump(f) for f in folders]
    paths = [FIXTURES / f"{n}.json" for n in names] if names else sorted(FIXTURES.glob("*.json"))
    return [load_fixture(p) for p in paths]


def print_tables(records: list[dict], examples: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 200))
    console.print("View/alias ops left out of both sides: " + ", ".join(sorted(VIEW_OPS))
                  + " (any overload), and calls TensorCast costs as zero (is_view_op, copy_(x, x)).")
    summary = Table(title="TensorCast calls reproduced by perfcast (same operator, same input shapes)")
    for col in ("case", "stack", "TC calls", "matched", "fraction", "w/ dtypes", "pc calls",
                "FLOPs/dev pc", "FLOPs/dev TC", "ratio", "matrix ratio", "unfused ratio"):
        summary.add_column(col, justify="left" if col == "case" else "right")
    for r in records:
        f, m = r["flops_per_device"], r["matrix_flops_per_device"]
        summary.add_row(r["case"], r["stack"], str(r["tensorcast_calls"]), str(r["matched"]),
                        f"{r['fraction']:.1%}", f"{r['fraction_with_dtypes']:.1%}",
                        str(r["perfcast_calls"]), f"{f['perfcast']:.4g}", f"{f['tensorcast']:.4g}",
                        f"{f['ratio']:.4f}" if f["ratio"] else "-",
                        f"{m['ratio']:.4f}" if m["ratio"] else "-",
                        f"{r['flops_per_device_outside_fused_calls']['ratio']:.4f}"
                        if f["ratio"] else "-")
    console.print(summary)
    for r in records:
        t = Table(title=f"{r['case']}: unmatched calls by operator (inputs: {r['inputs']})")
        for col in ("operator", "TC", "pc", "TensorCast inputs (count)", "perfcast inputs (count)"):
            t.add_column(col, overflow="fold")
        for u in r["unmatched"]:
            t.add_row(u["operator"], str(u["tensorcast_calls"]), str(u["perfcast_calls"]),
                      "\n".join(f"{e['inputs']} x{e['count']}" for e in u["tensorcast_examples"]),
                      "\n".join(f"{e['inputs']} x{e['count']}" for e in u["perfcast_examples"]))
        console.print(t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", help="case names (default: every fixture or dump)")
    p.add_argument("--dumps", default=None, help="dump root of benchmarks/tensorcast/dump.py")
    p.add_argument("--inputs", choices=("table", "all"), default="table")
    p.add_argument("--examples", type=int, default=2)
    p.add_argument("--format", choices=("table", "json"), default="table")
    a = p.parse_args(argv)
    records = [compare(c, inputs=a.inputs, examples=a.examples)
               for c in load_cases(a.cases, a.dumps)]
    if a.format == "json":
        print(json.dumps({"view_ops": sorted(VIEW_OPS), "cases": records}, indent=2))
    else:
        print_tables(records, a.examples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
