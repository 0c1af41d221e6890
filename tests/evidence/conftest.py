import pathlib
import sys

# Tests import their shared helpers by module name (pytest runs in importlib mode).
sys.path.insert(0, str(pathlib.Path(__file__).parent))
