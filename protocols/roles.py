"""Role calls of the live workflows: prompts, tool schemas and decisions (pure, no I/O).

Rules this module obeys (paper, appendices C and C.2, in this testbed's words):

1. A task document is the content of a requirement record: canonical JSON with the
   family, a request in words, what the task needs (``need``: one attribute and the
   value it must have) and the candidates (``id`` and attributes). Exactly one
   candidate satisfies the need; which one is the task's correct action.
2. Every role gets the same short system instruction with its role and family filled
   in; the user content is one stable JSON object (sorted keys) built only from the
   role's own public inputs: the requirement it holds or was given, the inherited plan's
   action (executor) or the primary action (auditor). Record IDs, owners and anything a
   grader knows never reach the model.
3. The tool schema enumerates every permitted tool and argument: the family's tool with
   ``option`` one of the candidate IDs of the requirements given (so it permits the
   inherited action and the fresh alternatives alike); the auditor may also ``confirm``.
4. A decision is exactly one JSON object ``{"tool": ..., "arguments": {...}}`` (a
   Markdown code fence around it, and a reasoning model's leading ``<think>...</think>``
   block, are tolerated); anything else violates the schema. A
   violation is answered at most ``corrections`` times with a correction that states the
   rejection and the permitted tool names, never the answer; a further violation is a
   model failure (:class:`ModelFailure`, an ``RpcError``, so a policy that needed the
   decision blocks). A decision is never guessed from a malformed response.
5. A decision's parents are the exact records given to the call; the model is never
   asked what it depended on.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from protocols.errors import RpcError

ROLES = ("planner", "executor", "replan", "auditor")
FAMILY_TOOLS = {"reservation": "book_room", "fulfillment": "ship_from",
                "deployment": "deploy_to"}
CONFIRM = "confirm"
SYSTEM_TEMPLATE = (
    "You are the {role} agent of a {family} workflow in a team of agents. {duty} "
    "Answer with exactly one JSON object of the form "
    '{{"tool": NAME, "arguments": {{...}}}} and nothing else; the tools you may call '
    "and their arguments are listed in the tool schema below.")
DUTIES = {
    "planner": "Read the requirement and decide which action the workflow should take.",
    "executor": "You inherited a plan from the planner. Take the workflow's action for "
                "the requirement you hold.",
    "replan": "The requirement changed after the plan was made. Decide the action again "
              "from the current requirement.",
    "auditor": "Review the action the executor took against the requirement you hold: "
               "confirm it, or take the action the requirement calls for.",
}


class DecisionError(ValueError):
    """A response is not a decision the schema permits; the message says why."""


class ModelFailure(RpcError):
    """A role call produced no acceptable decision (transport failures after every retry,
    or schema violations after every correction): the decision is missing."""


class EndpointUnavailable(ModelFailure):
    """No answer at all from the model endpoint after every retry (refused, dropped or
    timed-out connections, 429/5xx): the server is gone or overloaded. An infrastructure
    failure of the episode, not a decision the model failed to make."""


# --- task documents (rule 1) -----------------------------------------------------------


def task_document(content: bytes) -> dict[str, Any]:
    """The task a requirement record holds (its content as JSON)."""
    try:
        doc = json.loads(content)
    except (UnicodeDecodeError, ValueError) as exc:
        raise DecisionError(f"requirement: not a task document ({exc})") from None
    if not (isinstance(doc, dict) and isinstance(doc.get("need"), dict)
            and isinstance(doc.get("candidates"), list) and isinstance(doc.get("family"), str)):
        raise DecisionError("requirement: not a task document (family, need, candidates)")
    return doc


def satisfying_option(doc: Mapping[str, Any]) -> str | None:
    """The candidate the task's need selects (the correct action's option), if any."""
    need = dict(doc.get("need") or {})
    for candidate in doc.get("candidates") or []:
        if isinstance(candidate, dict) and all(candidate.get(k) == v for k, v in need.items()):
            return str(candidate.get("id"))
    return None


def model_view(doc: Mapping[str, Any]) -> dict[str, Any]:
    """What of a task document a model sees (rule 2): the request, need and candidates."""
    return {"request": doc.get("request", ""), "need": doc.get("need", {}),
            "candidates": doc.get("candidates", [])}


# --- prompts and schemas (rules 2 and 3) ---------------------------------------------------


@dataclass(frozen=True)
class RolePrompt:
    """One role call as sent: the chat messages and the schema its answer must meet."""

    role: str
    family: str
    messages: tuple[dict[str, str], ...]
    schema: dict[str, Any]

    @property
    def digest(self) -> str:
        """BLAKE2b-128 of the canonical messages (what recorded decisions are keyed by)."""
        return prompt_digest(self.messages)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def prompt_digest(messages: Sequence[Mapping[str, str]]) -> str:
    text = canonical_json([dict(m) for m in messages]).encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def tool_schema(role: str, family: str, options: Sequence[str]) -> dict[str, Any]:
    """The JSON schema of a role's decision: every permitted tool and argument."""
    tool = FAMILY_TOOLS[family]
    act = {"type": "object", "additionalProperties": False, "required": ["tool", "arguments"],
           "properties": {"tool": {"const": tool},
                          "arguments": {"type": "object", "additionalProperties": False,
                                        "required": ["option"],
                                        "properties": {"option": {"enum": sorted(options)}}}}}
    if role != "auditor":
        return act
    confirm = {"type": "object", "additionalProperties": False,
               "required": ["tool", "arguments"],
               "properties": {"tool": {"const": CONFIRM},
                              "arguments": {"type": "object", "additionalProperties": False,
                                            "properties": {}}}}
    return {"oneOf": [confirm, act]}


def build_prompt(role: str, family: str, *, requirement: Mapping[str, Any],
                 action: str, plan: Mapping[str, Any] | None = None,
                 primary: Mapping[str, Any] | None = None,
                 extra_options: Sequence[str] = ()) -> RolePrompt:
    """The messages of one role call (rules 2 and 3)."""
    if role not in ROLES:
        raise ValueError(f"role: {role!r} not one of {', '.join(ROLES)}")
    if family not in FAMILY_TOOLS:
        raise ValueError(f"family: {family!r} not one of {', '.join(FAMILY_TOOLS)}")
    options = {str(c.get("id")) for c in requirement.get("candidates", [])
               if isinstance(c, dict)} | set(extra_options)
    schema = tool_schema(role, family, sorted(options))
    content: dict[str, Any] = {"role": "executor" if role == "replan" else role,
                               "workflow": family, "action": action,
                               "requirement": model_view(requirement)}
    if plan is not None:
        content["inherited_plan"] = dict(plan)
    if primary is not None:
        content["executor_action"] = dict(primary)
    system = SYSTEM_TEMPLATE.format(role=content["role"], family=family, duty=DUTIES[role])
    user = canonical_json(content) + "\nTool schema: " + canonical_json(schema)
    return RolePrompt(role, family, ({"role": "system", "content": system},
                                     {"role": "user", "content": user}), schema)


def correction(prompt: RolePrompt, response: str, reason: str) -> tuple[dict[str, str], ...]:
    """The messages of a retry after a schema violation (rule 4): the reason and the
    permitted tool names, never the answer."""
    tools = ", ".join(sorted(_tool_names(prompt.schema)))
    return (*prompt.messages, {"role": "assistant", "content": response},
            {"role": "user", "content": f"Your answer was rejected: {reason}. Answer with "
                                        f"exactly one JSON object calling one of: {tools}."})


def user_content(messages: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """The role content of a prompt's first user message (what a server decides from)."""
    for message in messages:
        if message.get("role") == "user":
            text = str(message.get("content", ""))
            try:
                obj = json.loads(text.split("\nTool schema: ", 1)[0])
            except ValueError:
                break
            if isinstance(obj, dict):
                return obj
            break
    raise DecisionError("prompt: no role content in the first user message")


# --- decisions (rule 4) -------------------------------------------------------------------

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_THINK = re.compile(r"^<think>.*?</think>\s*", re.DOTALL)


def parse_decision(text: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The decision in ``text`` if the schema permits it, else :class:`DecisionError`."""
    body = _THINK.sub("", text.strip(), count=1)
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise DecisionError(f"not one JSON object ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(obj, dict):
        raise DecisionError("not a JSON object")
    variants = schema.get("oneOf", [schema])
    reasons = []
    for variant in variants:
        try:
            _check(obj, variant)
            return obj
        except DecisionError as exc:
            reasons.append(str(exc))
    raise DecisionError(min(reasons, key=len) if len(variants) == 1 else "; or ".join(reasons))


def _check(obj: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    props: Mapping[str, Any] = schema["properties"]
    extra = sorted(set(obj) - set(props))
    if extra:
        raise DecisionError(f"unexpected field {extra[0]!r}")
    for name in schema.get("required", []):
        if name not in obj:
            raise DecisionError(f"missing field {name!r}")
    tool = props["tool"]["const"]
    if obj["tool"] != tool:
        raise DecisionError(f"tool {str(obj['tool'])[:60]!r} is not {tool!r}")
    arguments = obj["arguments"]
    allowed: Mapping[str, Any] = props["arguments"]["properties"]
    if not isinstance(arguments, dict):
        raise DecisionError("arguments is not an object")
    extra = sorted(set(arguments) - set(allowed))
    if extra:
        raise DecisionError(f"unexpected argument {extra[0]!r}")
    for name in props["arguments"].get("required", []):
        if name not in arguments:
            raise DecisionError(f"missing argument {name!r}")
    for name, rule in allowed.items():
        if name in arguments and arguments[name] not in rule["enum"]:
            raise DecisionError(f"{name} {str(arguments[name])[:60]!r} is not one of the "
                                "permitted identifiers")


def _tool_names(schema: Mapping[str, Any]) -> list[str]:
    return [v["properties"]["tool"]["const"] for v in schema.get("oneOf", [schema])]


def decision_option(decision: Mapping[str, Any] | None) -> str | None:
    """The option a decision acts on (None for a confirmation or no decision)."""
    if not decision or decision.get("tool") == CONFIRM:
        return None
    option = dict(decision.get("arguments") or {}).get("option")
    return None if option is None else str(option)
