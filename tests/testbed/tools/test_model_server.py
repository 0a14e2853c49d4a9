"""The stand-in model server as users run it: a child process on a real socket
(``testbed model-server``), asked over HTTP; and its seeded rules, pure."""

from __future__ import annotations

import json
import statistics

import httpx
import pytest

from protocols.roles import build_prompt, satisfying_option, task_document
from testbed.campaign.live import task_content
from testbed.tools.stand_in import (
    CALIBRATED_MEDIAN_S,
    CALIBRATED_Q1_S,
    CALIBRATED_Q3_S,
    StandInRules,
)
from testbed.tools.stand_in_process import open_stand_in

MODEL = "planfence-stand-in"
V0 = task_document(task_content(5, "reservation-02", 0))
V1 = task_document(task_content(5, "reservation-02", 1))


def body(prompt_messages: object, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": list(prompt_messages),  # type: ignore[call-overload]
            **extra}


async def test_it_serves_its_model_says_what_it_is_and_decides_from_its_inputs() -> None:
    async with open_stand_in() as url, httpx.AsyncClient(timeout=10) as client:
        models = (await client.get(f"{url}/models")).json()
        assert [m["id"] for m in models["data"]] == [MODEL]
        root = url.removesuffix("/v1")
        version = (await client.get(f"{root}/version")).json()
        assert version["stand_in"] is True
        assert "not a model" in version["note"]
        answers = {}
        for name, doc in (("v0", V0), ("v1", V1)):
            prompt = build_prompt("planner", "reservation", requirement=doc, action="act000")
            reply = await client.post(f"{url}/chat/completions", json=body(prompt.messages))
            assert reply.status_code == 200
            data = reply.json()
            assert data["usage"]["completion_tokens"] > 0
            answers[name] = json.loads(data["choices"][0]["message"]["content"])
        # a stale input gives a stale decision, a fresh one a fresh decision
        assert answers["v0"]["arguments"]["option"] == satisfying_option(V0)
        assert answers["v1"]["arguments"]["option"] == satisfying_option(V1)
        primary = {"tool": "book_room", "arguments": {"option": satisfying_option(V1)}}
        for doc, expected in ((V1, "confirm"), (V0, "book_room")):
            prompt = build_prompt("auditor", "reservation", requirement=doc, action="act000",
                                  primary=primary)
            reply = await client.post(f"{url}/chat/completions", json=body(prompt.messages))
            assert json.loads(reply.json()["choices"][0]["message"]["content"])["tool"] \
                == expected
        wrong = await client.post(f"{url}/chat/completions",
                                  json={**body(prompt.messages), "model": "gpt-x"})
        assert wrong.status_code == 404
        streamed = await client.post(f"{url}/chat/completions",
                                     json=body(prompt.messages, stream=True))
        assert streamed.status_code == 400
        garbage = await client.post(f"{url}/chat/completions", content=b"{not json")
        assert garbage.status_code == 400


@pytest.mark.parametrize(("fault", "check"), [
    ("429", lambda r: r.status_code == 429 and r.headers["retry-after"] == "0"),
    ("500", lambda r: r.status_code == 500),
    ("malformed", lambda r: r.status_code == 200 and r.json()["choices"][0]["message"][
        "content"] == '{"tool": "'),
])
async def test_fault_modes_answer_as_named(fault: str, check: object) -> None:
    prompt = build_prompt("planner", "reservation", requirement=V0, action="act000")
    async with open_stand_in("--fault", fault, "--fault-first", "1") as url, \
            httpx.AsyncClient(timeout=10) as client:
        first = await client.post(f"{url}/chat/completions", json=body(prompt.messages))
        assert check(first)  # type: ignore[operator]
        second = await client.post(f"{url}/chat/completions", json=body(prompt.messages))
        assert second.status_code == 200  # only the first attempt of each prompt
        assert json.loads(second.json()["choices"][0]["message"]["content"])


async def test_dropped_and_slow_answers() -> None:
    prompt = build_prompt("planner", "reservation", requirement=V0, action="act000")
    async with open_stand_in("--fault", "drop") as url, httpx.AsyncClient(timeout=10) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            await c.post(f"{url}/chat/completions", json=body(prompt.messages))
    async with open_stand_in("--fault", "slow", "--slow-s", "5") as url, \
            httpx.AsyncClient(timeout=0.5) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post(f"{url}/chat/completions", json=body(prompt.messages))


def test_the_calibrated_latency_has_the_papers_median_and_quartiles() -> None:
    rules = StandInRules(seed=3, latency="calibrated")
    samples = [rules.latency_s(f"prompt-{i}", 0) for i in range(4000)]
    q1, median, q3 = statistics.quantiles(samples, n=4)
    assert median == pytest.approx(CALIBRATED_MEDIAN_S, rel=0.06)
    assert q1 == pytest.approx(CALIBRATED_Q1_S, rel=0.06)
    assert q3 == pytest.approx(CALIBRATED_Q3_S, rel=0.08)
    assert max(samples) <= 15.0
    assert samples == [rules.latency_s(f"prompt-{i}", 0) for i in range(4000)]  # seeded
    assert StandInRules(latency="matched").latency_s("x", 0) == 0.6
    with pytest.raises(ValueError, match="latency"):
        StandInRules(latency="fast")
