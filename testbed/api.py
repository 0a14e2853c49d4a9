"""The testbed from Python (notebooks and scripts); the command line is built on it.

    from testbed import api

    campaign = api.from_dict({"name": "mine", "seed": 1, "templates": 2,
                              "grid": {"policy": ["planfence", "batched_all_key"],
                                       "network": "loopback", "units": 24}})
    print("\\n".join(api.check(campaign)))       # the plan; creates nothing
    api.run(campaign, "results/mine")            # resume=True finishes an interrupted run
    episodes = api.episodes("results/mine")     # pandas DataFrames
    actions = api.actions("results/mine")
    api.report("results/mine")                   # tables, figures, report.md

    with api.network("att", hosts=["c", "s"], unshaped=["s"]) as net:  # root
        server = net["s"].popen(["python3", "-m", "http.server", "8000"])
        print(net["c"].run(["ping", "-c", "3", "{addr:s}"]).stdout)

Errors are those of the command line (``testbed.errors``): a ``UserError`` names the
field, a ``HostError`` says what the machine lacks. Shaped networks need root (the
command line re-executes itself into a user namespace when it is not; this API does
not).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import trio
from rich.console import Console

from testbed import interrupts
from testbed.campaign.model import Campaign
from testbed.campaign.networks import check_backend
from testbed.campaign.parse import load_campaign, parse_campaign
from testbed.campaign.plugins import load as load_plugins
from testbed.campaign.plugins import load_recorded, resolve_names
from testbed.errors import HostError, UserError
from testbed.links.backend import SIM_BACKEND
from testbed.report.build import build_report
from testbed.report.load import load_run
from testbed.run.cluster_security import ClusterAccess
from testbed.run.contract import RunSummary
from testbed.tools.network_api import network

__all__ = ["Campaign", "actions", "check", "episodes", "from_dict", "load", "network",
           "report", "run", "warnings"]


def _with_plugins(campaign: Campaign, plugins: Sequence[str]) -> Campaign:
    names = resolve_names(list(plugins), base_dir=Path.cwd(), where="--plugin")
    return replace(campaign, plugins=tuple(dict.fromkeys([*campaign.plugins, *names])))


def load(name_or_path: str | Path, *, plugins: Sequence[str] = (),
         templates: int | None = None) -> Campaign:
    """A shipped preset by name or a campaign TOML file; ``plugins`` are loaded first
    (module names or .py paths, as ``--plugin``) and recorded with the campaign."""
    names = resolve_names(list(plugins), base_dir=Path.cwd(), where="--plugin")
    load_plugins(names, where="--plugin")
    campaign = _with_plugins(load_campaign(name_or_path), names)
    return campaign.with_templates(templates) if templates is not None else campaign


def from_dict(data: Mapping[str, Any], *, plugins: Sequence[str] = (),
              base_dir: Path | None = None) -> Campaign:
    """A campaign from the table a campaign file decodes to (docs/campaigns.md)."""
    return parse_campaign(data, source="<dict>", base_dir=base_dir,
                          plugins=resolve_names(list(plugins), base_dir=Path.cwd(),
                                                where="--plugin"))


def check(campaign: Campaign, *, jobs: int = 1, backend: str | None = None,
          cluster: str | None = None, repeats: int = 1) -> list[str]:
    """The plan (cells, episodes, networks, a wall-time estimate) and the expected
    resolution of its paired comparisons at ``repeats`` as lines; creates nothing.
    Raises the one-line error a run would raise before its first episode
    (``testbed.run.preflight``: backends probed as root, congestion controls; on a
    ``cluster`` the workers probe their own)."""
    from testbed.run.preflight import preflight
    from testbed.tools.plan_view import plan_lines
    from testbed.tools.resolution_view import resolution_report

    chosen = backend or campaign.options.backend
    check_backend(campaign, chosen)
    probed = None if cluster is not None or chosen == SIM_BACKEND else preflight(campaign,
                                                                                  backend)
    return [*plan_lines(campaign, jobs=jobs, backend=backend, probed=probed, cluster=cluster),
            *resolution_report(campaign, repeats=repeats)]


def warnings(campaign: Campaign, *, jobs: int = 1) -> list[str]:
    """What is allowed but probably a mistake, one line each (``testbed.campaign.advice``,
    and episodes the estimate puts beyond the episode timeout)."""
    from testbed.campaign.advice import campaign_warnings
    from testbed.tools.plan_view import estimate_warnings

    return [*campaign_warnings(campaign), *estimate_warnings(campaign, jobs)]


def run(campaign: Campaign, out: str | Path, *, resume: bool = False, extend: bool = False,
        jobs: int | None = None, backend: str | None = None, workdir: str | Path | None = None,
        console: Console | None = None, repeats: int = 1, rerun_disturbed: int = 0,
        host_lanes: int | None = None, allow_dirty: bool = False,
        allow_code_change: bool = False, allow_side_branch: bool = False,
        calibration: str | Path | None = None, cluster: str | None = None,
        tls: str | Path | Mapping[str, str] | ClusterAccess | None = None,
        insecure: bool = False, allow_mixed_backends: bool | None = None) -> RunSummary:
    """Run ``campaign`` into ``out`` (``resume``: finish an interrupted run there);
    ``repeats`` runs per episode and ``rerun_disturbed`` reruns of a disturbed one
    (docs/campaigns.md, "Attempts").

    The run holds lanes of the host's budget (``host_lanes``, default 8 per CPU;
    docs/campaigns.md, "Host-wide lanes") beside other runs on this host; a run into
    the repository's results/ needs a committed checkout on the main line unless
    ``allow_dirty`` / ``allow_side_branch``, and resuming or extending a run with other code
    than its last session's needs ``allow_code_change``. Units that fail are
    contained (testbed.run.failures): the summary's ``failures`` lists them and ``left``
    says what could not be removed at the end. ``backend="sim"`` runs every episode in
    virtual time (``testbed.sim``) with the service times of ``calibration`` (a file
    ``testbed calibrate sim`` wrote; default: its default path): no root, no processes.

    ``cluster`` (default: the campaign's ``[execution] cluster``, else this process)
    runs the units on dask workers: ``local:N`` starts N worker processes here,
    ``tls://HOST:PORT`` joins a scheduler with ``testbed worker``s, with ``tls`` the
    client's certificates: a TOML file with a ``[cluster]`` section (``testbed cluster
    certs`` writes ``client.toml``) or a mapping of ``tls_ca_file``, ``tls_cert`` and
    ``tls_key``. ``insecure`` allows plain ``tcp://`` beyond this host
    (testbed.run.cluster_security). A lost scheduler raises
    ``testbed.run.dask_engine.SchedulerLost`` (a ``HostError``); ``resume=True`` on the
    same ``out`` finishes the run."""
    from testbed.host.lanes import HostLanes
    from testbed.host.ledger import Ledger, clean_dead_runs, run_state_dir
    from testbed.run.attempts import AttemptPolicy
    from testbed.run.contract import Runner
    from testbed.run.episode import EpisodeRunner
    from testbed.run.failures import contained_ledger
    from testbed.run.loop import run_campaign

    out = Path(out)
    again = "resume" if resume else "extend" if extend else None
    if again is not None and not out.exists():  # it would start a new run there
        raise UserError(f"{again}=True: {out} does not exist; there is no run to {again} "
                        f"(check the path, or {again}=False to start a new run there)")
    attempts = AttemptPolicy(repeats, rerun_disturbed)
    lanes = jobs if jobs is not None else campaign.execution.jobs
    chosen = backend or campaign.options.backend
    check_backend(campaign, chosen)
    simulated = chosen == SIM_BACKEND
    cluster = cluster or campaign.execution.cluster
    access = _check_cluster(campaign, cluster, simulated, tls, insecure)
    mixed = (campaign.execution.allow_mixed_backends if allow_mixed_backends is None
             else allow_mixed_backends)
    sim_calibration = None
    if simulated:
        from testbed.sim.calibration import load as load_calibration

        sim_calibration = load_calibration(None if calibration is None else Path(calibration))
    shaped = any(campaign.network_profile(n).link is not None for n in campaign.network_names())
    here = cluster is None or cluster.startswith("local:")  # the workers check their own
    if shaped and not simulated and here and os.geteuid() != 0:
        raise HostError(f"campaign {campaign.name!r} has shaped networks: they need root "
                        "(or the `testbed run` command line, which enters a user namespace)")
    from testbed.run.preflight import preflight

    if not simulated and cluster is None:
        preflight(campaign, backend, probe=True)  # before anything exists (loop rule 8)
    printer = console or Console(highlight=False)
    label = str(out.absolute())
    if resume or extend:  # what a killed run (this one's, or any) left behind
        for item in clean_dead_runs(run_state_dir()):
            printer.print(f"removed {item} (left by an interrupted run)")
    root = Path(workdir) if workdir is not None else None
    summary: list[RunSummary] = []

    async def on_cluster(name: str, access: ClusterAccess) -> None:
        from testbed.run.dask_engine import open_dask_engine

        with interrupts.guard():
            async with open_dask_engine(name, backend=backend, workdir=root,
                                        allow_mixed_backends=mixed, access=access,
                                        say=lambda line: printer.print(line, markup=False)
                                        ) as engine:
                await engine.survey(campaign)
                summary.append(await run_campaign(campaign, out, resume=resume,
                                                  extend=extend, engine=engine,
                                                  console=printer, attempts=attempts,
                                                  allow_dirty=allow_dirty,
                                                  allow_code_change=allow_code_change,
                                                  allow_side_branch=allow_side_branch))

    async def main(ledger: Ledger) -> None:
        if cluster is not None:
            await on_cluster(cluster, access)
            return
        runner: Runner
        if sim_calibration is not None:  # virtual time (testbed.sim)
            from testbed.sim.episode import SimRunner

            runner = SimRunner(campaign, sim_calibration)
        elif campaign.command is not None:  # your own programs (docs/own-programs.md)
            from testbed.run.command_runner import CommandRunner

            runner = CommandRunner(campaign, out_dir=out, backend=backend,
                                   link_log_dir=out / "links")
        else:
            runner = EpisodeRunner(campaign, workdir_root=root, backend=backend,
                                   ledger=ledger, link_log_dir=out / "links",
                                   shared_emulator=lanes > 1)
        # a second Ctrl-C while the run cleans up: one line, no cut-short cleanup
        with interrupts.guard(), HostLanes(ledger.prefix, budget=host_lanes,
                                           campaign=campaign.name, label=label) as host:
            summary.append(await run_campaign(campaign, out, resume=resume, extend=extend,
                                              jobs=lanes, runner=runner, console=printer,
                                              host=host, allow_dirty=allow_dirty,
                                              allow_code_change=allow_code_change,
                                              allow_side_branch=allow_side_branch,
                                              attempts=attempts))

    with contained_ledger(label) as (ledger, left):  # a teardown error: in summary.left
        trio.run(main, ledger)
    return replace(summary[0], left=tuple(left))


def _check_cluster(campaign: Campaign, cluster: str | None, simulated: bool,
                   tls: str | Path | Mapping[str, str] | ClusterAccess | None,
                   insecure: bool) -> ClusterAccess:
    """What a run on ``cluster`` cannot do, in one line naming ``cluster``; the access
    ``tls`` and ``insecure`` give (testbed.run.cluster_security rule 2)."""
    from testbed.run.cluster_security import CONFIG_KEYS, cluster_access

    if cluster is not None:
        if simulated:
            raise UserError("cluster: the sim backend runs its episodes in this process for "
                            "now; drop the cluster (or use backend auto)")
        if campaign.options.link_log:
            raise UserError("options.link_log: packet logs are written by runs in this "
                            "process (jobs), not on a cluster; drop the cluster or link_log")
        if campaign.command is not None:
            raise UserError("cluster: a command workload runs its programs from this "
                            "process; drop the cluster (use jobs for lanes)")
    if isinstance(tls, ClusterAccess):
        return replace(tls, insecure=tls.insecure or insecure)
    if tls is None or isinstance(tls, str | Path):
        return cluster_access(config=None if tls is None else str(tls), insecure=insecure)
    unknown = sorted(set(tls) - set(CONFIG_KEYS))
    if unknown:
        raise UserError(f"tls: {unknown[0]} is not allowed; allowed: {', '.join(CONFIG_KEYS)} "
                        "(or the path of a TOML file with a [cluster] section)")
    return cluster_access(**{k: str(v) for k, v in tls.items()}, insecure=insecure)


def _run_dir(run_dir: str | Path) -> Path:
    path = Path(run_dir)
    if not (path / "episodes.parquet").exists():
        raise UserError(f"{path} has no episodes.parquet (run a campaign into it first, or "
                        "finish it with resume=True)")
    return path


def episodes(run_dir: str | Path) -> pd.DataFrame:
    """One row per episode (the result columns of docs/campaigns.md, plus the derived
    ``scheduled``, ``issued``, ``invalid_n``, ``available``, ``valid``)."""
    return load_run(_run_dir(run_dir)).episodes


def actions(run_dir: str | Path) -> pd.DataFrame:
    """One row per protected action."""
    return load_run(_run_dir(run_dir)).actions


def report(run_dir: str | Path, *, draws: int = 10_000, seed: int = 0,
           console: Console | None = None, episode: str | None = None,
           exclude_disturbed: bool = False, out: str | Path | None = None,
           timeline: bool = False) -> dict[str, Any]:
    """Write tables, figures and report.md/html into ``run_dir`` (or ``out``); what was
    written. ``timeline``: also draw ``episode``'s space-time diagram from its history.
    ``exclude_disturbed`` leaves disturbed attempts out of every table. The plugins the
    run recorded are loaded first where they still import (their policies' titles and
    categories label the tables; testbed.campaign.plugins rule 3)."""
    path = _run_dir(run_dir)
    recorded = load_run(path).manifest.get("plugins") or {}
    for note in load_recorded(recorded if isinstance(recorded, Mapping) else {}):
        if console is not None:
            console.print(f"report: note: {note}", markup=False)
    return build_report(path, draws=draws, seed=seed, console=console, episode=episode,
                        exclude_disturbed=exclude_disturbed,
                        out=Path(out) if out is not None else None, timeline=timeline)
