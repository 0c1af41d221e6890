"""Per-call overhead a collector's timing adds to a measured kernel table, fitted per table.

A kernel table's latency at vanishing work is not zero: it is the fixed cost of one
call as the collector timed it (kernel launches, activation-quantisation kernels, host
time when the collector ran without a CUDA graph). A deployment that replays CUDA
graphs pays only the GPU side of that: per kernel it launches, about the floor of the
best-timed kernel of the same table.

`fit_call_overheads(table, system)` fits, for every (operation, dtype, implementation)
of a GEMM table, `latency = c0 + a * bytes + b * flops` (robust non-negative least squares)
over the table's small-work rows (roofline time at peak below `small_work_s`), and
reports the intercept `c0` with its standard error. The *excess* of an implementation
is the part of `c0` that its collector's timing added and a graph-replaying deployment
does not run: `c0` minus the cheapest intercept among the table's implementations that
launch as many kernels per call (`kernels_per_call`: the same kernels timed the cleanest
way in the same harness), never below zero. An implementation with no such peer is
compared with `kernels_per_call x floor` (the floor: the table's smallest intercept), and
only an excess above one host launch per kernel (the device's `launch_overhead_us`)
counts: less than that is within what the kernels themselves can take.

The result is a `HarnessCorrection` record: derived from one snapshot (its source
revision), versioned by `PROCEDURE`, never a rewrite of the raw rows. `save_correction`
keeps it next to the evidence store's snapshot (`derived/<hex>/<procedure>.json`).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from perfcast.core.canonical import content_digest
from perfcast.core.dtypes import DType, dtype_bytes

PROCEDURE = "harness_overhead.v1"
SMALL_WORK_S = 5e-6          # rows whose roofline time at peak is below this are "small work"
MIN_ROWS = 8

# GPU kernels a deployment launches per call of an implementation, beyond the GEMM
# itself (activation quantisation), by the implementation's weight format; an
# implementation that takes bf16 input and converts inside its one kernel is listed.
KERNELS_PER_CALL = {"bf16": 1, "fp16": 1, "fp32": 1, "tf32": 1}
QUANTISED_ACTIVATION_KERNELS = 2      # dynamic or static activation quantise + GEMM
SINGLE_KERNEL_IMPLEMENTATIONS = {
    "FlashInferFp8BlockScaledMMKernel": (
        "vLLM scaled_mm/flashinfer.py::FlashInferFp8BlockScaledMMKernel sets "
        "apply_input_quant = False: FlashInfer takes bf16 input and quantises inside"),
}


@dataclass(frozen=True)
class CallOverhead:
    operation: str
    dtype: str
    implementation: str
    intercept_s: float          # fitted latency at vanishing work
    intercept_std_s: float      # its 1-sigma (standard error of the fit)
    rows: int                   # small-work rows in the fit
    kernels_per_call: int
    excess_s: float             # intercept above its same-kernel-count reference, >= 0
    excess_std_s: float

    def describe(self) -> str:
        return (f"{self.excess_s * 1e6:.1f} +- {self.excess_std_s * 1e6:.1f} us per call "
                f"above the cheapest {self.kernels_per_call}-kernel call of the table "
                f"(intercept {self.intercept_s * 1e6:.1f} us over {self.rows} small-work rows)")


@dataclass(frozen=True)
class HarnessCorrection:
    """Fitted per-call overheads of one measured table (a derived record)."""

    source_revision: str                  # the snapshot / database revision it was fitted on
    floor_s: float                        # smallest intercept of the table's implementations
    floor_implementation: str
    entries: tuple[CallOverhead, ...] = ()
    procedure: str = PROCEDURE
    small_work_s: float = SMALL_WORK_S
    notes: tuple[str, ...] = field(default=())

    def lookup(self, operation: str, dtype: str, implementation: str) -> CallOverhead | None:
        for e in self.entries:
            if (e.operation, e.dtype, e.implementation) == (operation, dtype, implementation):
                return e
        return None

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["digest"] = content_digest("perfcast.HarnessCorrection", doc)
        return doc

    @staticmethod
    def from_json(doc: dict) -> "HarnessCorrection":
        entries = tuple(CallOverhead(**e) for e in doc.get("entries", ()))
        return HarnessCorrection(doc["source_revision"], doc["floor_s"],
                                 doc["floor_implementation"], entries,
                                 doc.get("procedure", PROCEDURE),
                                 doc.get("small_work_s", SMALL_WORK_S),
                                 tuple(doc.get("notes", ())))


def kernels_per_call(dtype: str, implementation: str) -> int:
    if implementation in SINGLE_KERNEL_IMPLEMENTATIONS:
        return 1
    return KERNELS_PER_CALL.get(dtype, QUANTISED_ACTIVATION_KERNELS)


def _gemm_work(m, n, k, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        width = dtype_bytes(DType(dtype))
    except ValueError:
        width = 2.0
    act = width if width < 2 else 2.0     # quantised GEMMs read quantised activations
    bytes_ = m * k * act + k * n * width + m * n * 2.0
    return bytes_, 2.0 * m * n * k


def intercept_fit(latency: np.ndarray, bytes_: np.ndarray, flops: np.ndarray
                  ) -> tuple[float, float]:
    """Intercept and its standard error of `latency = c0 + a bytes + b flops` with
    c0, a, b >= 0: robust least squares (soft-L1; started flat at the median latency,
    then rescaled by the median absolute residual), so a few outlying rows, even at high
    leverage, do not move the intercept; columns scaled to unit maximum."""
    from scipy.optimize import least_squares

    unit = float(np.median(latency)) or 1.0          # solve in units of the median latency
    y = latency / unit
    a = np.column_stack([np.ones_like(y), bytes_, flops])
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    x = a / scale
    # start flat at the median (a least-squares start would chase high-leverage outliers)
    start = np.array([1.0, 0.0, 0.0])
    fit = least_squares(lambda c: x @ c - y, start, bounds=(0.0, np.inf),
                        loss="soft_l1", f_scale=0.05, x_scale="jac")
    mad = float(np.median(np.abs(x @ fit.x - y)))
    fit = least_squares(lambda c: x @ c - y, fit.x, bounds=(0.0, np.inf),
                        loss="soft_l1", f_scale=max(1.4826 * mad, 1e-3), x_scale="jac")
    f_scale = max(1.4826 * mad, 1e-3)
    resid = x @ fit.x - y
    inliers = np.abs(resid) <= 3 * max(f_scale, 1.4826 * float(np.median(np.abs(resid))))
    dof = max(int(inliers.sum()) - 3, 1)
    sigma2 = float(resid[inliers] @ resid[inliers]) / dof
    cov = sigma2 * np.linalg.pinv(x[inliers].T @ x[inliers])
    return (float(fit.x[0] / scale[0] * unit),
            float(math.sqrt(max(cov[0, 0], 0.0)) / scale[0] * unit))


def fit_call_overheads(table, system, *, source_revision: str = "",
                       small_work_s: float = SMALL_WORK_S) -> HarnessCorrection | None:
    """The per-call overheads of a measured table's GEMM rows (None: no GEMM rows)."""
    import pyarrow.compute as pc

    if any(f"sel.int.{d}" not in table.column_names for d in "mnk"):
        return None
    g = table.filter(pc.equal(table["operation"], "gemm"))
    if g.num_rows == 0:
        return None
    col = {c: g.column(c).to_numpy(zero_copy_only=False)
           for c in ("sel.int.m", "sel.int.n", "sel.int.k", "latency_s", "dtype")}
    impls = (g.column("sel.str.implementation").to_pylist()
             if "sel.str.implementation" in g.column_names else [""] * g.num_rows)
    m, n, k = (col[c].astype(float) for c in ("sel.int.m", "sel.int.n", "sel.int.k"))
    lat = col["latency_s"].astype(float)
    dtypes = col["dtype"].astype(object)
    impls = np.asarray([i or "" for i in impls], dtype=object)
    matrix = system.device.engines.get("matrix")
    bw = system.device.memory.bw_bytes_per_s
    fits, notes = [], []
    for dtype, impl in sorted(set(zip(dtypes.tolist(), impls.tolist()))):
        sel = (dtypes == dtype) & (impls == impl)
        peak = matrix.peak_for(dtype) if matrix is not None else None
        if not peak:
            notes.append(f"{dtype}/{impl or '-'}: no matrix peak for {dtype}; not fitted")
            continue
        b, f = _gemm_work(m[sel], n[sel], k[sel], dtype)
        small = np.maximum(f / peak, b / bw) < small_work_s
        if small.sum() < MIN_ROWS:
            notes.append(f"{dtype}/{impl or '-'}: {int(small.sum())} small-work rows "
                         f"(< {MIN_ROWS}); not fitted")
            continue
        c0, std = intercept_fit(lat[sel][small], b[small], f[small])
        fits.append((dtype, impl, c0, std, int(small.sum())))
    if not fits:
        return HarnessCorrection(source_revision, 0.0, "", (), notes=tuple(notes),
                                 small_work_s=small_work_s)
    floor_dtype, floor_impl, floor, floor_std, _ = min(fits, key=lambda t: t[2])
    launch = system.device.launch_overhead_s
    entries = []
    for dtype, impl, c0, std, rows in fits:
        kpc = kernels_per_call(dtype, impl)
        peers = [(c, s_) for d, i, c, s_, _ in fits
                 if kernels_per_call(d, i) == kpc and (d, i) != (dtype, impl)]
        if peers:
            ref, ref_std = min(peers)
            excess = max(0.0, c0 - ref) if c0 > ref else 0.0
        else:
            ref, ref_std = kpc * floor, kpc * floor_std
            excess = c0 - ref if c0 - ref > kpc * launch else 0.0
        excess_std = math.hypot(std, ref_std) if excess > 0 else 0.0
        entries.append(CallOverhead("gemm", dtype, impl, c0, std, rows, kpc, excess, excess_std))
    return HarnessCorrection(source_revision, floor, f"{floor_dtype}/{floor_impl}",
                             tuple(entries), notes=tuple(notes), small_work_s=small_work_s)


def correction_path(store_root: str | Path, snapshot_digest: str,
                    procedure: str = PROCEDURE) -> Path:
    hexd = snapshot_digest.split(":", 1)[-1]
    return Path(store_root) / "derived" / hexd / f"{procedure}.json"


def save_correction(store_root: str | Path, snapshot_digest: str,
                    correction: HarnessCorrection) -> Path:
    """Write the correction beside the store's snapshot (atomically; an existing file of
    the same procedure and snapshot is identical by construction and kept)."""
    path = correction_path(store_root, snapshot_digest, correction.procedure)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(correction.to_json(), fh, indent=1, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def load_correction(store_root: str | Path, snapshot_digest: str,
                    procedure: str = PROCEDURE) -> HarnessCorrection | None:
    path = correction_path(store_root, snapshot_digest, procedure)
    if not path.exists():
        return None
    return HarnessCorrection.from_json(json.loads(path.read_text()))
