"""`--calibration REV|default|none|FILE`, shared by estimate, serve, search and
validate silicon: which calibration revision supplies fitted numbers (none: physics
only, the values of the backend files and the device catalog)."""

from __future__ import annotations

from typing import Annotated

import typer

CALIBRATION_HELP = ("calibration revision: a digest or prefix from `perfcast calibrate list`, "
                    "a revision JSON file, `default` (shipped with perfcast) or `none` "
                    "(physics only)")

CalibrationOption = Annotated[str, typer.Option("--calibration", help=CALIBRATION_HELP)]


def load(ref: str):
    """The revision named by `--calibration` (None for `none`)."""
    from perfcast.calibrate.store import load_calibration

    return load_calibration(ref)


def backend_overheads(revision, backend: str) -> dict[str, float]:
    """Fitted host overheads of `backend` (Overheads fields in seconds); {} when the
    revision has none for it."""
    return all_overheads(revision).get(backend, {})


def all_overheads(revision) -> dict[str, dict[str, float]]:
    """{backend: {Overheads field (seconds): value}} of the revision's serving overheads
    and, when it has one, its disaggregated handoff; {} without a revision."""
    if revision is None:
        return {}
    from perfcast.calibrate.disagg_handoff import PART_NAME as HANDOFF
    from perfcast.calibrate.serving import PART_NAME, serving_overheads

    out = serving_overheads(revision.part(PART_NAME))
    for backend, fields in serving_overheads(revision.part(HANDOFF)).items():
        out.setdefault(backend, {}).update(fields)
    return out


def held_out_error(revision) -> dict | None:
    """The revision's pooled held-out serving error per CV scheme (what a prediction made
    with it should expect), or None."""
    if revision is None:
        return None
    from perfcast.calibrate.serving import PART_NAME

    part = revision.part(PART_NAME)
    if part is None:
        return None
    summary = part.cv.get("summary", {})
    out = {}
    for scheme, value in summary.items():
        held = value.get("held_out") if hasattr(value, "get") else None
        if held:
            out[f"leave_one_{scheme}_out"] = {k: held[k] for k in (
                "rows", "ttft_mape", "ttft_median_ape", "tpot_mape", "tpot_median_ape")
                if k in held}
    if "held_out" in summary:            # a revision fitted with one scheme
        out[f"leave_one_{part.cv.get('group_by')}_out"] = dict(summary["held_out"])
    return out or None


def analytic_for(revision):
    """system name -> the revision's calibrated analytic providers for it (built once per
    system, so cost caches keyed by provider stay valid); None without a revision."""
    from perfcast.evidence.calibrated import providers_by_system

    return providers_by_system(revision)
