"""Run TensorCast's `python -m cli.inference.text_generate` under torch 2.13 and record
every operator call it costs.

    cd MSMODELING && HF_HUB_OFFLINE=1 VENV/bin/python PERFCAST/benchmarks/tensorcast/launch.py \
        --calls-json OUT/calls.json -- MODEL_DIR --device ... --compile --chrome-trace-file T

msModeling pins torch<=2.10; with torch 2.13 two changes alter its `--compile` graph.
This launcher patches exactly these two things before TensorCast's `main()` runs:

1. SiLU decomposition. torch 2.13's inductor table (`torch._inductor.decomposition`)
   replaced the core `aten.silu` decomposition `x * sigmoid(x)` by its own
   `x / (1 + exp(-x))`. TensorCast traces its SwiGLU pattern
   (`tensor_cast/compilation/patterns/swiglu.py`: convert -> sigmoid -> mul -> convert ->
   mul) against that table, so SwiGLU never fires and the MLP costs `tensor_cast.silu` +
   `aten.mul`. Patch: the inductor table's `aten.silu` entries are set back to the core
   decomposition (`torch._decomp.decomposition_table`), which torch <= 2.10 used.
2. KV-cache clone. `decompose_auto_functionalized` (torch 2.13,
   `torch/_inductor/fx_passes/post_grad.py`) clones every base an
   `auto_functionalized_v2` node mutates unless the node's meta
   `only_clone_these_tensors` says otherwise; inductor sets that meta in its reinplace pass,
   which TensorCast's backend does not run. So each `tensor_cast.reshape_and_cache` (and
   the other cache writers) is preceded by an `aten.clone` of the whole paged KV cache.
   Patch: before TensorCast's `apply_decompose_auto_functionalized_pass`, every
   `auto_functionalized_v2` node of a `tensor_cast::` op gets `only_clone_these_tensors =
   []`: the op writes its cache in place, as the device kernel does (inductor's own
   reinplace pass, tried first, keeps the clone because later ops read views of the same
   cache). The epilogue copy-back then is `copy_(x, x)`, which TensorCast costs as zero
   (`is_noop_self_copy_op`).

The recorder (`--calls-json`) wraps `Runtime.export_chrome_trace` (so `--chrome-trace-file`
is required) and writes one record per costed call, in call order: `op` (str of the
OpOverload), `inputs` (top-level tensor args as [shape, dtype], the `--dump-input-shapes`
convention), `list_inputs` ({arg index: [[shape, dtype], ...]} for tensor-list args, which
that table omits), `outputs`, `zero_cost` (TensorCast's own `is_view_op` /
`is_noop_self_copy_op`), `mma_ops` / `gp_ops` (its PerformanceProperties) and `time_s`
per performance model. Nothing else of TensorCast is changed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def patch_silu_decomposition() -> list[str]:
    import torch
    import torch._decomp
    import torch._inductor.decomposition as inductor_decomp

    patched = []
    for op, fn in list(inductor_decomp.decompositions.items()):
        if getattr(op, "overloadpacket", None) is torch.ops.aten.silu:
            core = torch._decomp.decomposition_table.get(op)
            if core is not None and core is not fn:
                inductor_decomp.decompositions[op] = core
                patched.append(str(op))
    inductor_decomp.fast_random_decomps.cache_clear()
    return patched


def patch_cache_writes_in_place() -> None:
    import torch
    from tensor_cast.compilation.compile_backend import CompilerBackend

    original = CompilerBackend.apply_decompose_auto_functionalized_pass
    af_v2 = torch.ops.higher_order.auto_functionalized_v2

    def apply(self, gm):
        for node in gm.graph.nodes:
            op = node.args[0] if node.target is af_v2 and node.args else None
            if isinstance(op, torch._ops.OpOverload) and op.namespace == "tensor_cast":
                node.meta["only_clone_these_tensors"] = []
        return original(self, gm)

    CompilerBackend.apply_decompose_auto_functionalized_pass = apply


def _dtype(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def _spec(t) -> list:
    return [list(t.shape), _dtype(t)]


def call_record(event) -> dict:
    import torch
    from torch.utils._pytree import tree_leaves
    from tensor_cast.performance_model.utils import is_noop_self_copy_op, is_view_op

    info = event.op_invoke_info
    inputs, list_inputs = [], {}
    for i, arg in enumerate(info.args):
        if isinstance(arg, torch.Tensor):
            inputs.append(_spec(arg))
        elif isinstance(arg, (list, tuple)) and any(isinstance(a, torch.Tensor) for a in arg):
            list_inputs[str(i)] = [_spec(a) if isinstance(a, torch.Tensor) else None for a in arg]
    outputs = [_spec(t) for t in tree_leaves(info.out) if isinstance(t, torch.Tensor)]
    record = {"op": str(info.func), "inputs": inputs, "outputs": outputs}
    if list_inputs:
        record["list_inputs"] = list_inputs
    kw = {k: _spec(v) for k, v in info.kwargs.items() if isinstance(v, torch.Tensor)}
    if kw:
        record["kwarg_inputs"] = kw
    record["zero_cost"] = bool(is_view_op(info.func) or is_noop_self_copy_op(info.func, info.args))
    try:
        props = info.get_perf_properties()
        record["mma_ops"] = sum(c.mma_ops for c in props.compute_ops.values())
        record["gp_ops"] = sum(c.gp_ops for c in props.compute_ops.values())
        record["read_bytes"] = props.memory_read_bytes + props.memory_readwrite_bytes
        record["write_bytes"] = props.memory_write_bytes + props.memory_readwrite_bytes
    except Exception as exc:  # an op TensorCast has no properties functor for
        record["perf_properties_error"] = f"{type(exc).__name__}: {exc}"[:200]
    record["time_s"] = {name: r.execution_time_s for name, r in event.perf_results.items()}
    return record


def install_call_recorder(path: str) -> None:
    from tensor_cast.runtime import Runtime

    original = Runtime.export_chrome_trace

    def export(self, trace_file):
        calls = [call_record(e) for e in self.event_list]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(calls, f)
        return original(self, trace_file)

    Runtime.export_chrome_trace = export


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: launch.py [--calls-json PATH] [--no-patch] -- TEXT_GENERATE_ARGS")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="launch.py")
    parser.add_argument("--calls-json", default=None)
    parser.add_argument("--no-patch", action="store_true",
                        help="run TensorCast under torch 2.13 as it is (to see the two changes)")
    ours = parser.parse_args(argv[:split])
    sys.path.insert(0, os.getcwd())  # run from the msmodeling checkout
    if not ours.no_patch:
        patched = patch_silu_decomposition()
        print(f"[launch] silu decomposition reset to core for: {patched}", file=sys.stderr)
        patch_cache_writes_in_place()
    if ours.calls_json:
        install_call_recorder(ours.calls_json)
    from cli.inference.text_generate import main as text_generate_main

    sys.argv = ["text_generate", *argv[split + 1:]]
    text_generate_main()


if __name__ == "__main__":
    main()
