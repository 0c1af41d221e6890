"""The one resolver factory: every command (`estimate`, `serve`, `search`, `validate`,
`train`, the workbench, `evidence query`) builds its `CostResolver` here, so the same
query over the same providers gets the same answer everywhere.

Order: the measured and calibrated providers the caller hands in (asked first, in the
given order), then the physics-only models (`RooflineCostProvider`,
`CollectiveCostProvider`). One switch differs by consumer and is part of the resolver's
identity (the roofline's revision): `launch_in_kernel_times`. A stand-alone step
(`estimate`, `train`) prices each analytic kernel with the device's launch overhead; the
serving step model leaves it out because it adds the engine's launch gap per kernel
itself (`kernel_launch_graph_s` / `kernel_launch_eager_s` of the backend file).
"""

from __future__ import annotations

from collections.abc import Sequence

from perfcast.evidence.collectives import CollectiveCostProvider
from perfcast.evidence.contracts import CostProvider, provider_digest, providers_digest
from perfcast.evidence.resolver import CostResolver
from perfcast.evidence.roofline import RooflineCostProvider
from perfcast.hardware import System

__all__ = ["analytic_providers", "build_resolver", "measured_providers", "provider_digest",
           "providers_digest"]


def analytic_providers(system: System, *, roofline_mode: str = "roofline",
                       launch_in_kernel_times: bool = True) -> list[CostProvider]:
    """The physics-only models, asked last."""
    return [RooflineCostProvider(system, mode=roofline_mode,
                                 include_launch=launch_in_kernel_times),
            CollectiveCostProvider(system)]


def build_resolver(system: System, evidence: Sequence[CostProvider] = (), *,
                   roofline_mode: str = "roofline",
                   launch_in_kernel_times: bool = True) -> CostResolver:
    """`evidence` (measured, interpolating, calibrated providers) first, then the
    analytic models."""
    return CostResolver([*evidence, *analytic_providers(
        system, roofline_mode=roofline_mode, launch_in_kernel_times=launch_in_kernel_times)])


def measured_providers(databases: Sequence, system: System, policy: str = "interpolate", *,
                       harness=None, graph_max_tokens: int = 0,
                       wrap=None) -> list[CostProvider]:
    """The measured providers of `databases` (exact, then interpolating, per `policy`),
    each read in the tables' terms and corrected (`MeasuredView`: the physical floor at
    the system's peak memory bandwidth, MoE routing, and, with `harness` and
    `graph_max_tokens`, the GEMM table's per-call overhead under CUDA graphs).
    `wrap(provider)`: applied to each provider before the view (e.g. foreign evidence)."""
    from perfcast.evidence.chain import evidence_providers
    from perfcast.evidence.measured_view import MeasuredView

    return [MeasuredView(wrap(p) if wrap else p,
                         peak_memory_bw=system.device.memory.bw_bytes_per_s,
                         harness=harness, graph_max_tokens=graph_max_tokens)
            for p in evidence_providers(databases, system, policy)]
