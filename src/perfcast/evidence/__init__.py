"""Estimates: the evidence contract, the resolver and its providers."""

from perfcast.evidence.collectives import CollectiveCostProvider, collective_time
from perfcast.evidence.contracts import (
    Attempt,
    AttemptOutcome,
    CostEstimate,
    CostProvider,
    CostQuery,
    CostQueryContext,
    CostSubject,
    EstimateMethod,
    MatchKind,
    Miss,
    Resolution,
    Uncertainty,
)
from perfcast.evidence.queries import query_for_task
from perfcast.evidence.resolver import CostResolver, ResolverPolicy
from perfcast.evidence.roofline import RooflineCostProvider

__all__ = [
    "Attempt", "AttemptOutcome", "CollectiveCostProvider", "CostEstimate", "CostProvider",
    "CostQuery", "CostQueryContext", "CostResolver", "CostSubject", "EstimateMethod",
    "MatchKind", "Miss", "Resolution", "ResolverPolicy", "RooflineCostProvider",
    "Uncertainty", "collective_time", "query_for_task",
]
