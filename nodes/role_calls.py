"""Role calls at a node: one prompt, bounded corrections, every attempt on the record.

Rules this module obeys (``protocols.roles`` has the prompts and the schema rules):

1. A role call sends the prompt through the node's :class:`nodes.model_client.ModelClient`
   (which retries transport failures itself) and parses the answer against the role's
   schema. A violation is answered with a correction, at most ``corrections`` times;
   one more violation, or a transport failure after every retry, raises
   :class:`protocols.roles.ModelFailure`. Nothing is ever accepted that did not parse.
2. Every call, failed or not, leaves one :class:`CallLog` entry: the prompt and its
   digest, every response, the parsed decision, the exact parents given to the call,
   the record it produced, its latency (first byte sent to decision, corrections
   included), tokens, HTTP attempts and times on CLOCK_MONOTONIC (so the controller can
   place a call between other processes' events). The controller drains the log.
3. A replacement plan made by a live executor (``make_replanner``) is a role call too:
   its prompt holds only the refreshed requirement, its parents are exactly the
   refreshed inputs, and its content records the decision the model made.
4. Anyone may wait for the next call of a role (``wait_started``): the overlap cohort
   commits an owner update while a replacement generation is in flight.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from protocols.env import ActionRequest, LocalStore
from protocols.errors import IntegrityError
from protocols.identity import Identity
from protocols.planning import plan_content
from protocols.records import Record, make_record
from protocols.roles import (
    DecisionError,
    ModelFailure,
    RolePrompt,
    build_prompt,
    canonical_json,
    correction,
    parse_decision,
    task_document,
)

if TYPE_CHECKING:  # httpx is imported only by nodes that get a model endpoint
    from nodes.model_client import ModelClient

Replanner = Callable[[ActionRequest, dict[str, bytes], int], Awaitable[ActionRequest]]


@dataclass
class CallEntry:
    """One role call as recorded (rule 2)."""

    role: str
    action: str
    agent: str
    prompt_digest: str
    messages: list[dict[str, str]]
    parents: list[str]  # hex record IDs given to the call
    responses: list[str] = field(default_factory=list)
    decision: dict[str, Any] | None = None
    record: str = ""  # hex ID of the record holding the decision ("" if none)
    error: str = ""
    corrections: int = 0
    http_attempts: int = 0
    completions: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    started_t_ns: int = 0
    ended_t_ns: int = 0
    model: str = ""

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


class RoleCaller:
    """Role calls of one node over one endpoint, with their log (module rules)."""

    def __init__(self, client: ModelClient, agent: str) -> None:
        self.client = client
        self.agent = agent
        self.log: list[CallEntry] = []
        self._started: dict[str, trio.Event] = {}
        self.last_start_ns: dict[str, int] = {}

    def drain(self) -> list[dict[str, Any]]:
        out = [entry.to_wire() for entry in self.log]
        self.log.clear()
        return out

    def _event(self, role: str) -> trio.Event:
        return self._started.setdefault(role, trio.Event())

    async def wait_started(self, role: str, *, after_ns: int, timeout_s: float) -> int:
        """CLOCK_MONOTONIC ns at which a call of ``role`` started after ``after_ns``
        (0 if none did within ``timeout_s``)."""
        with trio.move_on_after(timeout_s):
            while self.last_start_ns.get(role, 0) <= after_ns:
                await self._event(role).wait()
        start = self.last_start_ns.get(role, 0)
        return start if start > after_ns else 0

    async def decide(self, prompt: RolePrompt, action: str,
                     parents: Sequence[bytes]) -> tuple[dict[str, Any], CallEntry]:
        """The decision of one role call (rule 1); the entry is logged either way."""
        entry = CallEntry(prompt.role, action, self.agent, prompt.digest,
                          [dict(m) for m in prompt.messages], [p.hex() for p in parents],
                          model=self.client.endpoint.model)
        self.log.append(entry)
        entry.started_t_ns = time.monotonic_ns()
        self.last_start_ns[prompt.role] = entry.started_t_ns
        event = self._event(prompt.role)
        self._started[prompt.role] = trio.Event()
        event.set()
        messages = prompt.messages
        try:
            while True:
                completion = await self._chat(entry, messages, prompt)
                try:
                    entry.decision = parse_decision(completion.text, prompt.schema)
                    return entry.decision, entry
                except DecisionError as exc:
                    if entry.corrections >= self.client.endpoint.corrections:
                        raise ModelFailure(f"{prompt.role}: schema violation after "
                                           f"{entry.corrections} correction(s): {exc}"
                                           ) from None
                    entry.corrections += 1
                    messages = correction(prompt, completion.text, str(exc))
        except ModelFailure as exc:
            entry.error = str(exc)
            raise
        finally:
            entry.ended_t_ns = time.monotonic_ns()
            entry.latency_ms = (entry.ended_t_ns - entry.started_t_ns) / 1e6

    async def _chat(self, entry: CallEntry, messages: Sequence[dict[str, str]],
                    prompt: RolePrompt) -> Any:
        try:
            completion = await self.client.chat(messages, prompt.schema)
        except ModelFailure as exc:
            entry.http_attempts += self.client.last_attempts
            raise type(exc)(f"{prompt.role}: {exc}") from None  # keeps EndpointUnavailable
        entry.http_attempts += completion.attempts
        entry.completions += 1
        entry.responses.append(completion.text)
        entry.prompt_tokens += completion.prompt_tokens
        entry.completion_tokens += completion.completion_tokens
        return completion


def requirement_of(records: Sequence[Record]) -> tuple[Record, dict[str, Any]]:
    """The first record among ``records`` that holds a task document, and the document."""
    for record in records:
        if record.rtype in ("requirement", "artifact"):
            try:
                return record, task_document(record.content)
            except DecisionError:
                continue
    raise ModelFailure("no task document among the inputs given to the role call")


def make_replanner(caller: RoleCaller, identity: Identity, store: LocalStore) -> Replanner:
    """A live executor's replacement generation (rule 3), for ``NodeEnv.replan``."""

    async def replan(request: ActionRequest, inputs: dict[str, bytes], n: int
                     ) -> ActionRequest:
        records = []
        for key, rid in sorted(inputs.items()):
            record = store.get(rid)
            if record is None or record.key != key:
                raise IntegrityError(f"replan input {key!r} is not installed locally")
            records.append(record)
        _, doc = requirement_of(records)
        prompt = build_prompt("replan", str(doc["family"]), requirement=doc,
                              action=request.action)
        decision, entry = await caller.decide(prompt, request.action, [r.id for r in records])
        plan = make_record(identity, key=f"plan/{request.action}/r{n}",
                           owner=identity.agent_id, seq=0, parents=[r.id for r in records],
                           rtype="plan", content=plan_content(request.action, records,
                                                              canonical_json(decision)))
        store.install(plan)
        entry.record = plan.id.hex()
        return ActionRequest(request.action, (plan.id,), request.declared)

    return replan
