"""A calibration revision with an A100 GEMM efficiency curve fitted on Vidur's measured
A100 GEMMs, by the procedure `perfcast calibrate fit-kernels` runs
(`perfcast.calibrate.efficiency.fit_efficiency`), cross-validated by weight shape.

    python benchmarks/efficiency_a100.py [--vidur ../shared/reference/vidur/a100_phi-2_mlp.csv]
        [--dtype fp16] [-o benchmarks/data/calibration_a100_vidur.json] [--check]

Input: microsoft/vidur data/profiling (../shared/reference/vidur/a100_phi-2_mlp.csv: the
four linears of phi-2's layer, TP 1, at 1-4,096 tokens, fp16:
`self.model.to(dtype=torch.float16)` in vidur/profiling/mlp/mlp_wrapper.py at e26eb8f7;
fp16 GEMMs are the `gemm.bf16` class, same rate and bytes). One system and one harness,
so the held-out score is leave-one-weight-shape-out (`group_by=("shape",)`: each of the
four (n, k) weights is held out whole, its curve fitted on the other three); that
spread is what `CalibratedAnalyticProvider` reports on A100. The revision holds only
this part (fitted_on.systems = [a100_sxm]): no other device is answered by it.

`--check` rebuilds the revision and compares its digest with the file's instead of
writing it. The transferred H100/H200 curve (benchmarks/efficiency_transfer.py) and the
catalog roofline are scored on the same records for comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIDUR = ROOT / ".." / "shared" / "reference" / "vidur" / "a100_phi-2_mlp.csv"
OUT = ROOT / "benchmarks" / "data" / "calibration_a100_vidur.json"
SYSTEM = "a100_sxm"
VIDUR_SOURCE = "microsoft/vidur data/profiling"


def build(vidur: Path = VIDUR, dtype: str = "fp16"):
    """(revision, EfficiencyFit) from the Vidur A100 table."""
    sys.path.insert(0, str(ROOT / "src"))
    from perfcast.calibrate.efficiency import fit_efficiency, observations
    from perfcast.calibrate.revision import CalibrationRevision, make_part, plain
    from perfcast.calibrate.store import default_revision
    from perfcast.evidence.importers.vidur import VidurProfileImporter
    from perfcast.hardware import load_system

    system = load_system(SYSTEM)
    db = VidurProfileImporter.from_csv(vidur, hardware=system.name, dtype=dtype)
    fit = fit_efficiency(observations(db, system), group_by=("shape",))
    part = fit.part()
    fitted_on = plain(part.fitted_on)
    fitted_on["tables"] = [{"source": VIDUR_SOURCE, **s} for s in db.sources]
    cv = plain(part.cv)
    cv["summary"].pop("fit_wall_s", None)   # a timing: left out so the rebuild is identical
    part = make_part(part.name, procedure=plain(part.procedure), parameters=part.parameters,
                     fitted_on=fitted_on, cv=cv)
    base = default_revision()
    rev = CalibrationRevision(
        name="a100-vidur-gemm", code_version=base.code_version, parts=(part,),
        note=f"{part.name} for {system.name} only, fitted on Vidur's {vidur.name} "
             f"({dtype}); held out by weight shape")
    return rev, fit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vidur", type=Path, default=VIDUR, help="Vidur *_mlp.csv of A100")
    ap.add_argument("--dtype", default="fp16", help="the profile's dtype (Vidur does not "
                                                    "record it)")
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true",
                    help="rebuild and compare with --output instead of writing it")
    args = ap.parse_args(argv)
    rev, fit = build(args.vidur, args.dtype)
    from perfcast.calibrate.efficiency import PART_NAME, error_stats, roofline_latency_s
    from perfcast.calibrate.revision import dumps
    from perfcast.calibrate.store import read_revision
    from perfcast.calibrate.store import default_revision
    from perfcast.evidence.calibrated import curve_latency_s, params_of
    from perfcast.hardware import load_system

    obs = fit.obs
    part = rev.part(PART_NAME)
    cv = part.cv
    print(f"{len(obs)} records; cross-validation by {cv['group_by']}:")
    for f in cv["folds"]:
        for cls, s in f["held_out_scores"].items():
            print(f"  held out {f['held_out']:<22} {cls}: {s['records']} records, MAPE "
                  f"{100 * s['mape']:.1f}% (median log ratio {s['median_log_ratio']:+.3f})")
    for cls, s in cv["summary"]["held_out"].items():
        ins = cv["summary"]["in_sample"][cls]
        print(f"{cls}: held-out MAPE {100 * s['mape']:.1f}% over {s['records']} records; "
              f"in-sample {100 * ins['mape']:.1f}%; spread "
              f"{cv['summary']['residual_spread'][cls]}")
        base = default_revision().part(PART_NAME).values()
        on = obs.take(obs.cls == cls)
        theta = [base[f"efficiency.{cls}.{p.name}"] for p in params_of(cls)]
        moved = curve_latency_s(cls, theta, on.flops, on.nbytes, on.peak, on.bw, on.ideal_s)
        roof = roofline_latency_s(on, {SYSTEM: load_system(SYSTEM)})
        print(f"  same records: H100/H200 curve transferred MAPE "
              f"{100 * error_stats(moved, on.measured_s)['mape']:.1f}%, catalog roofline "
              f"{100 * error_stats(roof, on.measured_s)['mape']:.1f}%")
    if args.check:
        shipped = read_revision(args.output)
        same = shipped.digest == rev.digest
        print(f"{args.output}: {shipped.digest} {'matches' if same else 'differs from'} "
              f"the rebuild {rev.digest}")
        return 0 if same else 1
    args.output.write_text(dumps(rev) + "\n", encoding="utf-8")
    print(f"wrote {args.output} ({rev.digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
