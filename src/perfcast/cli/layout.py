"""The parallel layout of the `--tp-size/--pp-size/--dp-size/...` flags (shared by
`estimate`, `serve` and `search`; light to import: no plan layer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from perfcast.core.errors import ConfigError

if TYPE_CHECKING:
    from perfcast.workload import ParallelPlan


def build_plan(tp: int, pp: int, dp: int, ep: int, moe_tp: int, num_devices: int,
               moe_dispatch: str = "auto", expert_imbalance: float = 1.0) -> ParallelPlan:
    """TensorCast semantics: `num_devices` = tp x dp x pp; when only `num_devices` is
    given, dp = num_devices / (tp x pp)."""
    if num_devices < 0 or dp < 0:
        raise ConfigError("must not be negative", field="--num-devices/--dp-size",
                          expected="a positive integer")
    if not dp:
        if num_devices:
            if num_devices % (tp * pp):
                raise ConfigError(f"--num-devices={num_devices} is not a multiple of "
                                  f"tp x pp = {tp * pp}", field="--num-devices",
                                  expected=f"a multiple of {tp * pp}")
            dp = num_devices // (tp * pp)
        else:
            dp = 1
    if num_devices and num_devices != tp * dp * pp:
        raise ConfigError(f"--num-devices={num_devices} but tp x dp x pp = {tp} x {dp} x {pp} "
                          f"= {tp * dp * pp}", field="--num-devices",
                          expected="the product of the parallel degrees")
    from perfcast.workload import ParallelPlan

    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, ep=ep, moe_tp=moe_tp, moe_dispatch=moe_dispatch,
                        expert_imbalance=expert_imbalance)
    plan.check_moe_layout()
    return plan
