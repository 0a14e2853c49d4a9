"""Role prompts, tool schemas and decision parsing (protocols/roles.py), pure."""

from __future__ import annotations

import json

import pytest

from protocols.roles import (
    DecisionError,
    build_prompt,
    correction,
    decision_option,
    parse_decision,
    satisfying_option,
    task_document,
    user_content,
)
from testbed.campaign.live import correct_option, task_content

DOC = task_document(task_content(11, "fulfillment-04", 0))
REVISED = task_document(task_content(11, "fulfillment-04", 1))


def test_the_prompt_holds_role_content_only_and_a_schema_of_every_permitted_option() -> None:
    prompt = build_prompt("planner", "fulfillment", requirement=DOC, action="act000")
    content = user_content(prompt.messages)
    assert content["role"] == "planner"
    assert content["workflow"] == "fulfillment"
    assert set(content["requirement"]) == {"request", "need", "candidates"}
    text = json.dumps(list(prompt.messages))
    assert "version" not in text
    assert "task" not in content
    options = prompt.schema["properties"]["arguments"]["properties"]["option"]["enum"]
    assert sorted(options) == sorted(c["id"] for c in DOC["candidates"])
    again = build_prompt("planner", "fulfillment", requirement=DOC, action="act000")
    assert again.digest == prompt.digest  # stable: recorded decisions are keyed by it


def test_two_task_states_select_different_candidates() -> None:
    assert satisfying_option(DOC) == correct_option(task_content(11, "fulfillment-04", 0))
    assert satisfying_option(DOC) != satisfying_option(REVISED)
    assert correct_option(task_content(11, "fulfillment-04", 2)) == satisfying_option(DOC)


def test_a_valid_decision_parses_also_inside_a_code_fence() -> None:
    prompt = build_prompt("executor", "fulfillment", requirement=DOC, action="act000",
                          plan={"tool": "ship_from", "arguments": {"option": "x"}},
                          extra_options=["x"])
    option = satisfying_option(DOC)
    text = json.dumps({"tool": "ship_from", "arguments": {"option": option}})
    assert decision_option(parse_decision(text, prompt.schema)) == option
    assert parse_decision(f"```json\n{text}\n```", prompt.schema)["arguments"]["option"] \
        == option
    assert decision_option(parse_decision(
        '{"tool": "ship_from", "arguments": {"option": "x"}}', prompt.schema)) == "x"
    thought = f"<think>The need is a region; check each candidate.</think>\n{text}"
    assert decision_option(parse_decision(thought, prompt.schema)) == option
    with pytest.raises(DecisionError):  # reasoning alone is no decision
        parse_decision("<think>Thinking about it.</think>", prompt.schema)


@pytest.mark.parametrize(("text", "reason"), [
    ('{"tool": "ship_from", "arguments": {"option": ', "not one JSON object"),
    ("I would ship from the north warehouse.", "not one JSON object"),
    ("[1, 2]", "not a JSON object"),
    ('{"tool": "deploy_to", "arguments": {"option": "wh-10"}}', "is not 'ship_from'"),
    ('{"tool": "ship_from", "arguments": {"option": "wh-00"}}', "permitted identifiers"),
    ('{"tool": "ship_from", "arguments": {}}', "missing argument 'option'"),
    ('{"tool": "ship_from"}', "missing field 'arguments'"),
    ('{"tool": "ship_from", "arguments": {"option": "X"}, "why": "because"}',
     "unexpected field 'why'"),
    ('{"tool": "ship_from", "arguments": {"option": "X", "qty": 2}}',
     "unexpected argument 'qty'"),
    ('{"tool": "ship_from", "arguments": "X"}', "arguments is not an object"),
])
def test_a_response_the_schema_does_not_permit_is_never_a_decision(text: str,
                                                                    reason: str) -> None:
    prompt = build_prompt("planner", "fulfillment", requirement=DOC, action="act000")
    text = text.replace('"X"', json.dumps(satisfying_option(DOC)))
    with pytest.raises(DecisionError, match=reason):
        parse_decision(text, prompt.schema)


def test_the_auditor_may_confirm_or_act_but_confirm_takes_no_arguments() -> None:
    prompt = build_prompt("auditor", "fulfillment", requirement=DOC, action="act000",
                          primary={"tool": "ship_from", "arguments": {"option": "wh-1"}})
    assert decision_option(parse_decision('{"tool": "confirm", "arguments": {}}',
                                          prompt.schema)) is None
    option = satisfying_option(DOC)
    assert decision_option(parse_decision(json.dumps(
        {"tool": "ship_from", "arguments": {"option": option}}), prompt.schema)) == option
    with pytest.raises(DecisionError):
        parse_decision('{"tool": "confirm", "arguments": {"option": "wh-1"}}', prompt.schema)


def test_a_correction_states_the_reason_and_the_tools_never_the_answer() -> None:
    prompt = build_prompt("planner", "fulfillment", requirement=DOC, action="act000")
    messages = correction(prompt, "nonsense", "not one JSON object")
    assert messages[:2] == prompt.messages
    assert messages[2]["content"] == "nonsense"
    last = messages[-1]["content"]
    assert "not one JSON object" in last
    assert "ship_from" in last
    assert str(satisfying_option(DOC)) not in last
