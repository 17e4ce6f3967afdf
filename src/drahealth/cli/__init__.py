"""The ``drahealth`` command line.

One click group; ``drahealth --help`` lists every command with its whole one-line
description, and click's shell completion works
(``eval "$(_DRAHEALTH_COMPLETE=bash_source drahealth)"``; see docs/cli.md).

Every command has its own module in this package, which sits on the
top floor (it may import every part; no part imports it), and is imported only when
run, so ``drahealth --help`` stays fast and one part's imports cannot break another's
command.
"""

from __future__ import annotations

import importlib
import logging

import click

from drahealth import __version__

#: Longest one-line description ``--help`` shows before cutting it (none is this long).
SHORT_HELP_LIMIT = 500

#: command name -> "module:attribute" of its click command.
COMMANDS: dict[str, str] = {
    "agent": "drahealth.cli.agent:agent_command",
    "apiserver": "drahealth.cli.apiserver:apiserver_command",
    "clear": "drahealth.cli.clear:clear_command",
    "controller": "drahealth.cli.controller:controller_command",
    "dashboard": "drahealth.cli.dashboard:dashboard_command",
    "demo": "drahealth.cli.demo:demo_command",
    "doctor": "drahealth.cli.doctor:doctor_command",
    "driver": "drahealth.cli.driver:driver_command",
    "history": "drahealth.cli.views:history_command",
    "inject": "drahealth.cli.inject:inject_command",
    "pods": "drahealth.cli.views:pods_command",
    "policy": "drahealth.cli.policy:policy_group",
    "resume": "drahealth.cli.resume:resume_command",
    "status": "drahealth.cli.views:status_command",
    "stream": "drahealth.cli.stream:stream_command",
    "taint": "drahealth.cli.taint:taint_command",
    "untaint": "drahealth.cli.taint:untaint_command",
    "version": "drahealth.cli.version:version_command",
    "watch": "drahealth.cli.stream:watch_command",  # hidden: the old name of stream
}


class LazyGroup(click.Group):
    """A click group that imports each command on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            module, _, attr = COMMANDS[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attr)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command with its whole one-line description (click would cut it to fit
        the terminal; here the line wraps instead)."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            rows.append((name, command.get_short_help_str(limit=SHORT_HELP_LIMIT)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="drahealth")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="warning",
    show_default=True,
    help="Log level for the process.",
)
def main(log_level: str) -> None:
    """Kubernetes DRA device health: driver toolkit, node agent, embedded control plane.

    Commands that use the API find it as kubectl does: --kubeconfig, else $KUBECONFIG,
    else ~/.kube/config; --context; -n NS / -A. Exit codes: 0 ok, 1 error, 2 usage
    error, 3 a pod uses a bad device (status, pods). Shell completion: eval
    "$(_DRAHEALTH_COMPLETE=bash_source drahealth)". See docs/cli.md.
    """
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
