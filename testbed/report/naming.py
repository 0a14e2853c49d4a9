"""Policy display names, categories and row order used by every table and figure.

Categories follow the paper's Table 2: policies that check only observation currency
("unsafe freshness"), metadata sync with a barrier interval K > 1 ("delayed sync"),
and every other policy ("derivation-current"). Unknown policy names are kept and
treated as derivation-current so a new policy never breaks a report.
"""

from __future__ import annotations

from collections.abc import Iterable

UNSAFE = "Unsafe freshness"
DELAYED = "Delayed sync (unsafe)"
CURRENT = "Derivation-current"
CATEGORY_ORDER = (UNSAFE, DELAYED, CURRENT)

_NAMES = {
    "local_replica": "Local replica",
    "owner_head_freshness": "Owner-head freshness",
    "centralized_lineage": "Centralized lineage",
    "metadata_sync": "Metadata sync, K=1",
    "per_key_all_key": "Per-key all-key validation",
    "batched_all_key": "Batched all-key validation",
    "all_replica": "All-replica dependency validation",
    "majority_replica": "Majority-replica validation",
    "planfence": "PlanFence",
    "planfence_grouped": "PlanFence, owner-grouped",
    "adaptive": "Adaptive (rho rule)",
}

# Row order inside a category (unlisted names sort after these, alphabetically).
_ORDER = (
    "local_replica",
    "owner_head_freshness",
    "centralized_lineage",
    "metadata_sync",
    "majority_replica",
    "all_replica",
    "per_key_all_key",
    "batched_all_key",
    "adaptive",
    "planfence_grouped",
    "planfence",
)

PRIMARY_THREE = ("metadata_sync", "centralized_lineage", "planfence")
RATE_FOUR = ("metadata_sync", "centralized_lineage", "batched_all_key", "planfence")
TABLE2_POLICIES = (
    "local_replica",
    "owner_head_freshness",
    "centralized_lineage",
    "metadata_sync",
    "batched_all_key",
    "planfence",
)


def sync_interval(policy: str) -> int | None:
    """Barrier interval K of a metadata-sync policy name, None for other policies."""
    if policy == "metadata_sync":
        return 1
    head, sep, tail = policy.partition("/")
    if head == "metadata_sync" and sep and tail.isdigit():
        return int(tail)
    return None


def display_name(policy: str) -> str:
    k = sync_interval(policy)
    if k is not None:
        return f"Metadata sync, K={k}"
    return _NAMES.get(policy, policy)


def category(policy: str) -> str:
    if policy in ("local_replica", "owner_head_freshness"):
        return UNSAFE
    k = sync_interval(policy)
    if k is not None and k > 1:
        return DELAYED
    return CURRENT


def sort_key(policy: str) -> tuple[int, int, int, str]:
    """Category first, then the paper's row order, then K, then the name."""
    k = sync_interval(policy)
    base = "metadata_sync" if k is not None else policy
    rank = _ORDER.index(base) if base in _ORDER else len(_ORDER)
    return (CATEGORY_ORDER.index(category(policy)), rank, k or 0, policy)


def ordered(policies: Iterable[object]) -> list[str]:
    """Distinct policy names in report order."""
    names = {str(p) for p in policies}
    return sorted(names, key=sort_key)
