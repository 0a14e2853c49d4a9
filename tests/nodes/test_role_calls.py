"""A node's role calls against the stand-in server (a real process on a real socket):
bounded retries on transport failures, bounded corrections on schema violations, and
every failure counted as a model failure, never accepted as a decision; an endpoint that
gave no answer at all (refused, dropped, 429/5xx, timed out) is ``EndpointUnavailable``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import urlsplit

import pytest

from nodes.model_client import Endpoint, ModelClient
from nodes.role_calls import CallEntry, RoleCaller
from protocols.roles import (
    EndpointUnavailable,
    ModelFailure,
    build_prompt,
    satisfying_option,
    task_document,
)
from testbed.campaign.live import task_content
from testbed.tools.stand_in_process import open_stand_in

DOC = task_document(task_content(9, "deployment-03", 1))
PARENT = bytes(range(32))


def endpoint(url: str, **settings: object) -> Endpoint:
    parts = urlsplit(url)
    return Endpoint.from_args({"base_url": url, "model": "planfence-stand-in",
                               "connect": ["tcp", parts.hostname, parts.port],
                               "max_retries": 2, "corrections": 1, "timeout_s": 5,
                               **settings})


async def call(server_args: Sequence[str], **settings: object
               ) -> tuple[dict[str, object] | None, CallEntry, str]:
    prompt = build_prompt("planner", "deployment", requirement=DOC, action="act000")
    async with open_stand_in(*server_args) as url:
        client = ModelClient(endpoint(url, **settings))
        caller = RoleCaller(client, "a1")
        try:
            decision, entry = await caller.decide(prompt, "act000", [PARENT])
            return decision, entry, ""
        except ModelFailure as exc:
            (entry,) = caller.log
            return None, entry, str(exc)
        finally:
            await client.aclose()


async def test_a_role_call_records_what_it_was_given_and_what_it_decided() -> None:
    decision, entry, failure = await call([])
    assert not failure
    assert decision == entry.decision
    assert decision["arguments"]["option"] == satisfying_option(DOC)  # type: ignore[index]
    assert entry.parents == [PARENT.hex()]
    assert entry.role == "planner"
    assert entry.completions == 1
    assert entry.http_attempts == 1
    assert entry.corrections == 0
    assert entry.prompt_tokens > 0
    assert entry.completion_tokens > 0
    assert entry.ended_t_ns > entry.started_t_ns
    assert entry.latency_ms > 0
    assert len(entry.prompt_digest) == 32
    assert len(entry.responses) == 1


async def test_a_malformed_answer_is_corrected_once_then_a_model_failure() -> None:
    decision, entry, failure = await call(["--fault", "malformed"])
    assert decision is None
    assert entry.decision is None
    assert "schema violation after 1 correction" in failure
    assert entry.error == failure
    assert entry.corrections == 1
    assert entry.completions == 2
    assert entry.responses == ['{"tool": "', '{"tool": "']
    assert "gave no answer" not in failure  # the model's failure, not the endpoint's


async def test_a_malformed_first_answer_recovers_after_the_correction() -> None:
    decision, entry, failure = await call(["--fault", "malformed", "--fault-first", "1"])
    assert not failure
    assert entry.corrections == 1
    assert entry.completions == 2
    assert decision["arguments"]["option"] == satisfying_option(DOC)  # type: ignore[index]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["500", "429", "drop"])
async def test_failing_answers_are_retried_then_counted(fault: str) -> None:
    decision, entry, failure = await call(["--fault", fault])
    assert decision is None
    assert entry.decision is None
    assert entry.completions == 0
    assert entry.http_attempts == 3
    assert "gave no answer after 3 attempts" in failure  # the endpoint's, named
    recovered, again, failure = await call(["--fault", fault, "--fault-first", "2"])
    assert not failure
    assert again.http_attempts == 3
    assert recovered is not None


@pytest.mark.slow
async def test_a_slow_answer_times_out_and_is_counted() -> None:
    decision, entry, failure = await call(["--fault", "slow", "--slow-s", "20"],
                                          timeout_s=0.5, max_retries=1)
    assert decision is None
    assert "timeout after 0.5 s" in failure
    assert entry.http_attempts == 2
    assert entry.latency_ms < 10_000


async def test_a_server_that_is_gone_is_an_unavailable_endpoint() -> None:
    async with open_stand_in() as url:
        pass  # stopped: nothing listens there any more
    client = ModelClient(endpoint(url, max_retries=1))
    caller = RoleCaller(client, "a1")
    prompt = build_prompt("planner", "deployment", requirement=DOC, action="act000")
    with pytest.raises(EndpointUnavailable,
                       match=rf"^planner: {re.escape(url)} gave no answer after 2 attempts; "
                             "last: ConnectError"):
        await caller.decide(prompt, "act000", [])
    await client.aclose()
    assert caller.log[0].error
    assert caller.log[0].decision is None
