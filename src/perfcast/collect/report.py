"""Replay reports: a Markdown summary and the full list of duration-gap hotspots.

A hotspot is a replayed row whose microbenchmark / profiling duration ratio lies outside
[0.8, 1.2]: the isolated kernel runs much faster or slower than it did inside the model
(cache state, fusion, contention) and the row deserves a look before it is trusted.
Files: `<database>/reports/profile_update_report_<timestamp>.md` and
`<database>/reports/duration_gap_hotspots_full_<timestamp>.csv`.
"""

from __future__ import annotations

import csv
import io
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from perfcast.collect.replay.writeback import ReplayRun, RowResult
from perfcast.collect.tables import format_number, write_files_atomic

GAP_LOW = 0.8
GAP_HIGH = 1.2
HOTSPOT_COLUMNS = ("kernel_type", "row", "Input Shapes", "profiling_us", "microbench_us", "ratio")


@dataclass(frozen=True)
class Hotspot:
    result: RowResult
    ratio: float


def hotspots(run: ReplayRun, low: float = GAP_LOW, high: float = GAP_HIGH) -> list[Hotspot]:
    out = []
    for r in run.replayed:
        if r.profiling_avg_us:
            ratio = r.outcome.stats.mean_us / r.profiling_avg_us
            if not low <= ratio <= high:
                out.append(Hotspot(r, ratio))
    return sorted(out, key=lambda h: -abs(h.ratio - 1.0))


def render_markdown(run: ReplayRun, spots: list[Hotspot], top: int = 20) -> str:
    lines = [f"# Profile update report: {run.database_path}", "",
             f"- backend: {run.backend}", f"- measured on: {run.device}",
             f"- update mode: {run.update_mode}",
             f"- rows replayed: {len(run.replayed)}", f"- rows failed: {len(run.failed)}",
             f"- rows skipped (already valid): {run.skipped_valid}",
             f"- rows skipped (another EP size): {run.skipped_other_ep}",
             f"- rows appended from unmatched profiled samples: {run.appended}",
             f"- rows pruned: {run.pruned}",
             f"- kernel types without a replay: {', '.join(run.not_replayable_types) or 'none'}",
             f"- gap hotspots (ratio outside [{GAP_LOW}, {GAP_HIGH}]): {len(spots)}", ""]
    by_type = Counter(r.kernel_type for r in run.replayed)
    if by_type:
        lines += ["## Replayed rows by kernel type", "", "| kernel type | rows |", "|---|---:|"]
        lines += [f"| {k} | {n} |" for k, n in sorted(by_type.items())] + [""]
    if run.failed:
        lines += ["## Failures", "", "| kernel type | row | input shapes | reason |",
                  "|---|---:|---|---|"]
        lines += [f"| {r.kernel_type} | {r.row_index + 2} | `{r.input_shapes}` | "
                  f"{r.outcome.error} |" for r in run.failed] + [""]
    if spots:
        lines += [f"## Gap hotspots (top {min(top, len(spots))})", "",
                  "| kernel type | row | input shapes | profiling us | microbench us | ratio |",
                  "|---|---:|---|---:|---:|---:|"]
        lines += [f"| {h.result.kernel_type} | {h.result.row_index + 2} | "
                  f"`{h.result.input_shapes}` | {format_number(h.result.profiling_avg_us)} | "
                  f"{format_number(h.result.outcome.stats.mean_us)} | {h.ratio:.3f} |"
                  for h in spots[:top]] + [""]
    return "\n".join(lines)


def render_hotspots_csv(spots: list[Hotspot]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HOTSPOT_COLUMNS)
    for h in spots:
        r = h.result
        w.writerow([r.kernel_type, r.row_index + 2, r.input_shapes,
                    format_number(r.profiling_avg_us), format_number(r.outcome.stats.mean_us),
                    f"{h.ratio:.6g}"])
    return buf.getvalue()


def write_reports(run: ReplayRun, *, timestamp: str | None = None) -> tuple[Path, Path]:
    stamp = timestamp or time.strftime("%Y%m%d_%H%M%S")
    spots = hotspots(run)
    folder = run.database_path / "reports"
    md = folder / f"profile_update_report_{stamp}.md"
    hot = folder / f"duration_gap_hotspots_full_{stamp}.csv"
    write_files_atomic({md: render_markdown(run, spots), hot: render_hotspots_csv(spots)})
    return md, hot
