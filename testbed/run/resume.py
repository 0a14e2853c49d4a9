"""What `testbed run` says when a cluster run loses its scheduler: one line.

Rules:

- The line says how many of the campaign's episodes are committed, that the run
  directory is consistent (an episode is either committed whole or runs again,
  ``testbed.run.loop`` rule 1), and the exact command that finishes the run: the same
  command line with ``--resume`` (and ``--out``) on the cluster once its scheduler is
  back, and, where the campaign file does not name a cluster itself, the same here
  without ``--cluster`` (a cluster run may be resumed locally, docs/campaigns.md).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from testbed.campaign.model import Campaign
from testbed.results.rundir import RunDir

#: Options of `testbed run` that only a cluster run takes, and whether they take a value.
CLUSTER_OPTIONS = {"--cluster": True, "--tls-ca-file": True, "--tls-cert": True,
                   "--tls-key": True, "--cluster-config": True, "--insecure": False,
                   "--allow-mixed-backends": False}


def _without(argv: Sequence[str], options: dict[str, bool]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in options:
            skip = options[name] and "=" not in arg
            continue
        out.append(arg)
    return out


def resume_argv(argv: Sequence[str], out: Path, *, local: bool) -> list[str]:
    """``argv`` (a `testbed run` command line without the program) made to resume."""
    args = list(argv)
    if local:
        args = _without(args, CLUSTER_OPTIONS)
    names = {a.split("=", 1)[0] for a in args}
    if "--out" not in names:
        args += ["--out", str(out)]
    if "--resume" not in names and "--extend" not in names:
        args.append("--resume")
    return ["testbed", *args]


def scheduler_lost_line(exc: Exception, campaign: Campaign, out: Path,
                        argv: Sequence[str]) -> str:
    done = len(RunDir(out).completed())
    total = len(campaign.episodes())
    line = (f"{exc} after {done} of {total} episodes finished; {out} is consistent "
            "(finished episodes are committed, the others run again); resume with "
            f"`{shlex.join(resume_argv(argv, out, local=False))}` once the scheduler is back")
    if campaign.execution.cluster is None:
        line += f", or here with `{shlex.join(resume_argv(argv, out, local=True))}`"
    return line
