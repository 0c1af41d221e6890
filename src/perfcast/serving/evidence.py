"""Measured evidence of a serving deployment: the evidence layer's deployment loader
(`evidence.deployment.evidence_loader`) with the engine facts it needs from the backend
files: the largest batch each engine replays as a CUDA graph, below which the GEMM
tables' per-call harness overhead is not paid."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from perfcast.core.errors import ConfigError
from perfcast.evidence.deployment import DeploymentEvidence
from perfcast.evidence.deployment import evidence_loader as deployment_loader


def cuda_graph_tokens(backend: str) -> int:
    """The backend file's largest captured CUDA-graph batch (0: none, or no file)."""
    from perfcast.serving.backends import load_backend

    try:
        return load_backend(backend).cuda_graph.max_batch
    except ConfigError:
        return 0


def evidence_loader(root: Path, *, policy: str = "interpolate", versions: str = "set"
                    ) -> Callable[[str, str, str], DeploymentEvidence]:
    """`evidence_for(system, backend, version)` over an AIConfigurator-layout folder, as
    the engines of the backend files run it."""
    return deployment_loader(root, graph_max_tokens=cuda_graph_tokens, policy=policy,
                             versions=versions)
