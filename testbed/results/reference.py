"""Reference runs come from a clean, committed revision.

A run that writes into the repository's own ``results/`` (the reference results the
README's claims are checked against, ``results/claims.toml``) is refused while the
checkout has uncommitted changes to tracked files outside ``results/`` (a run's own
outputs there do not count: the next campaign of ``scripts/reference_runs.sh`` would
otherwise be refused for the previous one's results), unless forced (``testbed run
--allow-dirty``). The manifest's ``git`` records what was found (``code_dirty``, the
paths) and whether the check was overridden (``allow_dirty``).

A reference run also comes from the main line: HEAD must be reachable from ``main``
(or ``master``), so that the revision its manifest names stays in the repository's
history (a side branch's commits that never land make a run nobody can trace back).
Results committed on top of a side branch that is then merged are the exception
``--allow-side-branch`` admits; ``testbed verify`` checks every recorded revision is
reachable once they land.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from testbed.errors import UserError
from testbed.results import provenance

OUTPUTS = "results"


def code_changes(repo: Path | None = None) -> list[str] | None:
    """Tracked files changed outside ``results/`` (None: not a git checkout)."""
    where = repo or provenance.SOURCE_ROOT
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                              ".", f":(exclude){OUTPUTS}"], cwd=where, capture_output=True,
                             text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [line[3:] for line in out.splitlines() if line.strip()]


def is_reference_output(out_dir: Path, repo: Path | None = None) -> bool:
    root = (repo or provenance.SOURCE_ROOT).resolve() / OUTPUTS
    return Path(out_dir).resolve().is_relative_to(root)


def check_reference_run(out_dir: Path, *, allow_dirty: bool, allow_side_branch: bool = False,
                        repo: Path | None = None) -> dict[str, Any]:
    """Refuse a run into the repository's results/ from a dirty checkout (unless
    ``allow_dirty``); returns what the manifest's ``git`` adds."""
    changes = code_changes(repo)
    record: dict[str, Any] = {"code_dirty": None if changes is None else bool(changes)}
    if changes:
        record["changed"] = changes[:20]
    if not is_reference_output(out_dir, repo):
        return record
    record["reference_output"] = True
    if changes and not allow_dirty:
        shown = ", ".join(changes[:3]) + (" ..." if len(changes) > 3 else "")
        raise UserError(f"--out: {out_dir} is the repository's results/, and the checkout "
                        f"has uncommitted changes ({shown}); reference runs come from a "
                        "committed revision: commit first, or pass --allow-dirty (the "
                        "manifest records it)")
    if changes:
        record["allow_dirty"] = True
    main = provenance.main_branch(repo)
    on_main = None if main is None else provenance.is_ancestor("HEAD", main, repo)
    if on_main is False:
        if not allow_side_branch:
            raise UserError(f"--out: {out_dir} is the repository's results/, and HEAD is not "
                            f"on {main} (a side branch or detached commit); reference runs "
                            f"come from a revision on {main}, so that the manifest's revision "
                            f"stays reachable: merge into {main} first, or pass "
                            "--allow-side-branch and merge the results with their revision")
        record["allow_side_branch"] = True
    record["on_main"] = on_main
    return record
