from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


OP_MAPPING = """\
operator_mappings:
  "tensor_cast.all_reduce.default":
    kernel_type: hcom_allReduce_
    category: communication
  "tensor_cast.all_gather.default":
    kernel_type: hcom_allGather_
    category: communication
"""


@pytest.fixture
def lookup_comm():
    """lookup(db, operation, message_bytes, participants) through ProfilingDataSource on
    an Atlas A3 (writes a two-entry op_mapping.yaml into db first)."""
    from perfcast.core.frozen import FrozenDict
    from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
    from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
    from perfcast.hardware import load_system

    def lookup(db, operation, message_bytes, participants):
        (db / "op_mapping.yaml").write_text(OP_MAPPING)
        ds = ProfilingDataSource(db, load_system("atlas_800_a3_752t_128g_die"))
        return ds.lookup(OpInvokeInfo(f"tensor_cast.{operation}.default", dims=FrozenDict(
            message_bytes=message_bytes, participants=participants)))

    return lookup
