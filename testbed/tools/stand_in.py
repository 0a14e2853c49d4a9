"""What the stand-in model server answers, and when (pure: no sockets, no clock).

The stand-in is **not a model**. It answers the testbed's role prompts by a fixed rule so
that tests, CI and demos can run the live workflows without one; its results say what
the harness and the policies do with a model that decides from its inputs, nothing
about what a model would do. Rules:

1. It reads the role content of the prompt (``protocols.roles.user_content``) and
   decides from the requirement it was given, as a model given that input should: the
   planner and the executor (first call or replacement) choose the candidate the
   requirement's need selects; the auditor confirms an executor action that matches the
   requirement it holds and otherwise acts on the one that does. A stale requirement
   therefore gives a stale decision. An auditor that agrees repeats the action instead
   of confirming with probability ``auditor_repeat_rate`` (0 by default), seeded.
2. Everything is seeded: the latency of an answer and whether a fault hits it depend
   only on (seed, the role prompt's digest, the attempt number of that prompt), where a
   correction after a schema violation counts as the next attempt of the same prompt.
3. Latency: ``zero``; ``calibrated`` (the paper's earlier calibration of 354 role calls:
   median 1.17 s, quartiles 0.69 and 2.90 s; a lognormal on each side of the median
   through those quartiles, capped at 15 s); ``matched`` (0.6 s, the matched live
   study's median role call); or a fixed number of seconds.
4. Faults, on the attempts chosen by ``fault_rate`` (and only the first ``fault_first``
   attempts of a prompt when set): ``slow`` (answer after ``slow_s``), ``malformed``
   (a 200 whose content is not JSON), ``429``, ``500``, ``drop`` (close without an
   answer).
5. Replay: given a live run's recorded decisions, it answers each prompt with the
   response recorded for that prompt's digest (attempt by attempt); a prompt it has no
   record of is a 500, never an invented answer.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocols.roles import (
    CONFIRM,
    FAMILY_TOOLS,
    DecisionError,
    canonical_json,
    decision_option,
    prompt_digest,
    satisfying_option,
    user_content,
)
from testbed.campaign.decisions import read_calls
from testbed.campaign.workload import seed_int

LATENCIES = ("zero", "calibrated", "matched")
FAULTS = ("slow", "malformed", "429", "500", "drop")
CALIBRATED_MEDIAN_S, CALIBRATED_Q1_S, CALIBRATED_Q3_S = 1.17, 0.69, 2.90
MATCHED_S = 0.6
LATENCY_CAP_S = 15.0
_Z75 = statistics.NormalDist().inv_cdf(0.75)
MALFORMED = '{"tool": "'  # a decision cut short: not JSON


@dataclass(frozen=True)
class StandInRules:
    """The stand-in's settings (module rules)."""

    seed: int = 0
    latency: str = "zero"
    fault: str | None = None
    fault_rate: float = 1.0
    fault_first: int | None = None
    slow_s: float = 30.0
    auditor_repeat_rate: float = 0.0
    replay: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.latency not in LATENCIES:
            try:
                ok = math.isfinite(float(self.latency)) and float(self.latency) >= 0
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"latency: {self.latency!r} is not allowed; allowed: "
                                 f"{', '.join(LATENCIES)} or seconds >= 0")
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"fault: {self.fault!r} is not allowed; allowed: "
                             f"{', '.join(FAULTS)}")
        for name, value in (("fault_rate", self.fault_rate),
                            ("auditor_repeat_rate", self.auditor_repeat_rate)):
            if not 0 <= value <= 1:
                raise ValueError(f"{name}: {value!r} is not allowed; allowed: 0..1")

    def latency_s(self, digest: str, attempt: int) -> float:
        """The seeded delay before an answer (rule 3)."""
        if self.latency == "zero":
            return 0.0
        if self.latency == "matched":
            return MATCHED_S
        if self.latency != "calibrated":
            return float(self.latency)
        u = random.Random(seed_int("latency", self.seed, digest, attempt)).random()
        z = statistics.NormalDist().inv_cdf(min(max(u, 1e-9), 1 - 1e-9))
        low = math.log(CALIBRATED_MEDIAN_S / CALIBRATED_Q1_S) / _Z75
        high = math.log(CALIBRATED_Q3_S / CALIBRATED_MEDIAN_S) / _Z75
        return min(LATENCY_CAP_S, CALIBRATED_MEDIAN_S * math.exp(z * (low if z < 0 else high)))

    def fault_for(self, digest: str, attempt: int) -> str | None:
        """The fault this attempt meets, if any (rule 4)."""
        if self.fault is None or (self.fault_first is not None and attempt >= self.fault_first):
            return None
        u = random.Random(seed_int("fault", self.seed, digest, attempt)).random()
        return self.fault if u < self.fault_rate else None

    def answer(self, messages: Sequence[Mapping[str, str]], attempt: int) -> str | None:
        """The assistant's content for a role prompt (rules 1 and 5); None: no record."""
        digest = role_prompt_digest(messages)
        if self.replay:
            recorded = self.replay.get(digest)
            if not recorded:
                return None
            return recorded[min(attempt, len(recorded) - 1)]
        return canonical_json(self.decide(user_content(messages), digest))

    def decide(self, content: Mapping[str, Any], digest: str) -> dict[str, Any]:
        family = str(content.get("workflow", ""))
        tool = FAMILY_TOOLS.get(family)
        if tool is None:
            raise DecisionError(f"workflow: {family!r} is not a known family")
        requirement = dict(content.get("requirement") or {})
        option = satisfying_option(requirement)
        if option is None:  # nothing fits: keep what was inherited, else the first
            option = decision_option(content.get("inherited_plan")) or str(
                (requirement.get("candidates") or [{}])[0].get("id", ""))
        act = {"tool": tool, "arguments": {"option": option}}
        if content.get("role") != "auditor":
            return act
        if decision_option(content.get("executor_action")) != option:
            return act  # the requirement it holds calls for another action
        u = random.Random(seed_int("repeat", self.seed, digest)).random()
        return act if u < self.auditor_repeat_rate else {"tool": CONFIRM, "arguments": {}}


def role_prompt_digest(messages: Sequence[Mapping[str, str]]) -> str:
    """The digest of the role prompt a request belongs to: its system and first user
    message (a correction appends to them, so it counts as the same prompt)."""
    return prompt_digest(list(messages)[:2])


def load_replay(run: Path) -> dict[str, tuple[str, ...]]:
    """prompt digest -> the responses recorded for it, attempt by attempt (rule 5)."""
    out: dict[str, tuple[str, ...]] = {}
    for call in read_calls(run):
        responses = tuple(str(r) for r in call.get("responses") or ())
        digest = str(call.get("prompt_digest", ""))
        if digest and responses and digest not in out:
            out[digest] = responses
    return out


def token_count(text: str) -> int:
    """Tokens as the stand-in reports them: characters / 4, rounded up (not a tokenizer)."""
    return (len(text) + 3) // 4
