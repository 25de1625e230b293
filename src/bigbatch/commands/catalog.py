"""`bigbatch recipes` and `bigbatch models`: what is shipped."""

from __future__ import annotations

import argparse


def add_commands(commands) -> None:
    for name, help_text, handler in (("recipes", "list the shipped recipes", run_recipes),
                                     ("models", "list the registered models", run_models)):
        command = commands.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(handler=handler)


def run_recipes(args: argparse.Namespace) -> int:
    from bigbatch.config import load_recipe, recipe_names

    for name in recipe_names():
        print(f"{name:30s} {load_recipe(name).get('description', '')}")
    return 0


def run_models(args: argparse.Namespace) -> int:
    from bigbatch.models import model_names, model_spec
    from bigbatch.models.external import HELP

    for name in model_names():
        spec = model_spec(name)
        print(f"{name:16s} {spec.description}")
        if spec.options:
            defaults = ", ".join(f"{key}={_option_text(value)}"
                                 for key, value in spec.options.items())
            print(f"{'':16s} options (--set model.options.NAME=VALUE): {defaults}")
    for name, text in HELP:
        print(f"{name:16s} {text}")
    return 0


def _option_text(default: object) -> str:
    """How a default reads on the command line (YAML spelling; None is 'auto')."""
    if default is None:
        return "auto"
    if isinstance(default, bool):
        return str(default).lower()
    return str(default)
