import pathlib
import sys

import pytest

# Tests import their shared helpers by module name (pytest runs in importlib mode).
sys.path.insert(0, str(pathlib.Path(__file__).parent))

from observe_helpers import SILICON  # noqa: E402


@pytest.fixture
def silicon_copy(tmp_path):
    """A writable copy of the silicon slice."""
    path = tmp_path / "in" / SILICON.name
    path.parent.mkdir()
    path.write_bytes(SILICON.read_bytes())
    return path
