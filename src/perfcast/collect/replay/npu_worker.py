"""Runs replay cases on an Ascend NPU (launched by the NPU backend under msprof).

    python -m perfcast.collect.replay.npu_worker cases.json --repeat-count N --warmup W

Timing comes from msprof, so this worker only launches the calls and synchronises.
"""

from __future__ import annotations

import argparse
import json
import sys

from perfcast.collect.kernel_types import KernelTypeSpec
from perfcast.collect.replay.base import ReplayCase
from perfcast.collect.replay.torch_ops import NotReplayable, build_call
from perfcast.collect.tables import parse_shapes, split_list


def case_from_json(d: dict) -> ReplayCase:
    spec = KernelTypeSpec(d["kernel_type"], d["operation"], d["layout"], d.get("replay") or "",
                          tuple(d["args"]) if d.get("args") is not None else None,
                          d.get("launch") or "", d.get("not_replayable") or "")
    return ReplayCase(d["case_id"], spec, parse_shapes(d["input_shapes"]),
                      split_list(d["input_dtypes"]), split_list(d["input_formats"]),
                      parse_shapes(d.get("input_strides", "")),
                      tuple((k, v) for k, v in d.get("runtime") or ()),
                      parse_shapes(d.get("output_shapes", "")))


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - needs an NPU
    p = argparse.ArgumentParser()
    p.add_argument("cases")
    p.add_argument("--repeat-count", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args(argv)
    import torch
    import torch_npu  # noqa: F401

    with open(a.cases, encoding="utf-8") as fh:
        cases = [case_from_json(d) for d in json.load(fh)]
    failed = 0
    for case in cases:
        try:
            call = build_call(case, "npu")
        except NotReplayable as exc:
            print(f"{case.case_id}: {exc}", file=sys.stderr)
            failed += 1
            continue
        for _ in range(a.warmup + a.repeat_count):
            call()
        torch.npu.synchronize()
    return 0 if failed < len(cases) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
