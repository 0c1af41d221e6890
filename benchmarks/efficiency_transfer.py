"""A calibration revision whose analytic efficiency curves (fitted on H100/H200 kernel
tables) are declared for another device after scoring them on that device's measured
kernels: nothing is refitted (`perfcast.calibrate.efficiency.transfer_part`).

    python benchmarks/efficiency_transfer.py [--system a100_sxm]
        [--vidur ../shared/reference/vidur/a100_phi-2_mlp.csv] [--dtype fp16]
        [--classes gemm.bf16] [-o benchmarks/data/calibration_a100_transfer.json]

Default: the shipped revision's `gemm.bf16` curve (fp16 GEMMs share it: same rate, same
bytes) scored on Vidur's measured A100 GEMMs of phi-2 (microsoft/vidur
data/profiling, the four linears of each layer at 1-4,096 tokens, fp16:
`self.model.to(dtype=torch.float16)` in vidur/profiling/mlp/mlp_wrapper.py at e26eb8f7).
The score (every one of those records held out: the curve never saw an A100) is what
`CalibratedAnalyticProvider` then reports as the answers' spread on A100. The catalog
roofline's error on the same records is printed beside it for comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIDUR = ROOT / ".." / "shared" / "reference" / "vidur" / "a100_phi-2_mlp.csv"
OUT = ROOT / "benchmarks" / "data" / "calibration_a100_transfer.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", default="a100_sxm")
    ap.add_argument("--vidur", type=Path, default=VIDUR, help="Vidur *_mlp.csv of --system")
    ap.add_argument("--dtype", default="fp16", help="the profile's dtype (Vidur does not "
                                                    "record it)")
    ap.add_argument("--classes", nargs="*", default=["gemm.bf16"])
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    import numpy as np

    from perfcast.calibrate.efficiency import (
        PART_NAME,
        error_stats,
        observations,
        roofline_latency_s,
        transfer_part,
    )
    from perfcast.calibrate.revision import CalibrationRevision, dumps
    from perfcast.calibrate.store import default_revision
    from perfcast.evidence.importers.vidur import VidurProfileImporter
    from perfcast.hardware import load_system

    system = load_system(args.system)
    db = VidurProfileImporter.from_csv(args.vidur, hardware=system.name, dtype=args.dtype)
    obs = observations(db, system)
    base = default_revision()
    part = transfer_part(base.part(PART_NAME), obs, classes=args.classes)
    parts = tuple(part if p.name == PART_NAME else p for p in base.parts)
    rev = CalibrationRevision(
        name=f"{base.name}+transfer-{system.name}", code_version=base.code_version,
        parts=parts, note=(f"{base.note} " if base.note else "") +
        f"{PART_NAME} {', '.join(args.classes)} transferred to {system.name}, scored on "
        f"{args.vidur.name}")
    args.output.write_text(dumps(rev) + "\n", encoding="utf-8")
    t = part.fitted_on["transfers"][system.name]
    roof = roofline_latency_s(obs, {system.name: system})
    for cls in t["classes"]:
        on = obs.cls == cls
        r = error_stats(roof[on], obs.measured_s[on])
        h = t["held_out"][cls]
        print(f"{cls} on {system.name}: {t['residual_spread'][cls]['records']} records; "
              f"transferred curve MAPE {100 * h['mape']:.1f}% (median log ratio "
              f"{h['median_log_ratio']:+.3f}); catalog roofline MAPE {100 * r['mape']:.1f}% "
              f"(median log ratio {r['median_log_ratio']:+.3f})")
        big = on & (obs.flops >= np.percentile(obs.flops[on], 75))
        print(f"  largest quarter by FLOPs: transferred "
              f"{100 * error_stats(_curve(part, cls, obs, big), obs.measured_s[big])['mape']:.1f}%"
              f", roofline {100 * error_stats(roof[big], obs.measured_s[big])['mape']:.1f}%")
    print(f"wrote {args.output} ({rev.digest})")
    return 0


def _curve(part, cls, obs, mask):
    from perfcast.evidence.calibrated import curve_latency_s, params_of

    vals = part.values()
    theta = [vals[f"efficiency.{cls}.{p.name}"] for p in params_of(cls)]
    sub = obs.take(mask)
    return curve_latency_s(cls, theta, sub.flops, sub.nbytes, sub.peak, sub.bw, sub.ideal_s)


if __name__ == "__main__":
    sys.exit(main())
