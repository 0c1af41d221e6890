"""`perfcast` entry point: assembles the command groups.

Each command's module is imported when that command runs (or when `--help` lists the
commands), so a call pays only for the libraries its own command uses.
"""

from __future__ import annotations

import importlib
from difflib import get_close_matches

import typer
from typer import _click as click
from typer.core import TyperGroup

from perfcast.cli.coercion import plain_coercion, plain_parameter

# name -> (module, attribute, kind, attribute of the module holding context settings)
# kind "command": a function registered as one command; "group": a Typer sub-application
COMMANDS: dict[str, tuple[str, str, str, str | None]] = {
    "estimate": ("perfcast.cli.estimate", "estimate_command", "command", "CONTEXT_SETTINGS"),
    "devices": ("perfcast.cli.catalog", "devices_command", "command", None),
    "models": ("perfcast.cli.catalog", "models_command", "command", None),
    "profiling": ("perfcast.cli.profiling", "app", "group", None),
    "evidence": ("perfcast.cli.evidence", "app", "group", None),
    "collect": ("perfcast.cli.collect", "app", "group", None),
    "observe": ("perfcast.cli.observe", "app", "group", None),
    "calibrate": ("perfcast.cli.calibrate", "app", "group", None),
    "serve": ("perfcast.cli.serve", "serve_command", "command", None),
    "search": ("perfcast.cli.search", "search_command", "command", None),
    "validate": ("perfcast.cli.validate", "app", "group", None),
    "train": ("perfcast.cli.train", "train_command", "command", None),
    "train-search": ("perfcast.cli.train_search", "train_search_command", "command", None),
    "workbench": ("perfcast.cli.workbench", "workbench_command", "command", None),
}


def load_command(name: str):
    """The click command of `name`, built from its module (imported now)."""
    module_name, attribute, kind, settings_attribute = COMMANDS[name]
    module = importlib.import_module(module_name)
    target = getattr(module, attribute)
    if kind == "group":
        command = typer.main.get_group(target)
    else:
        single = typer.Typer(add_completion=False)
        settings = getattr(module, settings_attribute) if settings_attribute else None
        single.command(name, context_settings=settings)(target)
        command = typer.main.get_command(single)
    command.name = name
    plain_coercion(command)   # no pydantic TypeAdapter per parameter (cli/coercion.py)
    return command


class LazyCommands(TyperGroup):
    """A command group whose subcommands are built on first use."""

    def list_commands(self, ctx) -> list[str]:
        return [*self.commands, *(n for n in COMMANDS if n not in self.commands)]

    def get_command(self, ctx, cmd_name: str):
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.commands[cmd_name] = load_command(cmd_name)
        return self.commands.get(cmd_name)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        plain_parameter(option)
        return option

    def resolve_command(self, ctx, args):
        try:
            return self._click_resolve_command(ctx, args)
        except click.exceptions.UsageError as exc:  # name the close matches among all commands
            matches = get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if matches:
                exc.message = (exc.message.rstrip(".") + ". Did you mean "
                               + ", ".join(repr(m) for m in matches) + "?")
            raise


app = typer.Typer(cls=LazyCommands, add_completion=False, no_args_is_help=True)


@app.callback()
def _root() -> None:
    """Predict LLM inference, serving and training performance on accelerators, with
    provenance."""


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
