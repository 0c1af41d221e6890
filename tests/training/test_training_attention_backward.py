"""An attention core's backward is priced at no better efficiency than the resolver's
answer for its own forward (FlashAttention-2's backward runs fewer FLOP/s than its forward
in every setting of Dao 2023, Figures 5-6): latency = max(roofline of the backward's own
FLOPs and bytes, (forward latency - launch) x backward / forward hardware FLOPs + launch).
Checked with a provider that answers the forward attention queries at a known latency."""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.evidence import CostEstimate, EstimateMethod, MatchKind, Miss
from perfcast.evidence.factory import build_resolver
from perfcast.hardware import load_system
from perfcast.training import TrainingLayout, TrainingRequest, estimate_training

from .tiny_models import LLAMA

SYSTEM = load_system("h100_sxm")
REQ = TrainingRequest(model=LLAMA, device=SYSTEM, layout=TrainingLayout(),
                      global_batch_size=2, micro_batch_size=2, seq_length=2048)


@dataclass
class ForwardAttention:
    """Answers forward attention queries at `factor` x the bare-peak compute time."""

    factor: float
    name: str = "fixed_attention"
    revision: str = "t1"

    def supports(self, query):
        return True

    def estimate(self, query):
        if query.operation != "attention":
            return Miss("only forward attention")
        peak = SYSTEM.device.engine("matrix").peak_ops_per_s["bf16"]
        return CostEstimate(latency_s=self.factor * query.flops / peak,
                            method=EstimateMethod.MEASURED, match_kind=MatchKind.EXACT,
                            provider=self.name, provider_revision=self.revision)


def attention_pair(res):
    fwd = {ct.task.lineage: ct for ct in res.costs[0].forward.tasks}
    (bwd,) = [ct for ct in res.costs[0].backward.tasks
              if ct.task.operation == "attention_backward"]
    return fwd[bwd.task.attributes["backward_of"]], bwd


def test_backward_at_the_forward_efficiency_when_the_forward_is_slower():
    plain = attention_pair(estimate_training(REQ))[1].resolution.estimate
    res = estimate_training(REQ, build_resolver(SYSTEM, [ForwardAttention(3.0)]))
    fwd, bwd = attention_pair(res)
    assert fwd.resolution.estimate.provider == "fixed_attention"
    ratio = bwd.task.work.flops / fwd.task.work.flops
    assert ratio == 2.5          # FlashAttention's backward recomputes QK^T
    est = bwd.resolution.estimate
    launch = est.components["launch_s"]
    assert launch > 0
    # forward at 1/3 of the peak: the backward's 2.5x FLOPs at that rate, plus its launch
    assert est.latency_s == (fwd.latency_s * ratio) + launch
    assert est.latency_s > plain.latency_s
    assert est.components["forward_efficiency_s"] == est.latency_s - plain.latency_s
    assert any("efficiency of its forward" in a for a in est.assumptions)
    # the same rule in the backward + DP graph
    (bdp,) = [ct for ct in res.costs[0].backward_dp.tasks
              if ct.task.operation == "attention_backward"]
    assert bdp.latency_s == est.latency_s


def test_roofline_kept_when_the_forward_is_faster():
    plain = attention_pair(estimate_training(REQ))[1].resolution.estimate
    res = estimate_training(REQ, build_resolver(SYSTEM, [ForwardAttention(0.5)]))
    est = attention_pair(res)[1].resolution.estimate
    assert est.latency_s == plain.latency_s
    assert "forward_efficiency_s" not in est.components
