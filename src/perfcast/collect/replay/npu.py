"""NPU replay backend: the torch replay of each case runs on `torch_npu` under `msprof`,
and the durations come from msprof's `op_summary_*.csv` (parsed by the same Ascend
parser as `collect parse`), so NPU-private formats such as FRACTAL_NZ are measured by
the device itself.

Flow: write the cases to `cases.json` -> run
`msprof --output=OUT --application="PYTHON -m perfcast.collect.replay.npu_worker cases.json
--repeat-count N --warmup W"` -> find `op_summary_*.csv` under OUT -> for each case, keep
the samples whose `OP Type` and input shapes/dtypes/formats equal the case's, and take the
last `repeat_count` of them in each op_summary file (the earlier ones are warm-up calls).

Kernel types with `launch: torchrun` (DispatchFFNCombine) run in a second msprof session
whose application is `torchrun --nproc-per-node=P --nnodes=N --node-rank=R
--master-addr=A [--master-port=M] -m perfcast.collect.replay.npu_worker ...`, one process
per EP rank (`DistributedLaunch`); each rank's op_summary contributes its timed calls.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from perfcast.collect.parse.ascend import OP_SUMMARY, detect_layout, parse_ascend_csv, read_header
from perfcast.collect.parse.samples import KernelSample
from perfcast.collect.replay.base import (
    DistributedLaunch,
    ReplayCase,
    ReplayOutcome,
    ReplaySettings,
)
from perfcast.collect.tables import (
    INPUT_DTYPES,
    INPUT_FORMATS,
    INPUT_SHAPES,
    SampleStats,
    format_shapes,
    parse_shapes,
)

WORKER_MODULE = "perfcast.collect.replay.npu_worker"


def case_to_json(case: ReplayCase) -> dict:
    return {"case_id": case.case_id, "kernel_type": case.kernel_type, "replay": case.spec.replay,
            "args": list(case.spec.args) if case.spec.args is not None else None,
            "operation": case.spec.operation, "layout": case.spec.layout,
            "input_shapes": format_shapes(case.input_shapes),
            "input_dtypes": ";".join(case.input_dtypes),
            "input_formats": ";".join(case.input_formats),
            "input_strides": format_shapes(case.input_strides),
            "launch": case.spec.launch, "runtime": [list(kv) for kv in case.runtime],
            "not_replayable": case.spec.not_replayable,
            "output_shapes": format_shapes(case.output_shapes)}


def case_match_key(kernel_type: str, shapes: str, dtypes: str, formats: str) -> tuple:
    return (kernel_type, parse_shapes(shapes), tuple(d.strip().upper() for d in dtypes.split(";")
                                                   if d.strip()),
            tuple(f.strip().upper() for f in formats.split(";") if f.strip()))


class NpuBackend:
    name = "npu"

    def __init__(self, *, msprof: str = "msprof", python: str = sys.executable,
                 output_dir: Path | None = None, aic_metrics: str = "PipeUtilization",
                 launch: DistributedLaunch | None = None) -> None:
        self.launch = launch or DistributedLaunch()
        self.unmatched: list[KernelSample] = []   # see outcomes_from_profile
        self.msprof = msprof
        self.python = python
        self.output_dir = Path(output_dir) if output_dir else None
        self.aic_metrics = aic_metrics

    def unavailable_reason(self) -> str:
        if shutil.which(self.msprof) is None:
            return f"{self.msprof} not found: load the CANN toolkit environment (set_env.sh)"
        try:
            import torch_npu  # noqa: F401
        except ImportError:
            return "torch_npu is not installed"
        return ""

    def command(self, cases_file: Path, output_dir: Path, settings: ReplaySettings, *,
                distributed: bool = False) -> list[str]:
        launcher = ([*self.launch.torchrun_args(), "-m"] if distributed
                    else [self.python, "-m"])
        app = " ".join(shlex.quote(a) for a in [
            *launcher, WORKER_MODULE, str(cases_file),
            "--repeat-count", str(settings.repeat_count), "--warmup", str(settings.warmup)])
        return [self.msprof, f"--output={output_dir}", f"--aic-metrics={self.aic_metrics}",
                f"--application={app}"]

    def take_unmatched(self, kernel_type: str) -> list[KernelSample]:
        """Profiled samples of `kernel_type` that matched no replayed row (and forget them)."""
        mine = [s for s in self.unmatched if s.kernel_type == kernel_type]
        self.unmatched = [s for s in self.unmatched if s.kernel_type != kernel_type]
        return mine

    def measure(self, cases: Sequence[ReplayCase], settings: ReplaySettings) -> list[ReplayOutcome]:
        reason = self.unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        work = Path(tempfile.mkdtemp(prefix="perfcast-npu-", dir=self.output_dir))
        by_id: dict[str, ReplayOutcome] = {}
        for distributed in (False, True):
            group = [c for c in cases if bool(c.spec.launch) == distributed]
            if not group:
                continue
            sub = work / ("torchrun" if distributed else "local")
            sub.mkdir()
            cases_file = sub / "cases.json"
            cases_file.write_text(json.dumps([case_to_json(c) for c in group]), encoding="utf-8")
            out_dir = sub / "msprof"
            proc = subprocess.run(self.command(cases_file, out_dir, settings,
                                               distributed=distributed),
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
                raise RuntimeError(f"msprof exited with {proc.returncode}: " + " | ".join(tail))
            by_id.update((o.case_id, o) for o in outcomes_from_profile(
                group, out_dir, settings, self.unmatched))
        return [by_id[c.case_id] for c in cases]


def find_op_summaries(output_dir: Path) -> list[Path]:
    return [p for p in sorted(Path(output_dir).rglob("*.csv"))
            if detect_layout(read_header(p)) is OP_SUMMARY]


def outcomes_from_profile(cases: Sequence[ReplayCase], output_dir: Path,
                          settings: ReplaySettings,
                          unmatched: list[KernelSample] | None = None) -> list[ReplayOutcome]:
    """Match msprof op_summary samples back to the cases that launched them. Samples of
    the cases' kernel types that match no case (the device ran the kernel with other
    shapes or formats than the row recorded) are added to `unmatched` when given."""
    summaries = find_op_summaries(output_dir)
    if not summaries:
        return [ReplayOutcome(c.case_id, error=f"no op_summary CSV under {output_dir}")
                for c in cases]
    per_file: list[dict[tuple, list[KernelSample]]] = []
    for path in summaries:
        samples: dict[tuple, list[KernelSample]] = {}
        for s in parse_ascend_csv(path, OP_SUMMARY):
            key = case_match_key(s.kernel_type, s.key[INPUT_SHAPES], s.key[INPUT_DTYPES],
                                 s.key[INPUT_FORMATS])
            samples.setdefault(key, []).append(s)
        per_file.append(samples)
    out = []
    for c in cases:
        key = case_match_key(c.kernel_type, format_shapes(c.input_shapes),
                             ";".join(c.input_dtypes), ";".join(c.input_formats))
        # the last repeat_count calls of each profiled process (rank) are the timed ones
        timed = [s for samples in per_file for s in samples.get(key, [])[-settings.repeat_count:]]
        if not timed:
            out.append(ReplayOutcome(c.case_id, error="no op_summary row of this kernel type "
                                                      "with these input shapes"))
            continue
        out.append(ReplayOutcome(c.case_id, SampleStats.of([s.duration_us for s in timed])))
    if unmatched is not None:
        wanted = {case_match_key(c.kernel_type, format_shapes(c.input_shapes),
                                 ";".join(c.input_dtypes), ";".join(c.input_formats))
                  for c in cases}
        types = {c.kernel_type for c in cases}
        unmatched += [s for samples in per_file for key, found in samples.items()
                      if key not in wanted and key[0] in types for s in found]
    return out
