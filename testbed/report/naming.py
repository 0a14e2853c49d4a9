"""Policy display names, categories and row order used by every table and figure.

Names and categories come from the policy registry (``protocols.policies``: each
policy's ``title`` and ``category``), so a newly registered policy is labelled without
touching this module. Categories follow the paper's Table 2: policies that check only
observation currency ("unsafe freshness"), metadata sync with a barrier interval K > 1
("delayed sync"), and every other policy ("derivation-current"). A name the registry
does not know (a run made with a plugin policy) is kept as is and treated as
derivation-current, so it never breaks a report.

Unsafe policies (any invalid action in the run being reported) carry :data:`UNSAFE_MARK`
after their name wherever a table or figure names them: ``build_report`` sets the run's
unsafe policies with :func:`marking_unsafe` (testbed/report/unsafe.py finds them), so no
builder has to remember to mark them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from protocols.policies import Policy, describe_policy

UNSAFE = "Unsafe freshness"
DELAYED = "Delayed sync (unsafe)"
CURRENT = "Derivation-current"
STANDIN = "Native-validator stand-in"
BUDGETED = "Budgeted validation (unsafe)"
CATEGORY_ORDER = (UNSAFE, DELAYED, BUDGETED, CURRENT, STANDIN)

_LABELS = {
    Policy.UNSAFE_FRESHNESS: UNSAFE,
    Policy.DELAYED_SYNC: DELAYED,
    Policy.DERIVATION_CURRENT: CURRENT,
    Policy.NATIVE_STANDIN: STANDIN,
    Policy.BUDGETED: BUDGETED,
}

# Row order inside a category (unlisted names sort after these, alphabetically).
_ORDER = (
    "local_replica",
    "owner_head_freshness",
    "centralized_lineage",
    "centralized_lineage_own_local",
    "metadata_sync",
    "majority_replica",
    "all_replica",
    "per_key_all_key",
    "batched_all_key",
    "adaptive",
    "planfence_grouped",
    "planfence",
    "planfence_budget",
    "session_read_set",
    "inherited_version_set",
)

PRIMARY_THREE = ("metadata_sync", "centralized_lineage", "planfence")
RATE_FOUR = ("metadata_sync", "centralized_lineage", "batched_all_key", "planfence")
TABLE2_POLICIES = (
    "local_replica",
    "owner_head_freshness",
    "centralized_lineage",
    "centralized_lineage_own_local",
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


#: After an unsafe policy's name; every table and figure that shows one explains it.
UNSAFE_MARK = "⚠"
_UNSAFE: ContextVar[frozenset[str]] = ContextVar("unsafe_policies", default=frozenset())


@contextmanager
def marking_unsafe(policies: Iterable[str]) -> Iterator[None]:
    """Within the block, :func:`display_name` marks these policies as unsafe."""
    token = _UNSAFE.set(frozenset(policies))
    try:
        yield
    finally:
        _UNSAFE.reset(token)


def is_marked_unsafe(policy: str) -> bool:
    return policy in _UNSAFE.get()


def display_name(policy: str) -> str:
    try:
        title = describe_policy(policy).title
    except ValueError:  # not registered in this process
        title = policy
    return f"{title} {UNSAFE_MARK}" if policy in _UNSAFE.get() else title


def category(policy: str) -> str:
    try:
        return _LABELS[describe_policy(policy).category]
    except ValueError:
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
