"""The sessions of a run and the code each one ran.

Rules this module obeys:

1. A session's code is the product-code digest it recorded (``sessions[i].git.
   code_sha256``, ``testbed.results.provenance``). A run made before sessions recorded
   their code names one revision only, the last session's (the manifest's top-level
   ``git``); its code is that revision's digest when the revision is in this repository
   and the checkout was recorded clean (``code_dirty`` false), and unknown otherwise.
   Earlier sessions of such a run are unknown.
2. ``--resume`` and ``--extend`` continue a run with the code of its last session: a
   different digest, or one that cannot be known, is refused unless the user allows a
   code change; the new session then records its own code and every episode row names
   its session, so the manifest says which episodes came from which code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from testbed.errors import UserError
from testbed.results import provenance


@dataclass(frozen=True)
class SessionCode:
    """What one session of a run ran (rule 1); ``how`` says where the digest came from:
    ``recorded``, ``derived`` (from a clean revision), or why it is unknown."""

    index: int
    revision: str | None
    code_sha256: str | None
    how: str


def session_code(manifest: Mapping[str, Any], *, derive: bool = True) -> list[SessionCode]:
    """Per session, 1 upward, the code it ran (rule 1)."""
    sessions = manifest.get("sessions") or []
    top = manifest.get("git") or {}
    out = []
    for index, session in enumerate(sessions, start=1):
        git = session.get("git") if isinstance(session, Mapping) else None
        if isinstance(git, Mapping) and git.get("code_sha256"):
            out.append(SessionCode(index, git.get("revision"), str(git["code_sha256"]),
                                   "recorded"))
        elif index == len(sessions):
            out.append(_from_revision(index, top, derive=derive))
        else:
            out.append(SessionCode(index, None, None, "its revision was not recorded (an "
                                   "earlier session of a run made before sessions recorded "
                                   "their code)"))
    if not sessions and top:  # a manifest with no session list at all
        out.append(_from_revision(1, top, derive=derive))
    return out


def _from_revision(index: int, git: Mapping[str, Any], *, derive: bool) -> SessionCode:
    revision = git.get("revision")
    if not isinstance(revision, str) or revision == "unknown":
        return SessionCode(index, None, None, "no revision recorded")
    if git.get("code_sha256"):
        return SessionCode(index, revision, str(git["code_sha256"]), "recorded")
    if git.get("code_dirty") is not False:
        why = ("the checkout had uncommitted code" if git.get("code_dirty")
               else "whether the checkout was clean was not recorded")
        return SessionCode(index, revision, None, why)
    digest = provenance.code_digest_at(revision) if derive else None
    if digest is None:
        return SessionCode(index, revision, None,
                           "its revision is not in this repository" if derive else "derivable")
    return SessionCode(index, revision, digest, "derived")


def check_same_code(manifest: Mapping[str, Any], code: Mapping[str, Any], *, flag: str,
                    allowed: bool) -> None:
    """Refuse to continue a run with other code than its last session's (rule 2)."""
    sessions = session_code(manifest)
    if allowed or not sessions:
        return
    last = sessions[-1]
    now = code.get("code_sha256")
    if last.code_sha256 is not None and last.code_sha256 == now:
        return
    rev = (last.revision or "unknown")[:12]
    if last.code_sha256 is None:
        raise UserError(f"{flag}: the code of this run's last session is unknown (revision "
                        f"{rev}: {last.how}); pass --allow-code-change to continue it with "
                        "this checkout's code (the manifest records which episodes came "
                        "from which code)")
    raise UserError(f"{flag}: this checkout's code ({_short(now)}) is not the code of the "
                    f"run's last session ({_short(last.code_sha256)}, revision {rev}); check "
                    f"out revision {rev}, or pass --allow-code-change (the manifest records "
                    "which episodes came from which code)")


def _short(digest: object) -> str:
    text = str(digest)
    return text[:19] + "..." if len(text) > 19 else text
