"""`autoscaler simulate --trace FILE --config FILE`: the cost of a config on a job trace."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Literal

import click

from autoscaler.boundary import Refused
from autoscaler.config import ConfigError
from autoscaler.sim.engine import World
from autoscaler.sim.placement import (
    check_outages,
    compare_placement,
    placement_lines,
    provider_terms,
)
from autoscaler.sim.provider import Outage, parse_outage
from autoscaler.sim.report import HEADER, LEGEND, fmt_interruptible, fmt_row
from autoscaler.sim.run import (
    autoscaled_queues,
    baseline_accounts,
    cheapest,
    compare,
    jobs_for,
    load_sim_config,
    pick_queue,
    run_account,
    table,
    warnings_for,
)
from autoscaler.sim.trace import TraceError, load_trace

TRACE_OPTION = click.option(
    "--trace",
    "trace",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Job trace: CSV with arrival_s,runtime_s[,queue], or JSON Lines.",
)
CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The autoscaler YAML config.",
)
"""The two inputs every command on a trace takes (simulate, tune)."""


def _outages(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[Outage, ...]:
    try:
        return tuple(parse_outage(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


OUTAGE_OPTION = click.option(
    "--outage",
    "outages",
    multiple=True,
    callback=_outages,
    metavar="PROVIDER@START-END",
    help="A capacity window: PROVIDER has no capacity from START to END, hours:minutes into "
    "the trace (gpu-vast@10:00-12:00; 23:00-25:00 runs past midnight) or seconds "
    "(36000-43200). Every rental from it fails there with a capacity error — the launch fails "
    "over to the queue's other listed providers and the provider backs off —; machines it "
    "already runs are untouched. Repeatable; applies to every policy, and to each "
    "provider-alone row of a queue listing several providers.",
)


@click.command("simulate")
@TRACE_OPTION
@CONFIG_OPTION
@click.option(
    "--queue",
    default=None,
    help="Queue of the config the trace feeds (default: the first autoscaled queue).",
)
@click.option(
    "--seed",
    default=0,
    show_default=True,
    type=int,
    help="Seed of boot times, failures and worker races.",
)
@click.option(
    "--realistic",
    is_flag=True,
    help="A harder world: 5 s metric lag, 2 s drain race, $0.02 per rental, failed boots "
    "reported dead by the provider, 30 s of billing after each destroy.",
)
@click.option(
    "--all-queues",
    is_flag=True,
    help="Run our policy on every autoscaled queue at once (the trace's queue column routes "
    "jobs), so account limits act across them; one row per queue.",
)
@OUTAGE_OPTION
@click.option(
    "--preemption-rate",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0.0, max=100.0),
    metavar="PER_HOUR",
    help="Interruptible machines (instance.interruptible) preempted per machine-hour, "
    "exponential and seeded: 0.05 is 5 % per hour. A preempted machine stops billing and "
    "serving at once, the queue is evaluated at once, its jobs come back to the broker "
    "(see --acks). No effect on a queue without interruptible.",
)
@click.option(
    "--acks",
    type=click.Choice(["late", "early"]),
    default="late",
    show_default=True,
    help="The workers' Celery acks: late (task_acks_late: a preempted machine's job runs "
    "again from its start elsewhere) or early (Celery's default: it is lost, and counted).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def simulate(
    trace: str,
    config_path: str,
    queue: str | None,
    seed: int,
    realistic: bool,
    all_queues: bool,
    outages: tuple[Outage, ...],
    preemption_rate: float,
    acks: Literal["late", "early"],
    as_json: bool,
) -> None:
    """Replay TRACE on a virtual clock through decide() and fair baselines; print the cost.

    A queue listing several providers (`provider: [a, b]`) is also run on each provider alone
    (same trace, seed and outages), beside the list. A queue renting part of its machines
    interruptible (`instance.interruptible`) is also run with every machine on demand
    (`ours-on-demand`), and its preemptions, reruns and lost jobs are reported."""
    world = replace(
        World.realistic() if realistic else World(),
        outages=outages,
        preemption_rate=preemption_rate,
        acks=acks,
    )
    if all_queues:
        _simulate_account(trace, config_path, seed, world, as_json)
        return
    try:
        config = load_sim_config(config_path)
        name = pick_queue(config, queue)
        check_outages(config, [name], outages)
        jobs = jobs_for(load_trace(trace), name, name)
        reports, price = compare(config, name, jobs, seed, world)
        placed = compare_placement(config, name, jobs, seed, world)
    except (ConfigError, TraceError, ValueError) as exc:  # refusals: exit 2, like validate
        raise Refused(str(exc)) from None
    warnings = warnings_for(config, name, reports)
    auto = config.queues[name].autoscale
    assert auto is not None
    if as_json:
        extra: dict[str, object] = {}
        if outages:
            extra["outages"] = [
                {"provider": o.provider, "start_s": o.start_s, "end_s": o.end_s} for o in outages
            ]
        if placed:
            extra["placement"] = {
                "rule": auto.placement,
                "providers": list(auto.providers),
                "runs": [r.as_dict() for r in placed],
            }
        click.echo(
            json.dumps(
                {
                    "queue": name,
                    "price_per_hour": price,
                    "lower_bound_dollars": reports[0].lower_bound_dollars,
                    "saturated_at_max_workers": any(r.saturated for r in reports),
                    "warnings": warnings,
                    "policies": [r.as_dict() for r in reports],
                    **extra,
                },
                indent=2,
            )
        )
        return
    bid = auto.instance.interruptible
    if bid is not None:
        on_demand = cheapest(config, name).price_per_hour
        click.echo(
            f"queue {name}: {reports[0].jobs} jobs, ${on_demand:.2f}/h on demand, "
            f"${bid.price(on_demand):.2f}/h at the bid on up to {bid.max_share:.0%} of the "
            f"machines (the lower bound at ${price:.2f}/h)"
        )
    elif len(auto.providers) == 1:
        click.echo(f"queue {name}: {reports[0].jobs} jobs, ${price:.2f}/h per machine")
    else:
        click.echo(
            f"queue {name}: {reports[0].jobs} jobs, placement {auto.placement} over "
            f"{provider_terms(config, name)} (the lower bound at the cheapest price)"
        )
    if outages:
        click.echo(
            "outages (every rental fails with a capacity error): "
            + ", ".join(o.describe() for o in outages)
        )
    if preemption_rate > 0 and bid is None:
        click.echo(
            f"note: queue {name} has no instance.interruptible: --preemption-rate preempts nothing"
        )
    for line in warnings:
        click.echo(line)
    for line in table(config, name, jobs, reports, price, world):
        click.echo(line)
    for line in placement_lines(config, name, placed, outages):
        click.echo(line)
    click.echo("")
    click.echo(LEGEND)


def _simulate_account(trace: str, config_path: str, seed: int, world: World, as_json: bool) -> None:
    try:
        config = load_sim_config(config_path)
        check_outages(config, autoscaled_queues(config), world.outages)
        jobs = load_trace(trace)
        reports, peak = run_account(config, jobs, seed, world)
        baselines = baseline_accounts(config, jobs, seed, world)
    except (ConfigError, TraceError, ValueError) as exc:
        raise Refused(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "peak_machines_account": peak,
                    "queues": [r.as_dict() for r in reports],
                    "baselines": {
                        name: {
                            "peak_machines_account": b_peak,
                            "queues": [r.as_dict() for r in b_reports],
                        }
                        for name, (b_reports, b_peak) in baselines.items()
                    },
                },
                indent=2,
            )
        )
        return
    limits = config.limits
    click.echo(
        f"{len(reports)} queues in one account (limits: max_machines {limits.max_machines}, "
        f"max_price_per_hour {limits.max_price_per_hour}); peak {peak} machines at once"
    )
    click.echo(f"{'queue':<16}" + HEADER[16:])
    for r in reports:
        click.echo(fmt_row(r))
    for line in (fmt_interruptible(r) for r in reports):
        if line is not None:
            click.echo(line)
    click.echo("")
    click.echo(
        "the account, every queue together (the baselines scale each queue on its own: "
        "no account cap or priority holds them back)"
    )
    click.echo(
        f"{'policy':16s} {'$':>9s} {'mach-h':>8s} {'worst p95 s':>12s} "
        f"{'unserved':>8s} {'killed':>6s} {'peak':>5s}"
    )
    rows = [("ours", reports, peak), *((n, r, p) for n, (r, p) in baselines.items())]
    for name, rs, pk in rows:
        over = (
            f"  over max_machines {limits.max_machines}"
            if limits.max_machines is not None and pk > limits.max_machines
            else ""
        )
        click.echo(
            f"{name:16s} {sum(r.dollars for r in rs):9.2f} "
            f"{sum(r.machine_hours for r in rs):8.1f} {max(r.wait_p95 for r in rs):12.0f} "
            f"{sum(r.never_served for r in rs):8d} {sum(r.killed for r in rs):6d} {pk:5d}{over}"
        )
