"""Workload facts: model specs, parallel plans, batches and the TaskGraph of exact work."""

from perfcast.workload.build import build_task_graph, split_layers
from perfcast.workload.graph import GraphBuilder, MemoryFacts, Precision, TaskGraph
from perfcast.workload.model_spec import ModelSpec, builtin_models, load_model_spec, model_spec_from_config
from perfcast.workload.plan_spec import Batch, BatchSegment, ParallelPlan
from perfcast.workload.tensors import Engine, Task, TaskKind, TensorSpec, Work

__all__ = [
    "Batch", "BatchSegment", "Engine", "GraphBuilder", "MemoryFacts", "ModelSpec",
    "ParallelPlan", "Precision", "Task", "TaskGraph", "TaskKind", "TensorSpec", "Work",
    "build_task_graph", "builtin_models", "load_model_spec", "model_spec_from_config",
    "split_layers",
]
