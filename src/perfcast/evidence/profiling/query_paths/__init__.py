"""One module per query path of `ProfilingDataSource` (compute, communication,
attention special, elementwise, MoE fused, composite)."""
