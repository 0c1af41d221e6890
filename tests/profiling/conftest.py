import pathlib
import sys

# Tests import their shared helpers by module name (pytest runs in importlib mode).
sys.path.insert(0, str(pathlib.Path(__file__).parent))

import pytest
from profiling_helpers import DB, FIA_DB

from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
from perfcast.hardware import load_system
from perfcast.workload import ParallelPlan


@pytest.fixture(scope="session")
def a3():
    return load_system("atlas_800_a3_752t_128g_die")


@pytest.fixture
def ds(a3):
    return ProfilingDataSource(DB, a3, ParallelPlan(tp=2, ep=16))


@pytest.fixture
def fia_ds(a3):
    return ProfilingDataSource(FIA_DB, a3)
