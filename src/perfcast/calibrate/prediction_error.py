"""Error bands of serving predictions, from held-out residuals (part
`serving_prediction_error`).

The serving fit cross-validates: every row is also predicted by a fit that did not see
its group (its model, under leave-one-model-out). The ratios measured / predicted of
those held-out predictions say how far a prediction of a deployment the fit has not seen
lands from the measurement. This part keeps, per engine and metric (TTFT, TPOT), three
percentiles of them (low, median, high), and the pooled ones over every engine for an
engine with fewer than `MIN_ROWS` held-out rows. A prediction p gets the band
[p x ratio_low, p x ratio_high] and the median p x ratio_median.

The band's own held-out check (`coverage`): per group of the scheme, the percentiles of
the other groups' held-out ratios, applied to this group's rows; the share of rows whose
measurement falls inside. Nothing is refitted for it: each ratio is already held out.
The percentile levels are chosen by that check, per metric: the narrowest symmetric pair
of `LEVELS` whose held-out coverage reaches `TARGET_COVERAGE` (errors of an unseen model
spread wider than the pooled ratios, so p10-p90 of them holds less than 80% of a new
model's rows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from perfcast.calibrate.revision import CalibrationPart, FittedParameter, make_part
from perfcast.calibrate.serving import row_groups
from perfcast.core.errors import ConfigError

PART_NAME = "serving_prediction_error"
PROCEDURE = "heldout_ratio_quantiles"
PROCEDURE_VERSION = 1
TARGET_COVERAGE = 0.8
LEVELS = (10.0, 7.5, 5.0, 2.5, 1.0)   # candidate lower percentile levels, narrowest first
POINTS = ("low", "median", "high")
METRICS = ("ttft", "tpot")
MIN_ROWS = 20          # held-out rows of an engine for its own quantiles
POOLED = "pool"        # parameter namespace of the quantiles over every engine
RATIO_UPPER = 1e3      # bounds of a stored ratio (measured / predicted)


def parameter_name(backend: str, metric: str, point: str) -> str:
    return f"serving.{backend}.{metric}_ratio_{point}"


def ratio_quantiles(measured: np.ndarray, predicted: np.ndarray,
                    level: float = LEVELS[0]) -> dict[str, float] | None:
    """{"low", "median", "high"}: percentiles `level`, 50 and 100 - `level` of measured /
    predicted over the finite positive pairs; None without any."""
    m, p = np.asarray(measured, float), np.asarray(predicted, float)
    ok = np.isfinite(m) & np.isfinite(p) & (m > 0) & (p > 0)
    if not ok.any():
        return None
    r = m[ok] / p[ok]
    return dict(zip(POINTS, (float(v) for v in np.percentile(r, [level, 50.0, 100.0 - level]))))


def quantile_table(backends: Sequence[str], measured: Mapping[str, np.ndarray],
                   predicted: Mapping[str, np.ndarray], mask: np.ndarray,
                   min_rows: int = MIN_ROWS, levels: Mapping[str, float] | None = None
                   ) -> dict[str, dict[str, dict[str, float]]]:
    """{engine or POOLED: {metric: {point: ratio}}} over the rows in `mask` at each
    metric's lower percentile level (`levels`, default LEVELS[0]); an engine with fewer
    than `min_rows` rows there gets no entry of its own."""
    levels = levels or {}
    be = np.asarray(backends, dtype=object)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, sel in [(POOLED, mask), *((b, mask & (be == b)) for b in sorted(set(be[mask])))]:
        if name != POOLED and int(sel.sum()) < min_rows:
            continue
        entry = {}
        for metric in METRICS:
            qs = ratio_quantiles(measured[metric][sel], predicted[metric][sel],
                                 levels.get(metric, LEVELS[0]))
            if qs is not None:
                entry[metric] = qs
        if len(entry) == len(METRICS):
            out[name] = entry
    return out


def _lookup(table: Mapping, backend: str) -> dict | None:
    return table.get(backend) or table.get(POOLED)


def band_coverage(groups: Sequence[str], backends: Sequence[str],
                  measured: Mapping[str, np.ndarray], predicted: Mapping[str, np.ndarray],
                  usable: np.ndarray, min_rows: int = MIN_ROWS,
                  levels: Mapping[str, float] | None = None) -> dict:
    """Held-out check of the low-high band: for each group, the percentiles of the other
    groups' rows applied to its rows. {"rows", metric: share inside, "groups": [...]}"""
    g = np.asarray(groups, dtype=object)
    be = np.asarray(backends, dtype=object)
    inside = {m: 0 for m in METRICS}
    counted = 0
    per_group = []
    for name in sorted(set(g[usable])):
        held = usable & (g == name)
        table = quantile_table(backends, measured, predicted, usable & ~held, min_rows,
                               levels)
        hits = {m: 0 for m in METRICS}
        n = 0
        for i in np.flatnonzero(held):
            entry = _lookup(table, be[i])
            if entry is None:
                continue
            n += 1
            for m in METRICS:
                lo, hi = entry[m]["low"], entry[m]["high"]
                ratio = measured[m][i] / predicted[m][i]
                hits[m] += int(lo <= ratio <= hi)
        if n:
            per_group.append({"held_out": name, "rows": n,
                              **{m: round(hits[m] / n, 4) for m in METRICS}})
            counted += n
            for m in METRICS:
                inside[m] += hits[m]
    return {"rows": counted, **{m: (round(inside[m] / counted, 4) if counted else None)
                                for m in METRICS}, "groups": per_group}


def fit_part(rows: Sequence[dict], scheme: Mapping, measured_ttft: np.ndarray,
             measured_tpot: np.ndarray, usable: np.ndarray, fitted_on: Mapping,
             min_rows: int = MIN_ROWS) -> CalibrationPart:
    """The part from one cross-validation scheme of the serving fit (`cross_validate`'s
    result: `group_by` and the held-out `predictions`)."""
    pred = {"ttft": np.asarray(scheme["predictions"]["ttft"], float),
            "tpot": np.asarray(scheme["predictions"]["tpot"], float)}
    meas = {"ttft": np.asarray(measured_ttft, float), "tpot": np.asarray(measured_tpot, float)}
    ok = np.asarray(usable, bool).copy()
    for m in METRICS:
        ok &= np.isfinite(pred[m]) & np.isfinite(meas[m]) & (pred[m] > 0) & (meas[m] > 0)
    if int(ok.sum()) < min_rows:
        raise ConfigError(f"only {int(ok.sum())} rows with held-out predictions; error "
                          f"bands need at least {min_rows}", field="min_rows")
    backends = [(r.get("backend") or "").strip() for r in rows]
    groups = row_groups(rows, scheme["group_by"])
    levels, coverage = choose_levels(groups, backends, meas, pred, ok, min_rows)
    table = quantile_table(backends, meas, pred, ok, min_rows, levels)
    params = []
    for name, entry in sorted(table.items()):
        for m in METRICS:
            for point, level in zip(POINTS, (levels[m], 50.0, 100.0 - levels[m])):
                params.append(FittedParameter(
                    name=parameter_name(name, m, point), value=round(entry[m][point], 6),
                    unit="1", lower=0.0, upper=RATIO_UPPER,
                    description=(f"percentile {level:g} of measured / predicted "
                                 f"{m.upper()} over the held-out rows of "
                                 f"{'every engine' if name == POOLED else name}")))
    group_by = scheme["group_by"]
    rows_per = {name: int((ok & (np.asarray(backends, dtype=object) == name)).sum())
                for name in table if name != POOLED}
    return make_part(PART_NAME, procedure={
        "name": PROCEDURE, "version": PROCEDURE_VERSION, "scheme": group_by,
        "target_coverage": TARGET_COVERAGE, "candidate_levels": list(LEVELS),
        "levels": {m: [levels[m], 50.0, 100.0 - levels[m]] for m in METRICS},
        "min_rows": min_rows},
        parameters=params,
        fitted_on={**fitted_on, "rows": int(ok.sum()), "rows_per_backend": rows_per},
        cv={"group_by": group_by, "coverage": coverage})


def choose_levels(groups, backends, measured, predicted, usable, min_rows=MIN_ROWS
                  ) -> tuple[dict[str, float], dict]:
    """Per metric the first of `LEVELS` whose band holds `TARGET_COVERAGE` of the
    held-out groups' rows (the widest when none does), and that band's coverage."""
    levels: dict[str, float] = {}
    for m in METRICS:
        for level in LEVELS:
            cov = band_coverage(groups, backends, measured, predicted, usable, min_rows,
                                {**levels, m: level})
            if cov[m] is not None and cov[m] >= TARGET_COVERAGE:
                break
        levels[m] = level
    coverage = band_coverage(groups, backends, measured, predicted, usable, min_rows, levels)
    return levels, coverage


@dataclass(frozen=True)
class PredictionBand:
    """Held-out ratio quantiles that apply to one engine's predictions."""

    revision: str
    engine: str          # whose quantiles: the engine, or POOLED
    scheme: str          # the CV grouping the ratios were held out by
    rows: int
    ratios: Mapping[str, Mapping[str, float]]   # metric -> {point: measured / predicted}
    coverage: Mapping[str, float]               # metric -> held-out share inside the band

    def apply(self, metric: str, predicted_ms: float) -> dict[str, float]:
        """{"low", "median", "high"} in ms for a predicted value of `metric`."""
        return {point: float(predicted_ms) * self.ratios[metric][point] for point in POINTS}

    def basis(self) -> str:
        who = "every engine" if self.engine == POOLED else self.engine
        return (f"held-out measured / predicted ratios of {who} ({self.rows} rows, leave "
                f"one {self.scheme} out) in revision {self.revision[:19]}; the band held "
                f"{100 * self.coverage['ttft']:.0f}% of TTFT and "
                f"{100 * self.coverage['tpot']:.0f}% of TPOT measurements of held-out "
                f"{self.scheme}s")


def prediction_band(revision, backend: str) -> PredictionBand | None:
    """The band for `backend`'s predictions from `revision` (its own quantiles, else
    the pooled ones); None without a revision or without the part."""
    if revision is None:
        return None
    part = revision.part(PART_NAME)
    if part is None:
        return None
    values = part.values()
    rows_per = part.fitted_on.get("rows_per_backend", {})
    coverage = {m: part.cv["coverage"][m] for m in METRICS}
    for name in (backend, POOLED):
        try:
            ratios = {m: {p: values[parameter_name(name, m, p)] for p in POINTS}
                      for m in METRICS}
        except KeyError:
            continue
        rows = int(rows_per.get(name, part.fitted_on.get("rows", 0))) if name != POOLED \
            else int(part.fitted_on.get("rows", 0))
        return PredictionBand(revision.digest, name, str(part.procedure.get("scheme", "")),
                              rows, ratios, coverage)
    return None


def band_json(band: PredictionBand | None, ttft_ms: float | None,
              tpot_ms: float | None) -> dict | None:
    """`prediction_band` of the serve and validate outputs, for mean TTFT and TPOT."""
    if band is None or ttft_ms is None or tpot_ms is None:
        return None
    return {"ttft_ms": band.apply("ttft", ttft_ms), "tpot_ms": band.apply("tpot", tpot_ms),
            "held_out_coverage": {f"{m}_ms": band.coverage[m] for m in METRICS},
            "engine": band.engine, "scheme": band.scheme, "rows": band.rows,
            "basis": band.basis()}
