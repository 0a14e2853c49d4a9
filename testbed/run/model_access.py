"""A live campaign's access to its model server: the probe, the relays, the agents' setting.

Rules this module obeys:

1. Before any episode, :func:`probe_model` asks the endpoint what it serves
   (``GET {base_url}/models``) and which server it is (``/version`` as vLLM and the
   stand-in answer, ``/api/version`` as Ollama does, ``/props`` as llama.cpp's server
   does, ``/openapi.json`` as llama-cpp-python's server does). Unreachable is a
   one-line :class:`ModelUnreachable` (a HostError: this host cannot reach what the
   campaign names); a model the server does not list, or a refused key, is a one-line
   UserError naming the field. The probe's record (model, served models, reported
   version, whether it is the testbed's stand-in, the sampling settings sent, and the
   model's identity by file digest where the server reports one, as ``testbed
   model-server --model smollm2`` does) goes to the manifest; the API key never does.
2. Every group of a live campaign gets a :class:`ModelRelay` with one listener per agent
   where the placement puts the server (``testbed.run.relay`` rule 3), and every agent
   is told the endpoint with its own listener (``configure_model``). The topology has a
   central host whenever the placement is ``central``, whether the policy needs one.
3. Everything opened here is closed when the group closes (the relay's sockets, the
   Unix socket directory, recorded in the run's ledger before it is made).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import trio

from testbed.campaign.endpoint import ModelSettings
from testbed.campaign.live import LIVE_KIND
from testbed.campaign.model import Campaign
from testbed.errors import HostError, UserError
from testbed.host.kernel import socket_in_netns
from testbed.host.ledger import Ledger
from testbed.net.topology import Topology
from testbed.run.relay import ModelRelay
from testbed.run.team import Team

if TYPE_CHECKING:  # imported when a live campaign probes (not by every run)
    import httpx

PROBE_TIMEOUT_S = 10.0
STAND_IN = "planfence-testbed stand-in"
LLAMA_CPP_PYTHON = "llama-cpp-python"
SAMPLING = ("temperature", "top_p", "max_tokens", "seed", "response_format")


class ModelUnreachable(HostError):
    """The campaign's model endpoint does not answer from this host."""


def needs_central_host(campaign: Campaign) -> bool:
    """Whether every topology of the campaign needs a central host (rule 2)."""
    return campaign.kind == LIVE_KIND and campaign.model is not None \
        and campaign.model.placement == "central"


def _headers(settings: ModelSettings) -> dict[str, str]:
    key = os.environ.get(settings.api_key_env, "") if settings.api_key_env else ""
    return {"Authorization": f"Bearer {key}"} if key else {}


async def probe_model(campaign: Campaign) -> dict[str, Any] | None:
    """The manifest's ``model`` record of a live campaign (rule 1); None for others."""
    if campaign.kind != LIVE_KIND or campaign.model is None:
        return None
    return await probe_endpoint(campaign.model)


async def probe_endpoint(settings: ModelSettings) -> dict[str, Any]:
    import httpx

    url = settings.base_url
    parts = urlsplit(url)
    root = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    timeout = httpx.Timeout(min(settings.timeout_s, PROBE_TIMEOUT_S))
    async with httpx.AsyncClient(timeout=timeout, headers=_headers(settings)) as client:
        try:
            listed = await client.get(f"{url}/models")
        except httpx.TransportError as exc:
            raise ModelUnreachable(
                f"model.base_url: {url} is unreachable ({type(exc).__name__}: {exc}); start "
                "the model server (the stand-in: testbed model-server) or set [model] "
                "base_url") from None
        if listed.status_code in (401, 403):
            env = settings.api_key_env or "(none set)"
            raise UserError(f"model.api_key_env: {url} refused the request (HTTP "
                            f"{listed.status_code}); put the key in the environment "
                            f"variable {env}")
        served = _served(listed)
        if served is not None and settings.model not in served:
            raise UserError(f"model.model: {settings.model!r} is not served by {url}; "
                            f"served: {', '.join(served) or 'none'}")
        version = await _server_version(client, root)
    server = str(version.get("server") or listed.headers.get("server") or "")
    return {"base_url": url, "model": settings.model, "served_models": served,
            "server_version": version, "server": server,
            "stand_in": bool(version.get("stand_in")) or STAND_IN in server,
            "placement": settings.placement, "api_key_env": settings.api_key_env,
            "sampling": {k: getattr(settings, k) for k in SAMPLING},
            "identity": _identity(version)}


def _identity(version: dict[str, Any]) -> dict[str, Any] | None:
    """The served model by digest, where the server says it (``testbed model-server
    --model smollm2``'s ``/version``); None where it does not."""
    gguf = version.get("gguf")
    if not isinstance(gguf, dict):
        return None
    return {"file": gguf.get("file"), "sha256": gguf.get("sha256"),
            "quantization": gguf.get("quantization"), "server": version.get("server"),
            "server_version": version.get("version"), "n_threads": version.get("n_threads"),
            "n_ctx": version.get("n_ctx"), "server_seed": version.get("seed"),
            "chat_format": version.get("chat_format")}


def _served(response: httpx.Response) -> list[str] | None:
    if response.status_code != 200:
        return None
    try:
        data = response.json()["data"]
        return [str(m["id"]) for m in data]
    except (ValueError, KeyError, TypeError):
        return None


async def _server_version(client: httpx.AsyncClient, root: str) -> dict[str, Any]:
    """What the server says it is (the first of the known endpoints that answers)."""
    import httpx

    for path, pick in (("/version", None), ("/api/version", None),
                       ("/props", ("build_info", "model_path", "total_slots")),
                       ("/openapi.json", ("info",))):
        try:
            answer = await client.get(root + path)
        except httpx.TransportError:
            continue
        if answer.status_code != 200:
            continue
        try:
            data = answer.json()
        except ValueError:
            continue
        if isinstance(data, dict):
            kept = data if pick is None else {k: data[k] for k in pick if k in data}
            if path == "/openapi.json":  # llama-cpp-python's server started by hand
                info = kept.get("info")
                if not isinstance(info, dict) or "llama" not in str(info.get("title", "")):
                    continue
                kept = {"server": LLAMA_CPP_PYTHON, "version": str(info.get("version", ""))}
            return {"endpoint": path, **kept}
    return {}


class ModelAccess:
    """A group's relay and what its agents were told (rule 2)."""

    def __init__(self, relay: ModelRelay, endpoints: dict[str, dict[str, Any]]) -> None:
        self.relay = relay
        self.endpoints = endpoints

    def take_bytes(self) -> int:
        """Bytes of every agent's role calls since the last call."""
        return sum(self.relay.take_bytes().values())


@asynccontextmanager
async def open_model_access(campaign: Campaign, topo: Topology, team: Team, *,
                            ledger: Ledger | None = None) -> AsyncIterator[ModelAccess | None]:
    """Relays and ``configure_model`` for a live campaign's group (rules 2 and 3)."""
    settings = campaign.model
    if campaign.kind != LIVE_KIND or settings is None:
        yield None
        return
    relay = ModelRelay(settings.upstream)
    sock_dir = (ledger.new_tmpdir("pft-model") if ledger is not None
                else Path(tempfile.mkdtemp(prefix="pft-model-")))
    try:
        async with trio.open_nursery() as nursery:
            endpoints: dict[str, dict[str, Any]] = {}
            for agent in team.agents:
                sock, connect = await _listener(settings.placement, topo, agent, sock_dir)
                await nursery.start(relay.serve, sock, agent)
                endpoints[agent] = {**settings.to_data(), "connect": connect}
            for agent, endpoint in endpoints.items():
                await team.call(agent, "configure_model", endpoint=endpoint)
            try:
                yield ModelAccess(relay, endpoints)
            finally:
                nursery.cancel_scope.cancel()
    finally:
        if ledger is not None:
            ledger.remove_tmpdir(sock_dir)
        else:
            shutil.rmtree(sock_dir, ignore_errors=True)


async def _listener(placement: str, topo: Topology, agent: str, sock_dir: Path
                    ) -> tuple[socket.socket, list[Any]]:
    if placement == "beside":
        path = str(sock_dir / f"{agent}.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(16)
        return sock, ["uds", path, 0]
    central = topo.hosts["central"]
    sock = await trio.to_thread.run_sync(socket_in_netns, central.netns)
    try:
        sock.bind((central.address, 0))
        sock.listen(16)
    except OSError:
        sock.close()
        raise
    return sock, ["tcp", central.address, sock.getsockname()[1]]
