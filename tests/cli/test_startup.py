"""What a CLI call loads: a command imports its own modules only, and typer's
per-parameter pydantic adapters are not built for plain values (cli/coercion.py), with
the same results and messages as typer's own coercion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from enum import Enum
from pathlib import Path

import pytest
from typer._click import Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param

from perfcast.cli.coercion import PlainRuntimeParam
from perfcast.cli.main import COMMANDS, load_command

REPO = Path(__file__).resolve().parents[2]

# loaded by no `serve` call (the workbench, the plan scheduler, Ray, plotting, fitting)
HEAVY = ("perfcast.workbench", "perfcast.plan.compose", "perfcast.plan.step",
         "perfcast.cli.estimate", "perfcast.cli.search", "perfcast.evidence.database",
         "nicegui", "fastapi", "ray", "matplotlib", "scipy", "pyarrow")


def _loaded_after(code: str, *args: str) -> tuple[set[str], str]:
    """Modules in sys.modules after `code` ran in a fresh interpreter, and its stdout."""
    probe = (f"import sys, json\n{code}\n"
             "print('\\nMODULES=' + json.dumps(sorted(sys.modules)))")
    env = {**os.environ, "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    text, _, modules = out.stdout.rpartition("\nMODULES=")
    return set(json.loads(modules)), text


RUN_APP = """
from perfcast.cli.main import app
try:
    app(args=sys.argv[1:], prog_name="perfcast")
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
"""


def _heavy(modules: set[str], names=HEAVY) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_importing_the_app_loads_no_command_module():
    modules, _ = _loaded_after("import perfcast.cli.main")
    assert not [m for m in modules if m.startswith("perfcast.cli.") and m not in (
        "perfcast.cli.main", "perfcast.cli.coercion")]
    assert not _heavy(modules, (*HEAVY, "numpy", "pydantic", "rich", "perfcast.serving"))


def test_serve_help_loads_no_simulation_modules():
    modules, text = _loaded_after(RUN_APP, "serve", "--help")
    assert "--concurrency" in text and "--format" in text
    assert not _heavy(modules, (*HEAVY, "pydantic", "numpy", "yaml", "perfcast.plan",
                                "perfcast.serving.requests", "perfcast.serving.deploy",
                                "perfcast.calibrate", "perfcast.workload", "perfcast.hardware",
                                "perfcast.evidence"))


def test_serve_run_loads_no_pydantic_rich_or_plan_scheduler():
    modules, text = _loaded_after(
        RUN_APP, "serve", "Qwen/Qwen3-0.6B", "--concurrency", "1", "--num-requests", "2",
        "--isl", "64", "--osl", "4", "--format", "json")
    doc = json.loads(text)
    assert doc["completed_requests"] == 2 and doc["inputs"]["client"]["concurrency"] == 1
    assert "perfcast.serving.deploy" in modules   # it ran the simulation
    assert not _heavy(modules, (*HEAVY, "pydantic", "rich", "typer._adapters",
                                "concurrent.futures.process",
                                "numpy.random"))   # fixed lengths, closed loop: no draws


# -- plain coercion equals typer's ------------------------------------------------------

VALUES = {
    int: ["0", "7", "-3", "007", "+5", " 5", "1_000", "1.0", "abc", "", "-0",
          "123456789012345678901234", 5, -1, True, None],
    float: ["0.8", "1e-3", "-2.5", "1E5", "1e400", "inf", "nan", "1.", ".5", "1_0.5", "abc",
            "", "0.1000000000000000055511151231257827", 1, 1.0, None],
    str: ["x", "", " a b ", "ü", None],
    bool: [True, False, "true", "0", "", None],
    Path: ["a/b", "./a", "a//b", "a/", "", "/", "/nonexistent/x", str(REPO), Path("x"), None],
}


def _values(annotation) -> list:
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        members = list(annotation)
        return [*members, *(m.value for m in members), members[0].value.upper(), "nope", "",
                None]
    if getattr(annotation, "__origin__", None) is list:
        item = annotation.__args__[0]
        some = [v for v in _values(item) if v is not None][:3]
        return [tuple(some), list(some[:1]), (), [], some[0], None]
    return VALUES.get(annotation, [None])


def _outcome(runtime, value, param, ctx):
    try:
        out = runtime.coerce(value, param=param, ctx=ctx)
    except BadParameter as exc:
        return ("error", type(exc).__name__, exc.format_message())
    return ("value", type(out).__name__, repr(out))


def _all_params():
    def walk(cmd, path):
        for sub_name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, f"{path} {sub_name}")
        for param in cmd.params:
            yield path, cmd, param

    for name in COMMANDS:
        yield from walk(load_command(name), name)


def test_plain_coercion_gives_typers_result_for_every_parameter():
    checked = kinds = 0
    seen = set()
    for path, cmd, param in _all_params():
        runtime = param._runtime_param
        if not isinstance(runtime, PlainRuntimeParam):
            continue
        typer_runtime = build_runtime_param(param.type_descriptor)
        ctx = Context(cmd)
        for value in _values(param.type_descriptor.annotation):
            mine = _outcome(runtime, value, param, ctx)
            theirs = _outcome(typer_runtime, value, param, ctx)
            assert mine == theirs, f"{path} {param.name} {value!r}"
            checked += 1
        seen.add(repr(param.type_descriptor.annotation))
    kinds = len(seen)
    assert checked > 1000 and kinds >= 8, (checked, seen)


def test_the_help_option_gets_plain_coercion_too():
    cmd = load_command("serve")
    option = cmd.get_help_option(Context(cmd))
    assert isinstance(option._runtime_param, PlainRuntimeParam)


@pytest.mark.parametrize("name", ["serve", "search", "estimate", "validate"])
def test_commands_use_plain_coercion(name):
    def params(cmd):
        for sub in (getattr(cmd, "commands", None) or {}).values():
            yield from params(sub)
        yield from cmd.params

    runtimes = [p._runtime_param for p in params(load_command(name))
                if hasattr(p, "_runtime_param")]
    assert runtimes and all(isinstance(r, PlainRuntimeParam) for r in runtimes)


def test_plan_package_names_load_on_first_use():
    modules, text = _loaded_after(
        "import perfcast.plan as plan\nprint(sorted(n for n in plan.__all__ "
        "if getattr(plan, n).__module__.startswith('perfcast.plan.')))")
    import perfcast.plan as plan

    assert text.strip() == repr(sorted(plan.__all__)) and "perfcast.plan.compose" in modules
    modules, _ = _loaded_after("import perfcast.plan.resources")
    assert "perfcast.plan.compose" not in modules and "perfcast.plan.timeline" not in modules
