"""One vocabulary: registering a profile or a policy is enough for a campaign file to
name it, for its cells to get the right topology, and for the report to label it.

These are the two recipes of docs/architecture.md, followed to the letter.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pytest

from protocols.env import ActionOutcome, ActionRequest, PolicyEnv
from protocols.policies import Policy, describe_policy, policy_names, register
from protocols.policies.registry import unregister
from testbed.campaign import vocabulary
from testbed.campaign.model import CampaignError
from testbed.campaign.parse import parse_campaign
from testbed.links.profiles import LinkSpec, get_profile, register_profile, unregister_profile
from testbed.report import naming, slicing


class _CentralProbe(Policy):
    """A policy that needs the central directory and only checks freshness."""

    name = "test_vocab_central"
    display_name = "Vocabulary probe"
    needs_central = True
    derivation_current = False
    params = (3,)

    async def validate(self, env: PolicyEnv, request: ActionRequest) -> ActionOutcome:
        return ActionOutcome(True, 0, request.roots, {})


@pytest.fixture
def registered() -> Iterator[None]:
    register(_CentralProbe)
    register_profile("test_wired", LinkSpec(rate_kbit=100_000.0, delay_ms=1.0))
    try:
        yield
    finally:
        unregister(_CentralProbe.name)
        unregister_profile("test_wired")


def _campaign(policy: list[str], network: list[str]) -> dict[str, object]:
    return {"name": "v", "seed": 1, "templates": 1,
            "grid": {"policy": policy, "network": network}}


def test_unregistered_names_are_refused() -> None:
    with pytest.raises(CampaignError, match=r"grid.network: 'test_wired' is not allowed"):
        parse_campaign(_campaign(["planfence"], ["test_wired"]))
    with pytest.raises(CampaignError, match=r"grid.policy: 'test_vocab_central' is not"):
        parse_campaign(_campaign(["test_vocab_central"], ["loopback"]))


@pytest.mark.usefixtures("registered")
def test_a_registered_profile_is_a_network_campaigns_can_use() -> None:
    assert "test_wired" in vocabulary.network_names()
    cells = parse_campaign(_campaign(["planfence"], ["test_wired", "loopback"])).cells()
    assert [c.network for c in cells] == ["test_wired", "loopback"]
    profile = get_profile("test_wired")
    assert profile.link is not None
    assert profile.link.rate_kbit == 100_000.0
    assert profile.base_rtt_ms == 4.0
    frame = pd.DataFrame({"network": ["loopback", "test_wired", "att"]})
    assert slicing.networks(frame) == ["loopback", "att", "test_wired"]  # registry order


@pytest.mark.usefixtures("registered")
def test_a_registered_policy_is_allowed_grouped_and_labelled() -> None:
    assert "test_vocab_central" in policy_names()
    campaign = parse_campaign(_campaign(["test_vocab_central", "test_vocab_central/3",
                                         "planfence"], ["loopback"]))
    cells = campaign.cells()
    assert [c.needs_central for c in cells] == [True, True, False]
    assert [key.central for key, _ in campaign.groups()] == [True, False]
    with pytest.raises(CampaignError, match=r"test_vocab_central/K with K in 3"):
        parse_campaign(_campaign(["test_vocab_central/4"], ["loopback"]))
    assert naming.display_name("test_vocab_central") == "Vocabulary probe"
    assert naming.display_name("test_vocab_central/3") == "Vocabulary probe/3"
    assert naming.category("test_vocab_central") == naming.UNSAFE
    assert describe_policy("test_vocab_central").needs_central


def test_shipped_policies_carry_the_papers_labels() -> None:
    assert naming.display_name("metadata_sync") == "Metadata sync, K=1"
    assert naming.display_name("metadata_sync/4") == "Metadata sync, K=4"
    assert naming.category("metadata_sync/4") == naming.DELAYED
    assert naming.category("metadata_sync") == naming.CURRENT
    assert naming.category("owner_head_freshness") == naming.UNSAFE
    assert naming.display_name("planfence") == "PlanFence"
    assert describe_policy("centralized_lineage").needs_central
    assert describe_policy("metadata_sync/2").has_unit_end_hook
    assert not describe_policy("planfence").has_unit_end_hook


def test_settings_come_from_the_node() -> None:
    from nodes.store import DURABILITY_MODES
    from nodes.transport import CONNECTION_SETTINGS

    assert tuple(CONNECTION_SETTINGS) == vocabulary.CONNECTIONS
    assert tuple(DURABILITY_MODES) == vocabulary.DURABILITY
