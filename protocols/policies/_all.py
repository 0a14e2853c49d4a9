"""Imports every policy module so that each registers itself."""

from protocols.policies import (  # noqa: F401
    adaptive,
    all_replica,
    batched_all_key,
    centralized_lineage,
    local_replica,
    majority_replica,
    metadata_sync,
    owner_head_freshness,
    per_key_all_key,
    planfence,
    planfence_grouped,
)
