"""Which aborted attempts the run's infrastructure caused, so ``--resume`` runs them again.

Rules this module obeys (pure):

1. An abort reason starts with its cause, up to the first colon. ``model_endpoint``
   (:data:`MODEL_ENDPOINT`): a live episode's model server gave no answer at all after
   every retry (refused, dropped or timed-out connections, 429/5xx): the server was
   killed or hung, which says nothing about the model or the policy.
2. Such an attempt is committed like any abort (reason kept, no action rows, nothing
   imputed) but does not settle its repeat: ``--resume`` runs the episode again as its
   next attempt (``testbed.run.attempts``), and the report takes the verdict from an
   attempt that was not an infrastructure failure when there is one
   (``testbed.report.attempts``). Every other abort (a node died, froze or timed out)
   stays a measurement and is not run again.
"""

from __future__ import annotations

MODEL_ENDPOINT = "model_endpoint"
RETRIED_CAUSES = frozenset({MODEL_ENDPOINT})


def retried_on_resume(abort_reason: object) -> bool:
    """Whether an aborted attempt with this reason is an infrastructure failure (rule 2)."""
    if not isinstance(abort_reason, str):
        return False
    return abort_reason.split(":", 1)[0].strip() in RETRIED_CAUSES
