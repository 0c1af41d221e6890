"""The serving fit end to end: observation sets in, a calibration revision out.

`fit_serving_revision` loads silicon rows from observation sets, linearises the
simulator around data-free start values, runs every requested cross-validation scheme
and fits the final parameters on all usable rows (`perfcast.calibrate.serving`).
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from perfcast.calibrate.revision import CalibrationRevision, dumps
from perfcast.calibrate.serving import FitOptions, cross_validate, fit_part, linearise
from perfcast.core.errors import ConfigError


def code_version() -> str:
    """perfcast's version plus the git commit of the source tree when there is one."""
    import perfcast

    version = perfcast.__version__
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, cwd=Path(perfcast.__file__).parent, timeout=5)
        if head.returncode == 0 and head.stdout.strip():
            version += "+g" + head.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return version


def tree_digest(root: Path) -> str:
    """sha256 over the relative paths and bytes of every file under `root`: the identity
    of an evidence folder a fit read."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode("utf-8") + b"\0")
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return "sha256:" + h.hexdigest()


def rows_of(observation_sets: Sequence, *, mode: str | None = "agg") -> list[dict]:
    rows: list[dict] = []
    for obs in observation_sets:
        if obs.kind != "serving":
            raise ConfigError(f"observation set {obs.digest} holds {obs.kind} observations",
                              field="--observations", expected="serving (silicon) observations")
        rows.extend(r for r in obs.silicon_rows()
                    if mode is None or (r.get("mode") or "").strip() == mode)
    return rows


def fit_serving_revision(observation_sets: Sequence, *, evidence_root: Path | None,
                         model_configs: Path | None, cv: Sequence[str] = ("model",),
                         mode: str | None = "agg", options: FitOptions = FitOptions(),
                         name: str = "serving", workers: int | None = None,
                         progress: Callable[[str], None] | None = None,
                         analytic: CalibrationRevision | None = None,
                         disagg_handoff: bool = False
                         ) -> tuple[CalibrationRevision, dict]:
    """Fit, cross-validate and return (revision, details). `details` carries the
    linearised data and the held-out predictions per CV scheme (for benchmarks).
    `analytic`: a revision whose efficiency curves the simulator uses while fitting; its
    other parts join the new revision (they were fitted first, on kernel observations).
    `disagg_handoff`: then fit the disaggregated handoff on the sets' disagg rows that
    record their worker counts (`perfcast.calibrate.disagg_handoff`; skipped, with a
    progress note, when they are too few); `details["handoff"]` has its data and CV."""
    import tempfile

    analytic_file = None
    if analytic is not None:
        handle = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        with handle:
            handle.write(dumps(analytic))
        analytic_file = Path(handle.name)
    try:
        return _fit(observation_sets, evidence_root=evidence_root, model_configs=model_configs,
                    cv=cv, mode=mode, options=options, name=name, workers=workers,
                    progress=progress, analytic=analytic, analytic_file=analytic_file,
                    disagg_handoff=disagg_handoff)
    finally:
        if analytic_file is not None:
            analytic_file.unlink(missing_ok=True)


def joined_parts(part, analytic: CalibrationRevision | None, *new_parts) -> tuple:
    """The new parts and the parts of `analytic` they do not replace (a whole revision,
    e.g. the shipped one, may be given for its efficiency curves: its own fits of these
    parts are left out, and so are its disagg handoff and prediction error bands, fitted
    after overheads the new revision replaces)."""
    from perfcast.calibrate.disagg_handoff import PART_NAME as HANDOFF
    from perfcast.calibrate.prediction_error import PART_NAME as BANDS

    names = {p.name for p in (part, *new_parts)} | {HANDOFF, BANDS}
    return (part, *new_parts, *(p for p in (analytic.parts if analytic is not None else ())
                                if p.name not in names))


def _fit(observation_sets, *, evidence_root, model_configs, cv, mode, options, name, workers,
         progress, analytic, analytic_file, disagg_handoff) -> tuple[CalibrationRevision, dict]:
    rows = rows_of(observation_sets, mode=mode)
    if not rows:
        raise ConfigError("the observation sets hold no rows to fit", field="--observations",
                          expected=f"silicon rows of mode {mode}")
    data = linearise(rows, configs_dir=model_configs, evidence_root=evidence_root,
                     workers=workers, progress=progress, analytic_revision=analytic_file)
    if progress:
        progress(f"linearised in {data.seconds:.0f} s: {int(data.modelled.sum())} of "
                 f"{len(rows)} rows modelled")
    schemes = [cross_validate(data, g, configs_dir=model_configs, evidence_root=evidence_root,
                              options=options, workers=workers, progress=progress,
                              analytic_revision=analytic_file) for g in cv]
    fitted_on = {"observation_sets": [o.digest for o in observation_sets],
                 "evidence": [tree_digest(evidence_root)] if evidence_root else [],
                 "evidence_root": str(evidence_root) if evidence_root else "",
                 "model_configs": [tree_digest(model_configs)] if model_configs else [],
                 "systems": sorted({(r.get("system") or "").strip() for r in rows}),
                 "mode": mode or "all",
                 "analytic_revision": analytic.digest if analytic is not None else "none"}
    part, result = fit_part(data, fitted_on=fitted_on, cv=schemes, options=options)
    band = band_part(data, schemes, fitted_on, progress)
    extra = (band,) if band is not None else ()
    rev = CalibrationRevision(name=name, code_version=code_version(),
                              parts=joined_parts(part, analytic, *extra))
    details = {"data": data, "schemes": schemes, "fit": result,
               "usable": data.modelled & np.isfinite(data.measured_ttft)}
    if disagg_handoff:
        handoff = fit_handoff_after(observation_sets, rev, fitted_on, cv=cv,
                                    evidence_root=evidence_root, model_configs=model_configs,
                                    progress=progress)
        if handoff is not None:
            details["handoff"] = handoff
            rev = CalibrationRevision(name=name, code_version=code_version(),
                                      parts=joined_parts(part, analytic, *extra,
                                                         handoff["part"]))
    return rev, details


def band_part(data, schemes: Sequence[dict], fitted_on: dict, progress=None):
    """The prediction-error part (`perfcast.calibrate.prediction_error`) from the
    leave-one-model-out scheme, else the first one; None without a scheme or with too
    few held-out rows."""
    from perfcast.calibrate import prediction_error as pe

    if not schemes:
        return None
    scheme = next((s for s in schemes if s["group_by"] == "model"), schemes[0])
    usable = data.modelled & np.isfinite(data.measured_ttft) & np.isfinite(data.measured_tpot)
    try:
        part = pe.fit_part(data.rows, scheme, data.measured_ttft, data.measured_tpot, usable,
                           fitted_on={**fitted_on, "after": "serving_overheads"})
    except ConfigError as exc:
        if progress:
            progress(f"prediction error bands not fitted: {exc}")
        return None
    if progress:
        cov, levels = part.cv["coverage"], part.procedure["levels"]
        progress(f"prediction error bands from leave one {scheme['group_by']} out "
                 f"(percentiles TTFT {levels['ttft'][0]:g}-{levels['ttft'][2]:g}, TPOT "
                 f"{levels['tpot'][0]:g}-{levels['tpot'][2]:g}): they hold {cov['ttft']:.0%} "
                 f"of TTFT and {cov['tpot']:.0%} of TPOT measurements held out by "
                 f"{scheme['group_by']}")
    return part


def fit_handoff_after(observation_sets, rev: CalibrationRevision, fitted_on: dict, *, cv,
                      evidence_root, model_configs, progress) -> dict | None:
    """The disaggregated handoff fitted after the overheads of `rev` on the sets' disagg
    rows that record their worker counts: {"part", "data", "schemes", "fit",
    "predictions"}, or None when too few rows are modelled."""
    from perfcast.calibrate import disagg_handoff as dh

    rows = dh.with_worker_counts(rows_of(observation_sets, mode="disagg"))
    options = dh.HandoffOptions()
    if len(rows) < options.min_train_rows:
        if progress:
            progress(f"disagg handoff not fitted: {len(rows)} disagg rows record their "
                     f"worker counts, a fit needs {options.min_train_rows}")
        return None
    simulate = dh.validate_simulator(revision=rev, configs_dir=model_configs,
                                     evidence_root=evidence_root)
    data = dh.base_rows(rows, simulate)
    if int(data.usable.sum()) < options.min_train_rows:
        if progress:
            progress(f"disagg handoff not fitted: {int(data.usable.sum())} of {len(rows)} "
                     f"disagg rows modelled, a fit needs {options.min_train_rows}")
        return None
    schemes = [dh.cross_validate(data, g, simulate, options) for g in cv]
    part, result, predictions = dh.fit_part(
        data, fitted_on={**fitted_on, "mode": "disagg", "after": "serving_overheads"},
        cv=schemes, simulate=simulate, options=options)
    if progress:
        fitted = ", ".join(f"{b} {v / 1e3:.0f} ms" for b, v in result.per_backend().items()
                           if b in result.backends_fitted)
        progress(f"disagg handoff fitted on {result.rows} rows: {fitted}")
    return {"part": part, "data": data, "schemes": schemes, "fit": result,
            "predictions": predictions}
