"""The `autoscaler` command: one module per command group, `common` for what they share.

`main` is the console script (`autoscaler = "autoscaler.cli:main"`) and `python -m
autoscaler.cli`; it only gathers the groups, so a group never imports another.
"""

from __future__ import annotations

import click

from autoscaler.agent.cli import agent
from autoscaler.boundary import DEBUG_ENV, BoundaryGroup
from autoscaler.cli import config, db, keys, manual, providers, serve, status, trace, vault
from autoscaler.demo.cli import demo
from autoscaler.sim.cli import simulate
from autoscaler.sim.tune import tune


@click.group(cls=BoundaryGroup)
@click.version_option(package_name="gpu-queue-autoscaler")
@click.option(
    "--debug",
    is_flag=True,
    help=f"Show the traceback of an unexpected error (also {DEBUG_ENV}=1).",
)
def main(debug: bool) -> None:
    """Rent GPU machines when job queues fill up; release them when they go quiet.

    Exit codes: 0 done, 2 refused (the message says what and how to fix it), 1 an unexpected
    error (a bug: one line; the traceback with --debug).
    """


# The groups' modules stay the package's attributes (autoscaler.cli.trace is the module, not
# its command), so tests and tools can reach into them.
for _command in (
    db.db,
    config.validate,
    config.apply,
    config.history,
    manual.scale,
    manual.drain,
    providers.providers,
    vault.vault,
    simulate,
    tune,
    keys.keys,
    serve.serve,
    agent,
    demo,
    status.status,
    status.instances,
    status.events,
    trace.trace,
):
    main.add_command(_command)

__all__ = ["main"]
