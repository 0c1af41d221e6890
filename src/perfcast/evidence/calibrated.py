"""`CalibratedAnalyticProvider`: the roofline with fitted, size-dependent efficiencies.

A calibration revision's `analytic_efficiency` part (fitted by
`perfcast.calibrate.efficiency`, docs/notes/efficiency-curves.md) holds one curve per
operation class. For a query of a fitted class this provider answers

    t = t0 + (t_c^q + t_m^q)^(1/q) * (1 + (t_half / t_ideal)^h)
    t_c = F / (P e_c),  t_m = B / (W e_m),  t_ideal = max(F / P, B / W)

(collectives: t = t0 + t_ideal / e_bw * (1 + (t_half / t_ideal)^h), t_ideal the ring
bandwidth term at the link's bare bandwidth), i.e. the ideal roofline time divided by
the fitted efficiency, with method `calibrated`, the revision digest and part named in
its provenance, and an uncertainty taken from the class's held-out residual spread:
`rel_std` = robust sigma of log(predicted / measured) over every held-out record of
every cross-validation fold, low/high from its 10th/90th percentile ratios,
`confidence = exp(-rel_std)` (the interpolation convention).

A class that was not fitted (or was fitted but has no held-out score), a device of
another vendor than the fitted ones, or a size more than `MARGIN_DECADES` outside the
fitted range of log FLOPs or log bytes is a `Miss` with the reason, so the resolver falls
through to the plain roofline / collective model. A part may declare its curves for
another system (`fitted_on.transfers.<system>`,
`perfcast.calibrate.efficiency.transfer_part`): there only the classes scored on that
system's measured kernels answer, with that score as their spread. On a device of the
fitted devices' vendor with neither records nor a declared transfer, every curve
answers (the curves are efficiencies against each device's own peaks and bandwidths),
with the part's held-out spread, whose folds leave one fitted device out, and an
assumption saying the device has no record in the fit (docs/calibration.md gives the
serving-level check). It belongs after the measured and interpolating
providers and before the analytic ones:

    providers = [measured, interpolation,
                 *calibrated_providers(system, revision),   # [] without the part
                 RooflineCostProvider(system), CollectiveCostProvider(system)]
    resolver = CostResolver(providers)

The curve, its parameters and the class names live here (the evidence layer) so that
the fitting code in `perfcast.calibrate` and this provider share one definition.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perfcast.core.canonical import content_digest
from perfcast.core.dtypes import engine_dtype
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import (
    CostEstimate,
    CostQuery,
    CostSubject,
    EstimateMethod,
    MatchKind,
    Miss,
    Uncertainty,
)
from perfcast.evidence.measured_view import evidence_dtype
from perfcast.hardware.model import EngineKind, System

PART_NAME = "analytic_efficiency"
MARGIN_DECADES = 0.5   # a query up to 10^0.5 (~3.2x) past the fitted size range is answered
OPERATOR_OPERATIONS = ("gemm", "attention", "moe")
# dtype family of a class: fp16 shares the bf16 curve (same rate, same bytes)
FAMILY = {"fp16": "bf16"}
# math dtype (rate) of each quantisation mode a table is keyed by (weight-only formats
# dequantise to the activation dtype)
COMPUTE = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp8_block": "fp8", "int8": "int8",
           "int4": "bf16", "mxfp4": "bf16", "nvfp4": "bf16"}
# collective -> factor of the bandwidth term over M / B_link (ring, p participants)
RING_FACTOR = {"all_reduce": lambda p: 2.0 * (p - 1) / p,
               "all_gather": lambda p: (p - 1) / p, "reduce_scatter": lambda p: (p - 1) / p,
               "all_to_all": lambda p: (p - 1) / p}


@dataclass(frozen=True)
class Param:
    name: str
    unit: str
    lower: float
    upper: float
    start: float
    description: str


OPERATOR_PARAMS = (
    Param("e_compute", "fraction", 1e-3, 1.0, 0.7, "compute efficiency of large kernels"),
    Param("e_memory", "fraction", 1e-3, 1.0, 0.8, "bandwidth efficiency of large kernels"),
    Param("overlap_q", "1", 1.0, 8.0, 2.0, "compute/memory overlap exponent (8 ~ max)"),
    Param("log10_t_half_s", "log10 s", -8.0, -2.0, -5.0,
          "ideal time at which the size factor halves efficiency"),
    Param("size_h", "1", 0.05, 2.0, 0.7, "exponent of the approach to full size"),
    Param("t0_us", "us", 0.0, 1000.0, 2.0, "fixed latency floor (launch, sync)"),
)
COLLECTIVE_PARAMS = (
    Param("e_bw", "fraction", 1e-3, 1.0, 0.7, "link-bandwidth efficiency of large messages"),
    Param("log10_t_half_s", "log10 s", -8.0, -1.0, -4.0,
          "ideal time at which the size factor halves efficiency"),
    Param("size_h", "1", 0.05, 2.0, 0.7, "exponent of the approach to full size"),
    Param("t0_us", "us", 0.0, 1000.0, 5.0, "fixed latency floor (launch, handshake)"),
)


def is_collective(cls: str) -> bool:
    return cls.split(".", 1)[0] in RING_FACTOR


def params_of(cls: str) -> tuple[Param, ...]:
    return COLLECTIVE_PARAMS if is_collective(cls) else OPERATOR_PARAMS


def curve_latency_s(cls: str, theta: Sequence[float], flops, nbytes, peak, bw, ideal):
    """Modelled latency in seconds (numpy arrays or floats). Operators use `flops`,
    `nbytes` (read + written), `peak` ops/s and HBM `bw` bytes/s; collectives only
    `ideal` (the ring bandwidth term at the link's bare bandwidth). Always >= ideal.
    Floats are computed without numpy (a query need not import it)."""
    if all(isinstance(v, (int, float)) for v in (flops, nbytes, ideal) if v is not None):
        maximum, as_float = max, float
    else:
        import numpy as np

        maximum, as_float = np.maximum, (lambda v: np.asarray(v, dtype=float))
    ideal = maximum(as_float(ideal), 1e-15)
    if is_collective(cls):
        e_bw, lg_half, h, t0_us = theta
        core = ideal / e_bw
    else:
        e_c, e_m, q, lg_half, h, t0_us = theta
        tc = as_float(flops) / (peak * e_c)
        tm = as_float(nbytes) / (bw * e_m)
        top = maximum(maximum(tc, tm), 1e-15)
        core = top * ((tc / top) ** q + (tm / top) ** q) ** (1.0 / q)
    return 1e-6 * t0_us + core * (1.0 + (10.0 ** lg_half / ideal) ** h)


def matrix_rate(system: System, dtype: str) -> float:
    """Peak matrix ops/s for a table/query dtype's math (fp8_block -> fp8, w4a16 -> bf16)."""
    eng = system.device.engine(EngineKind.MATRIX)
    key = engine_dtype(COMPUTE.get(dtype, dtype)).value
    rate = eng.peak_ops_per_s.get(key)
    if not rate:
        raise ConfigError(f"{system.name} has no matrix rate for {dtype} ({key})")
    return float(rate)


def operator_class(operation: str, dtype: str, phase: str = "") -> str:
    fam = FAMILY.get(dtype, dtype)
    if operation == "attention":
        return f"attention.{phase or 'prefill'}.{fam}"
    return f"{operation}.{fam}"


def collective_class(operation: str, participants: int) -> str:
    return f"{operation}.p{int(participants)}"


def link_bandwidth(system: System, participants: int) -> float:
    return float(system.tier_for_group(int(participants)).bw_bytes_per_s)


def query_class(query: CostQuery) -> str | Miss:
    """The efficiency class of a query, or why it has none."""
    if query.subject is CostSubject.COMMUNICATION:
        if query.operation not in RING_FACTOR:
            return Miss(f"no efficiency curve kind for collective {query.operation!r}")
        if query.participants < 2:
            return Miss(f"collective over {query.participants} participant(s)")
        return collective_class(query.operation, query.participants)
    if query.operation not in OPERATOR_OPERATIONS:
        return Miss(f"no efficiency curve kind for operation {query.operation!r}")
    if query.engine != "matrix":
        return Miss(f"{query.operation} on the {query.engine} engine is not a fitted kind")
    phase = ""
    if query.operation == "attention":
        phase = str(query.dim("phase", "") or "")
        if not phase:
            phase = "decode" if query.dim("q_tokens") == 1 else "prefill"
    return operator_class(query.operation, evidence_dtype(query), phase)


class CalibratedAnalyticProvider:
    """Roofline time / fitted efficiency for the classes of an `analytic_efficiency`
    part (see the module doc for the curve and where it sits in a resolver)."""

    def __init__(self, system: System, part, revision_digest: str) -> None:
        if part.name != PART_NAME:
            raise ConfigError(f"calibration part {part.name!r} is not {PART_NAME!r}",
                              field="part")
        self.system = system
        self.part = part
        self.revision_digest = revision_digest
        self.name = "calibrated_analytic"
        self.revision = content_digest("perfcast.CalibratedAnalyticProvider", {
            "system": system.digest, "part": part.digest, "revision": revision_digest})[:23]
        self.systems = tuple(part.fitted_on.get("systems", ()))
        values = part.values()
        domain = part.fitted_on.get("domain", {})
        spread = part.cv.get("summary", {}).get("residual_spread", {})
        # curves declared for a system the part was not fitted on (`transfer_part`): only
        # the classes scored on that system's records, with that score as their spread
        self.transfer = None if system.name in self.systems else \
            part.fitted_on.get("transfers", {}).get(system.name)
        if self.transfer is not None:
            self.systems = (*self.systems, system.name)
            spread = self.transfer.get("residual_spread", {})
        elif system.name not in self.systems and same_vendor(system, self.systems):
            # a device of the fitted devices' vendor with no records of its own: every
            # curve, with the part's held-out spread, whose folds leave one fitted device
            # out (the curves are efficiencies against each device's own peaks)
            self.transfer = {"from": list(self.systems), "classes": list(domain),
                             "undeclared": True}
            self.systems = (*self.systems, system.name)
        self.curves: dict[str, tuple[float, ...]] = {}
        self.domain: dict[str, Mapping] = {}
        self.spread: dict[str, Mapping] = {}
        self.unscored: set[str] = set()
        for cls in domain:
            names = [f"efficiency.{cls}.{p.name}" for p in params_of(cls)]
            if not all(n in values for n in names):
                continue
            if self.transfer is not None and cls not in self.transfer.get("classes", ()):
                continue
            if spread.get(cls, {}).get("log_std") is None:
                self.unscored.add(cls)     # no held-out error: not answered (invariant 9)
                continue
            self.curves[cls] = tuple(values[n] for n in names)
            self.domain[cls] = domain[cls]
            self.spread[cls] = spread[cls]

    def _transfer_note(self, spread: Mapping) -> str:
        fitted = ", ".join(self.transfer.get("from", ()))
        if self.transfer.get("undeclared"):
            return (f"curve fitted on {fitted}, applied to {self.system.name} without any "
                    f"record of it: spread from the curve's held-out residuals on the "
                    f"fitted devices, each left out in turn")
        return (f"curve fitted on {fitted}, transferred to {self.system.name}: scored on "
                f"{spread.get('records', 0)} of its records")

    def supports(self, query: CostQuery) -> bool | Miss:
        if query.hardware != self.system.name:
            return Miss(f"calibrated curves are built for {self.system.name}, "
                        f"not {query.hardware}")
        if self.system.name not in self.systems:
            return Miss(f"part {PART_NAME} was fitted on {', '.join(self.systems)}, "
                        f"not {self.system.name}")
        if query.zero_cost:
            return Miss("declared zero-cost op: left to the roofline")
        cls = query_class(query)
        if isinstance(cls, Miss):
            return cls
        if cls in self.unscored:
            return Miss(f"class {cls} was fitted but never scored on held-out records "
                        f"(one system and one framework) in revision {self.revision_digest}")
        if cls not in self.curves:
            return Miss(f"class {cls} has no fitted curve in revision {self.revision_digest}")
        return True

    def _ideal(self, cls: str, query: CostQuery) -> tuple[float, float, float, float, float] | Miss:
        """(flops, bytes, peak, bw, ideal_s) of the query, as the fit computed them."""
        if is_collective(cls):
            p = query.participants
            tier = self.system.tier_for_group(p)
            if query.network_tier and query.network_tier != tier.name:
                return Miss(f"curve {cls} was fitted on the {tier.name} tier, query asks "
                            f"{query.network_tier}")
            bw = float(tier.bw_bytes_per_s)
            m = float(query.message_bytes)
            if m <= 0:
                return Miss("collective query without message bytes")
            return 0.0, m, 0.0, bw, RING_FACTOR[query.operation](p) * m / bw
        try:
            peak = matrix_rate(self.system, evidence_dtype(query))
        except ConfigError as exc:
            return Miss(str(exc))
        bw = float(self.system.device.memory.bw_bytes_per_s)
        f, b = float(query.flops), float(query.bytes_total)
        if f <= 0 or b <= 0:
            return Miss(f"{query.operation} query needs FLOPs and bytes (got {f:g}, {b:g})")
        return f, b, peak, bw, max(f / peak, b / bw)

    def _outside(self, cls: str, flops: float, nbytes: float) -> str:
        dom = self.domain[cls]
        checks = [("log10_bytes", nbytes)] if is_collective(cls) else \
            [("log10_flops", flops), ("log10_bytes", nbytes)]
        for key, value in checks:
            lo, hi = dom[key]
            x = math.log10(value)
            if x < lo - MARGIN_DECADES or x > hi + MARGIN_DECADES:
                what = "message bytes" if is_collective(cls) else key.split("_", 1)[1]
                return (f"{what} 10^{x:.2f} outside the fitted range 10^{lo:.2f}..10^{hi:.2f}"
                        f" of {cls} by more than {MARGIN_DECADES} decades")
        return ""

    def estimate(self, query: CostQuery) -> CostEstimate | Miss:
        ok = self.supports(query)
        if ok is not True:
            return ok if isinstance(ok, Miss) else Miss("not supported")
        cls = query_class(query)
        work = self._ideal(cls, query)
        if isinstance(work, Miss):
            return work
        flops, nbytes, peak, bw, ideal = work
        why = self._outside(cls, flops, nbytes)
        if why:
            return Miss(why)
        theta = self.curves[cls]
        latency = float(curve_latency_s(cls, theta, flops, nbytes, peak, bw, ideal))
        spread = self.spread[cls]
        log_std = float(spread["log_std"])
        unc = Uncertainty(kind="heldout", rel_std=log_std,
                          low_s=latency * float(spread.get("ratio_p10", 1.0)),
                          high_s=latency * float(spread.get("ratio_p90", 1.0)),
                          sample_count=int(spread.get("records", 0)))
        confidence = math.exp(-log_std)
        if is_collective(cls):
            components = {"ideal_s": ideal, "floor_s": 1e-6 * theta[-1]}
            bottleneck = "comm"
        else:
            components = {"ideal_s": ideal, "compute_s": flops / peak,
                          "memory_s": nbytes / bw, "floor_s": 1e-6 * theta[-1],
                          "arithmetic_intensity": flops / nbytes,
                          "ridge_intensity": peak / bw}
            bottleneck = "compute" if flops / peak >= nbytes / bw else "memory"
        components["efficiency"] = ideal / latency
        return CostEstimate(
            latency_s=latency, method=EstimateMethod.CALIBRATED, match_kind=MatchKind.MODEL,
            provider=self.name, provider_revision=self.revision,
            source_revision=self.revision_digest,
            validity=FrozenDict({"hardware": self.system.name, "class": cls,
                                 "calibration_part": PART_NAME,
                                 "calibration_revision": self.revision_digest}),
            uncertainty=unc, components=FrozenDict(components),
            assumptions=(f"efficiency curve {cls} of calibration revision "
                         f"{self.revision_digest} (part {PART_NAME}); spread from its "
                         "held-out residuals",) + ((
                             self._transfer_note(spread),)
                             if self.transfer is not None else ()),
            bottleneck=bottleneck, confidence=confidence,
            statistics=FrozenDict({"calibration_revision": self.revision_digest,
                                   "calibration_part": PART_NAME, "class": cls,
                                   "efficiency": ideal / latency,
                                   "heldout_within_25pct": float(spread.get("within", 0.0))}))


def calibrated_providers(system: System, revision) -> list:
    """[CalibratedAnalyticProvider] for `system` when `revision` (a CalibrationRevision,
    or None) has an `analytic_efficiency` part fitted on it, declared for it
    (`transfer_part`) or fitted on devices of its vendor only (applied without records of
    it, and said so in every answer), else []."""
    if revision is None:
        return []
    part = revision.part(PART_NAME)
    if part is None:
        return []
    fitted = tuple(part.fitted_on.get("systems", ()))
    if (system.name not in fitted and system.name not in part.fitted_on.get("transfers", {})
            and not same_vendor(system, fitted)):
        return []
    return [CalibratedAnalyticProvider(system, part, revision.digest)]


def same_vendor(system: System, fitted: Sequence[str]) -> bool:
    """Whether every fitted system (catalog names) is of `system`'s vendor; False for
    none, or for one the catalog lacks."""
    from perfcast.hardware import load_system

    vendors = set()
    for name in fitted:
        try:
            vendors.add(load_system(name).device.vendor)
        except ConfigError:
            return False
    return vendors == {system.device.vendor}


def providers_by_system(revision):
    """system name -> `calibrated_providers` of `revision` for it, built once per system
    (the same objects on every call, so cost caches keyed by provider stay valid); None
    without a revision."""
    if revision is None:
        return None
    from perfcast.hardware import load_system

    built: dict[str, list] = {}

    def providers(system: str) -> list:
        if system not in built:
            built[system] = calibrated_providers(load_system(system), revision)
        return built[system]

    return providers
