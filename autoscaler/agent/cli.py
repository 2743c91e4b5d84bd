"""`autoscaler agent`: added to the main command in autoscaler/cli.py."""

from __future__ import annotations

import logging
import os

import click

from autoscaler.boundary import Refused


@click.command("agent")
@click.option("--api-url", help="The server API (default $AUTOSCALER_API_URL).")
@click.option("--queue", help="Hand-made machines: the queue to serve ($AUTOSCALER_QUEUE).")
@click.option("--name", help="Hand-made machines: this machine's name (default: host name).")
@click.option(
    "--workdir",
    help="The work folder: checkout and installed requirements, reused by the next start "
    "(default $AUTOSCALER_AGENT_WORKDIR, else a new temp dir).",
)
def agent(api_url: str | None, queue: str | None, name: str | None, workdir: str | None) -> None:
    """Run the worker agent: register, deploy from Git, run the worker, heartbeat, drain.

    A rented machine gets AUTOSCALER_API_URL, AUTOSCALER_WORKER_TOKEN and AUTOSCALER_LAUNCH_ID
    from its launch. A hand-made machine is given AUTOSCALER_ENROLMENT_KEY (from 'autoscaler
    keys create-enrolment') and --queue: it counts as capacity and is never drained by us."""
    from autoscaler.agent.guard import hide_secrets, take_secrets
    from autoscaler.agent.run import run_agent
    from autoscaler.agent.server_api import AgentConfig, AgentError

    # the re-exec runs from `/`: a relative work folder is the one meant here
    workdir = os.path.abspath(workdir) if workdir else None
    if os.environ.get("AUTOSCALER_AGENT_WORKDIR"):
        os.environ["AUTOSCALER_AGENT_WORKDIR"] = os.path.abspath(
            os.environ["AUTOSCALER_AGENT_WORKDIR"]
        )
    over = {
        k: v
        for k, v in {"api_url": api_url, "queue": queue, "name": name, "workdir": workdir}.items()
        if v
    }
    # first of all: the token out of this process's environment (a re-exec, same PID, of an
    # isolated interpreter in `/`), and this process out of reach of its worker's uid (see
    # agent/guard.py)
    hide_secrets(["agent", *(a for k, v in over.items() for a in (f"--{k.replace('_', '-')}", v))])
    secrets = take_secrets()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s agent %(levelname)s %(message)s")
    try:
        cfg = AgentConfig.from_env({**os.environ, **secrets}, **over)
        code = run_agent(cfg)
    except AgentError as exc:
        raise Refused(f"agent: {exc}") from None
    raise SystemExit(code)
