"""A calibration revision with an A100 GEMM efficiency curve fitted on Vidur's measured
A100 GEMMs, by the procedure `perfcast calibrate fit-kernels` runs
(`perfcast.calibrate.efficiency.fit_efficiency`), cross-validated by weight shape.

    python benchmarks/efficiency_a100.py [--vidur CSV ...] [--dtype fp16]
        [-o benchmarks/data/calibration_a100_vidur.json] [--check] [--size-check]
    python benchmarks/efficiency_a100.py --extract VIDUR_CHECKOUT   # rewrite the tables

Input: the eight A100 MLP profiles of microsoft/vidur (`data/profiling/compute/a100/
<org>/<model>/mlp.csv` at 7d47513363ec, MIT): phi-2 (../shared/reference/vidur/
a100_phi-2_mlp.csv, byte-identical to Vidur's file) and the seven in
benchmarks/data/vidur_a100_mlp/ (Llama-2-7B and 70B, Llama-3-8B and 70B, CodeLlama-34B,
InternLM-20B, Qwen-72B: Vidur's rows and values unchanged, only the `median` and model
columns the importer reads; `--extract` rewrites them from a Vidur checkout). Each
profile times the four linears of one layer at TP 1, 2, 4 and 8 for 1-4,096 tokens
(Llama-3: 1-32,768), fp16 (`self.model.to(dtype=torch.float16)` in
vidur/profiling/mlp/mlp_wrapper.py); fp16 GEMMs are the `gemm.bf16` class, same rate and
bytes. One system and one harness, so the held-out score is leave-one-weight-shape-out
(`group_by=("shape",)`: each (n, k) weight is held out whole, over every profile and
token count that has it, its curve fitted on the others); that spread is what
`CalibratedAnalyticProvider` reports on A100. The revision holds only this part
(fitted_on.systems = [a100_sxm]): no other device is answered by it.

`--check` rebuilds the revision and compares its digest with the file's instead of
writing it. The transferred H100/H200 curve (benchmarks/efficiency_transfer.py) and the
catalog roofline are scored on the same records for comparison. `--size-check` (an
analysis): the curve fitted on the GEMMs below 10^11.5 FLOPs only, scored on the larger
ones (how the fitted form extrapolates in size).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIDUR = ROOT / ".." / "shared" / "reference" / "vidur" / "a100_phi-2_mlp.csv"
VIDUR_MORE = ROOT / "benchmarks" / "data" / "vidur_a100_mlp"
OUT = ROOT / "benchmarks" / "data" / "calibration_a100_vidur.json"
SYSTEM = "a100_sxm"
VIDUR_SOURCE = "microsoft/vidur data/profiling"
UPSTREAM = "data/profiling/compute/a100"
SIZE_CHECK_LOG10_FLOPS = 11.5


def default_tables() -> list[Path]:
    """phi-2 from the shared reference data, then the seven shipped profiles."""
    return [VIDUR, *sorted(VIDUR_MORE.glob("*.csv"))]


def extract(checkout: Path, out_dir: Path = VIDUR_MORE) -> list[Path]:
    """Write each A100 mlp.csv of a Vidur checkout but phi-2 (in the shared reference data
    as is) to `out_dir/<org>--<model>.csv`: the same rows in the same order, the cells as
    Vidur wrote them, only the `time_stats.<op>.median` and model columns."""
    from perfcast.evidence.importers.vidur import MODEL_COLUMNS

    keep_model = (*MODEL_COLUMNS, "vocab_size")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sorted((checkout / UPSTREAM).glob("*/*/mlp.csv")):
        org, model = src.parent.parent.name, src.parent.name
        if model == "phi-2":
            continue
        with open(src, newline="") as f:
            reader = csv.reader(f)
            header = next(reader)
            cols = [i for i, c in enumerate(header)
                    if c.endswith(".median") or c in keep_model]
            rows = [[row[i] for i in cols] for row in reader]
        dst = out_dir / f"{org}--{model}.csv"
        with open(dst, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow([header[i] for i in cols])
            w.writerows(rows)
        written.append(dst)
    return written


def load_observations(tables, dtype: str = "fp16"):
    """(Observations of every table, their import manifests)."""
    sys.path.insert(0, str(ROOT / "src"))
    from perfcast.calibrate.efficiency import Observations, observations
    from perfcast.evidence.importers.vidur import VidurProfileImporter
    from perfcast.hardware import load_system

    system = load_system(SYSTEM)
    dbs = [VidurProfileImporter.from_csv(Path(t), hardware=system.name, dtype=dtype)
           for t in tables]
    obs = Observations.concat([observations(db, system) for db in dbs])
    return obs, [s for db in dbs for s in db.sources]


def build(tables=None, dtype: str = "fp16"):
    """(revision, EfficiencyFit) from Vidur's A100 tables (default: `default_tables()`;
    one path or a list)."""
    tables = default_tables() if tables is None else \
        [tables] if isinstance(tables, (str, Path)) else list(tables)
    obs, sources = load_observations(tables, dtype)
    from perfcast.calibrate.efficiency import fit_efficiency
    from perfcast.calibrate.revision import CalibrationRevision, make_part, plain
    from perfcast.calibrate.store import default_revision

    fit = fit_efficiency(obs, group_by=("shape",))
    part = fit.part()
    fitted_on = plain(part.fitted_on)
    fitted_on["tables"] = [{"source": VIDUR_SOURCE, **s} for s in sources]
    cv = plain(part.cv)
    cv["summary"].pop("fit_wall_s", None)   # a timing: left out so the rebuild is identical
    part = make_part(part.name, procedure=plain(part.procedure), parameters=part.parameters,
                     fitted_on=fitted_on, cv=cv)
    base = default_revision()
    names = ", ".join(Path(t).name for t in tables)
    rev = CalibrationRevision(
        name="a100-vidur-gemm", code_version=base.code_version, parts=(part,),
        note=f"{part.name} for {SYSTEM} only, fitted on Vidur's {names} ({dtype}); held "
             "out by weight shape")
    return rev, fit


def size_check(obs, threshold: float = SIZE_CHECK_LOG10_FLOPS) -> dict:
    """The GEMM curve fitted on records below 10^threshold FLOPs, scored on the others,
    beside the curve fitted on every record (in sample) on the same large records."""
    import numpy as np

    from perfcast.calibrate.efficiency import error_stats, fit_class

    g = obs.take(obs.cls == "gemm.bf16")
    small = np.log10(g.flops) < threshold
    big = g.take(~small)
    part = fit_class(g.take(small), "gemm.bf16")
    whole = fit_class(g, "gemm.bf16")
    return {"threshold_log10_flops": threshold, "fit_records": int(small.sum()),
            "scored_records": int((~small).sum()),
            "extrapolated": error_stats(part.predict(big), big.measured_s),
            "fitted_on_all": error_stats(whole.predict(big), big.measured_s)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vidur", type=Path, nargs="+", default=None,
                    help="Vidur *_mlp.csv tables of A100 (default: phi-2 and the seven "
                         "in benchmarks/data/vidur_a100_mlp/)")
    ap.add_argument("--dtype", default="fp16", help="the profiles' dtype (Vidur does not "
                                                    "record it)")
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true",
                    help="rebuild and compare with --output instead of writing it")
    ap.add_argument("--size-check", action="store_true",
                    help="also fit below 10^11.5 FLOPs and score on the larger GEMMs")
    ap.add_argument("--extract", type=Path, metavar="VIDUR_CHECKOUT",
                    help="rewrite benchmarks/data/vidur_a100_mlp/ from a Vidur checkout "
                         "and stop")
    args = ap.parse_args(argv)
    if args.extract:
        sys.path.insert(0, str(ROOT / "src"))
        for p in extract(args.extract):
            print(f"wrote {p}")
        return 0
    rev, fit = build(args.vidur, args.dtype)
    from perfcast.calibrate.efficiency import PART_NAME, error_stats, roofline_latency_s
    from perfcast.calibrate.revision import dumps
    from perfcast.calibrate.store import default_revision, read_revision
    from perfcast.evidence.calibrated import curve_latency_s, params_of
    from perfcast.hardware import load_system

    obs = fit.obs
    part = rev.part(PART_NAME)
    cv = part.cv
    print(f"{len(obs)} records from {len(part.fitted_on['tables'])} tables; "
          f"cross-validation by {cv['group_by']}, {len(cv['folds'])} folds:")
    for f in cv["folds"]:
        for cls, s in f["held_out_scores"].items():
            print(f"  held out {f['held_out']:<24} {cls}: {s['records']:5d} records, MAPE "
                  f"{100 * s['mape']:5.1f}% (median log ratio {s['median_log_ratio']:+.3f})")
    for cls, s in cv["summary"]["held_out"].items():
        ins = cv["summary"]["in_sample"][cls]
        print(f"{cls}: held-out MAPE {100 * s['mape']:.1f}% over {s['records']} records; "
              f"in-sample {100 * ins['mape']:.1f}%; spread "
              f"{cv['summary']['residual_spread'][cls]}")
        print(f"  fitted: {dict(zip([p.name for p in params_of(cls)], fit.fits[cls].values))}"
              f"; log10 FLOPs {fit.fits[cls].log10_flops}, bytes {fit.fits[cls].log10_bytes}")
        base = default_revision().part(PART_NAME).values()
        on = obs.take(obs.cls == cls)
        theta = [base[f"efficiency.{cls}.{p.name}"] for p in params_of(cls)]
        moved = curve_latency_s(cls, theta, on.flops, on.nbytes, on.peak, on.bw, on.ideal_s)
        roof = roofline_latency_s(on, {SYSTEM: load_system(SYSTEM)})
        for name, pred in (("H100/H200 curve transferred", moved), ("catalog roofline", roof)):
            e = error_stats(pred, on.measured_s)
            print(f"  same records: {name} MAPE {100 * e['mape']:.1f}% (median log ratio "
                  f"{e['median_log_ratio']:+.3f})")
    if args.size_check:
        s = size_check(obs)
        for key in ("extrapolated", "fitted_on_all"):
            e = s[key]
            print(f"size check ({s['fit_records']} records below 10^"
                  f"{s['threshold_log10_flops']} FLOPs, {s['scored_records']} above): {key} "
                  f"MAPE {100 * e['mape']:.1f}% (median log ratio {e['median_log_ratio']:+.3f})")
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
