"""Imports every policy module so that each registers itself."""

import protocols.policies.adaptive
import protocols.policies.all_replica
import protocols.policies.batched_all_key
import protocols.policies.centralized_lineage
import protocols.policies.inherited_version_set
import protocols.policies.local_replica
import protocols.policies.majority_replica
import protocols.policies.metadata_sync
import protocols.policies.owner_head_freshness
import protocols.policies.per_key_all_key
import protocols.policies.planfence
import protocols.policies.planfence_budget
import protocols.policies.planfence_grouped
import protocols.policies.session_read_set  # noqa: F401
