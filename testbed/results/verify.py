"""``testbed verify``: can a run directory be traced back to the code and inputs that
made it, and is it whole?

Rules this module obeys:

1. Checked, one problem a line (nothing is changed unless anchoring is asked for):
   the manifest parses and the run is complete; its schema version is one this code
   reads and its tables hold only known columns; every session's revision is in this
   repository and reachable from HEAD, and its code digest (recorded, or derived from a
   clean revision: ``testbed.results.sessions``) equals that revision's; sessions ran
   the same code unless a code change was allowed; each recorded lock digest equals the
   revision's lock file; every trace file the run replayed has its recorded size and
   SHA-256; the campaign file the run names, where this repository keeps it, still
   gives the recorded campaign (a scratch file that was not kept is no problem: the
   manifest's config is the campaign, and what ``testbed reproduce`` reruns); the
   episodes are exactly the plan's (none missing, none extra) and each session's count
   matches the rows that name it.
2. Files recorded with an absolute path that no longer exists (another checkout, a
   temporary directory) are looked for in this repository by the longest tail of their
   path (``/tmp/x/results/configs/rates.toml`` -> ``results/configs/rates.toml``), a
   campaign file also as the ``campaign.toml`` kept beside the run; shipped traces by
   their name. Where a file was found is part of the problem line
   only when it differs.
3. Anchoring (``anchor=True``): a session whose code digest was derived from its clean,
   reachable revision gets that digest written into its record, with how and when; a
   session whose code cannot be known is never anchored: such a run must be rerun.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from testbed.campaign.model import CampaignError, episode_key
from testbed.campaign.networks import shipped_trace
from testbed.campaign.parse import load_campaign, preset_names, recorded_campaign
from testbed.errors import UserError
from testbed.results import provenance
from testbed.results.atomic import write_json_atomic
from testbed.results.schema import ACTION_COLUMNS, EPISODE_COLUMNS, RESULT_SCHEMA_VERSION
from testbed.results.sessions import SessionCode, session_code

PRESET_PREFIX = "preset "


@dataclass
class Verification:
    """What :func:`verify_run` found: ``problems`` (one line each) and ``facts``."""

    path: Path
    problems: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    anchored: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_run(path: Path | str, *, repo: Path | None = None, head: str = "HEAD",
               anchor: bool = False) -> Verification:
    """Check a run directory (rule 1); a path that is no run directory is a UserError."""
    run = Path(path)
    root = repo or provenance.SOURCE_ROOT
    manifest_path = run / "manifest.json"
    if not run.is_dir():
        raise UserError(f"RUN: {run} is not a directory; give a run directory written by "
                        "`testbed run`")
    if not manifest_path.is_file():
        raise UserError(f"RUN: {run} has no manifest.json; give a run directory written by "
                        "`testbed run`")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"RUN: {manifest_path} is unreadable ({exc})") from None
    if not isinstance(manifest, dict):
        raise UserError(f"RUN: {manifest_path} is not a JSON object")
    out = Verification(run)
    status = manifest.get("status")
    if status != "complete":
        out.problems.append(f"status {status!r}: the run did not finish; finish it with "
                            "`testbed run ... --resume`")
    _check_schema(run, manifest, out)
    codes = session_code(manifest)
    _check_code(manifest, codes, root, head, out)
    _check_locks(manifest, codes, root, out)
    _check_traces(manifest, root, out)
    campaign_config = manifest.get("config")
    _check_source(manifest, campaign_config, root, out, run)
    _check_episodes(run, manifest, campaign_config, out)
    if anchor:
        _anchor(manifest_path, manifest, codes, out)
    return out


def _check_schema(run: Path, manifest: Mapping[str, Any], out: Verification) -> None:
    version = manifest.get("schema_version", 1)
    if not isinstance(version, int) or not 1 <= version <= RESULT_SCHEMA_VERSION:
        out.problems.append(f"schema_version {version!r}: this testbed reads 1 to "
                            f"{RESULT_SCHEMA_VERSION}")
    for name, known in (("episodes.parquet", EPISODE_COLUMNS),
                        ("actions.parquet", ACTION_COLUMNS)):
        table = run / name
        if not table.is_file():
            out.problems.append(f"{name}: missing (an unfinished or partly copied run)")
            continue
        try:
            columns = pq.read_schema(table).names
        except (OSError, ValueError) as exc:
            out.problems.append(f"{name}: unreadable ({exc})")
            continue
        unknown = sorted(set(columns) - set(known))
        if unknown:
            out.problems.append(f"{name}: unknown column(s) {', '.join(unknown[:5])} "
                                f"(schema version {version})")


def _check_code(manifest: Mapping[str, Any], codes: list[SessionCode], root: Path,
                head: str, out: Verification) -> None:
    if not codes:
        out.problems.append("no session and no revision recorded")
        return
    for code in codes:
        where = f"session {code.index}"
        if code.revision is None:
            out.problems.append(f"{where}: {code.how}; rerun the study from a revision on "
                                "main")
            continue
        rev = code.revision[:12]
        reachable = provenance.is_ancestor(code.revision, head, root)
        if provenance.code_digest_at(code.revision, root) is None:
            out.problems.append(f"{where}: revision {rev} is not in this repository (made "
                                "from commits that never landed); rerun the study from a "
                                "revision on main")
            continue
        if reachable is False:
            out.problems.append(f"{where}: revision {rev} is not reachable from {head}")
        if code.code_sha256 is None:
            out.problems.append(f"{where}: the code it ran is unknown ({code.how}); rerun "
                                "the study from a clean revision on main")
            continue
        at_revision = provenance.code_digest_at(code.revision, root)
        if code.code_sha256 != at_revision:
            out.problems.append(f"{where}: its code digest is not revision {rev}'s (it ran "
                                "uncommitted code)")
    known = [c for c in codes if c.code_sha256 is not None]
    sessions = manifest.get("sessions") or []
    for before, after in itertools.pairwise(known):
        if before.code_sha256 == after.code_sha256:
            continue
        record = sessions[after.index - 1] if after.index <= len(sessions) else {}
        if not (isinstance(record, Mapping) and record.get("allow_code_change")):
            out.problems.append(f"sessions {before.index} and {after.index} ran different "
                                "code without --allow-code-change")
        else:
            out.facts.append(f"sessions {before.index} and {after.index} ran different code "
                             "(allowed; episodes name their session)")
    digests = sorted({c.code_sha256 for c in known if c.code_sha256})
    revisions = sorted({c.revision[:12] for c in known if c.revision})
    if digests:
        out.facts.append(f"code {', '.join(d[:19] for d in digests)} at revision "
                         f"{', '.join(revisions)}")


def _check_locks(manifest: Mapping[str, Any], codes: list[SessionCode], root: Path,
                 out: Verification) -> None:
    sessions = manifest.get("sessions") or []
    top = (manifest.get("lock") or {}).get("sha256")
    for code in codes:
        if code.revision is None:
            continue
        record = sessions[code.index - 1] if code.index <= len(sessions) else {}
        recorded = record.get("lock_sha256") if isinstance(record, Mapping) else None
        if recorded is None and code.index == len(codes):
            recorded = top  # runs before sessions recorded theirs: the last session's
        if recorded is None:
            continue
        data = provenance.file_at(code.revision, provenance.LOCK_NAME, root)
        if data is not None and hashlib.sha256(data).hexdigest() != recorded:
            out.problems.append(f"session {code.index}: its lock file digest is not revision "
                                f"{code.revision[:12]}'s {provenance.LOCK_NAME}")


def relocate(recorded: str, root: Path) -> Path | None:
    """Where a recorded file is now (rule 2): the path itself, else the longest tail of
    it that exists under ``root``."""
    path = Path(recorded)
    if not path.is_absolute():
        candidate = root / path
        return candidate if candidate.is_file() else None
    if path.is_file():
        return path
    parts = path.parts[1:]
    for start in range(len(parts)):
        candidate = root.joinpath(*parts[start:])
        if candidate.is_file():
            return candidate
    return None


def _check_traces(manifest: Mapping[str, Any], root: Path, out: Verification) -> None:
    count = 0
    for name, entry in (manifest.get("networks") or {}).items():
        for item in (entry.get("files") or []) if isinstance(entry, Mapping) else []:
            ref = str(item.get("ref", ""))
            now = shipped_trace(ref)
            if now is None:
                now = relocate(str(item.get("path", ref)), root)
            label = f"network {name}: {item.get('field', ref)}"
            if now is None:
                out.problems.append(f"{label}: {ref} is not in this repository")
                continue
            data = now.read_bytes()
            if len(data) != item.get("size") or \
                    hashlib.sha256(data).hexdigest() != item.get("sha256"):
                out.problems.append(f"{label}: {now} is not the file the run replayed "
                                    "(size or SHA-256 differ)")
            count += 1
    if count:
        out.facts.append(f"{count} trace file(s) as recorded")


def _portable(config: Mapping[str, Any], campaign_dir: Path) -> dict[str, Any]:
    """CONFIG with a command workload's directory written relative to the campaign
    file's own (the checkout it ran from is not part of the campaign)."""
    out = dict(config)
    command = out.get("command")
    if not (isinstance(command, Mapping) and isinstance(command.get("cwd"), str)):
        return out
    cwd, tail = Path(command["cwd"]).parts, campaign_dir.parts
    # the campaign file's directory as recorded: absolute, or relative to where it ran
    for start in range(len(cwd) - len(tail) + 1):
        if cwd[start:start + len(tail)] == tail and (campaign_dir.is_absolute() or start):
            inside = cwd[start + len(tail):]
            out["command"] = {**command, "cwd": str(Path(*inside)) if inside else "."}
            break
    return out


def _check_source(manifest: Mapping[str, Any], config: Any, root: Path,
                  out: Verification, manifest_dir: Path) -> None:
    source = manifest.get("source")
    if not isinstance(source, str) or not isinstance(config, Mapping):
        out.problems.append("no campaign recorded (manifest source/config)")
        return
    if source.startswith(PRESET_PREFIX) and source[len(PRESET_PREFIX):] in preset_names():
        where: str | Path = source[len(PRESET_PREFIX):]
    else:
        found = relocate(source, root)
        kept = manifest_dir / "campaign.toml"  # a copy kept beside the run
        if found is None and kept.is_file():
            found = kept
        if found is None:  # a scratch file: the manifest's config is the campaign
            out.facts.append(f"campaign file {source} not kept; its recorded config is the "
                             "campaign")
            return
        where = found
    try:
        campaign = load_campaign(where)
    except (CampaignError, UserError) as exc:
        out.problems.append(f"campaign source {where}: does not parse now ({exc})")
        return
    now = campaign.config()
    if isinstance(where, Path):  # a command's directory is the campaign file's, wherever
        now = _portable(now, where.parent)
        config = _portable(config, Path(source).parent)
    differing = [k for k in sorted(set(now) | set(config)) if now.get(k) != config.get(k)]
    if differing:
        out.problems.append(f"campaign source {where}: gives another campaign than the run "
                            f"recorded (field {differing[0]})")
    else:
        out.facts.append(f"campaign {where} as recorded")


def _check_episodes(run: Path, manifest: Mapping[str, Any], config: Any,
                    out: Verification) -> None:
    if not isinstance(config, Mapping):
        return
    try:
        campaign = recorded_campaign(config, source=str(run / "manifest.json"))
    except (CampaignError, UserError) as exc:
        out.problems.append(f"config: the recorded campaign does not parse ({exc})")
        return
    table_path = run / "episodes.parquet"
    if not table_path.is_file():
        return
    try:
        names = pq.read_schema(table_path).names
        columns = [c for c in ("episode", "session") if c in names]
        table = pq.read_table(table_path, columns=columns)
    except (OSError, ValueError):
        return  # said by _check_schema
    present = table.column("episode").to_pylist()
    planned = {episode_key(c, t) for c, t in campaign.episodes()}
    held = set(present)
    missing = sorted(planned - held)
    extra = sorted(held - planned)
    if missing:
        out.problems.append(f"{len(missing)} of {len(planned)} planned episodes missing "
                            f"(first: {missing[0]})")
    if extra:
        out.problems.append(f"{len(extra)} episodes not in the recorded plan "
                            f"(first: {extra[0]})")
    out.facts.append(f"{len(held)} episodes ({len(present)} attempts) of {len(planned)} "
                     "planned")
    sessions = manifest.get("sessions") or []
    if "session" not in columns:
        return
    by_session: dict[int | None, int] = {}
    for value in table.column("session").to_pylist():
        by_session[value] = by_session.get(value, 0) + 1
    for index, record in enumerate(sessions, start=1):
        recorded = record.get("episodes") if isinstance(record, Mapping) else None
        if recorded is not None and recorded != by_session.get(index, 0):
            out.problems.append(f"session {index}: recorded {recorded} episodes, the tables "
                                f"hold {by_session.get(index, 0)} that name it")


def _anchor(manifest_path: Path, manifest: dict[str, Any], codes: list[SessionCode],
            out: Verification) -> None:
    """Rule 3: write derived code digests into their sessions."""
    sessions = manifest.get("sessions") or []
    derived = [c for c in codes if c.how == "derived" and c.index <= len(sessions)]
    if not derived or any("not reachable" in p or "not in this repository" in p
                          for p in out.problems):
        return
    when = time.strftime("%Y-%m-%d")
    for code in derived:
        record = dict(sessions[code.index - 1])
        record["git"] = {"revision": code.revision, "code_dirty": False,
                         "code_sha256": code.code_sha256,
                         "anchored": f"{when}: code digest derived by `testbed verify "
                                     "--anchor` from the revision this session recorded "
                                     "with a clean checkout"}
        sessions[code.index - 1] = record
        out.anchored.append(code.index)
    manifest["sessions"] = sessions
    write_json_atomic(manifest, manifest_path)
