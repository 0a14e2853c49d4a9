"""Head claims: when a node adopts a head another member told it about (pure).

A head envelope (:class:`protocols.records.HeadInfo`) carries no content, so a node
that is told "key k is at seq n, record R" cannot check the claim until it holds R.
An owner could otherwise announce or commit a head at a sequence no record has (say
2^62) and, since adopted heads were never lowered, wedge every peer on that key for the
rest of the episode. Rules this module states (``nodes.store`` and the policies apply
them):

1. A claim is *proven* at a node once the node holds the record it names (the record
   was verified on its way into the store: digest, owner signature, owner rule).
2. Announced heads (the synced view): a higher sequence replaces the current claim; the
   same (seq, ID) again changes nothing; the same sequence with another ID is
   equivocation (:class:`EquivocationError`, bad peer input). A lower sequence is
   ignored behind a proven head (an announcement that is provably behind) and replaces
   an unproven one: the owner's newer statement withdraws a claim nobody could check,
   so an honest update after a bogus claim is adopted (never a wedge).
3. Directory commits: owners commit every version they make, seed first, in order
   (``CommitsToDirectory``), so a commit must be the seed (seq 1) or the directory's
   head plus one (:func:`check_commit`). A commit at any other sequence (2^62, a gap,
   a step back) names a version the owner did not make in order: bad peer input,
   refused before anything is written.
4. A head whose holder cannot produce its record when asked (``unknown_id`` to a
   fetch of the ID it reported) is the holder's fault (:func:`unproducible`): the
   action blocks with an integrity reason naming it, never as a network problem.
5. Two different owner-signed records at the same (key, owner, seq) are equivocation
   by that owner; both carry its signature, so the evidence is transferable
   (:func:`equivocation`).
"""

from __future__ import annotations

from protocols.errors import ConflictError, IntegrityError, OwnerRuleError, RemoteCallError
from protocols.records import HeadInfo, Record

#: The sequence of a key's first version (a seed).
FIRST_SEQ = 1
#: The error code of a fetch for an ID the asked node does not hold.
UNKNOWN_ID = "unknown_id"


class EquivocationError(ConflictError):
    """An owner stated two different versions at one sequence of its key."""

    def __init__(self, owner: str, key: str, seq: int, detail: str) -> None:
        super().__init__(f"equivocation by {owner!r}: {key!r} seq {seq} {detail}")
        self.owner = owner
        self.key = key
        self.seq = seq


def adopt_announced(current: HeadInfo | None, new: HeadInfo, *, proven: bool) -> bool:
    """Rule 2: whether an announced ``new`` head replaces ``current`` (``proven``: the
    node holds ``current``'s record). Raises :class:`EquivocationError`."""
    if current is None or new.seq > current.seq:
        return True
    if new.seq == current.seq:
        if new.record_id != current.record_id:
            raise EquivocationError(new.owner, new.key, new.seq,
                                    "announced with two different record IDs")
        return False
    return not proven


def check_commit(current: HeadInfo | None, new: HeadInfo) -> bool:
    """Rule 3: whether a commit moves the directory head (False: the same head again).
    Raises :class:`EquivocationError` or :class:`OwnerRuleError` (a commit out of
    order, e.g. at a sequence no record of the owner's chain can have reached yet)."""
    if current is not None and new.seq == current.seq:
        if new.record_id != current.record_id:
            raise EquivocationError(new.owner, new.key, new.seq,
                                    "committed with two different record IDs")
        return False
    expected = FIRST_SEQ if current is None else current.seq + 1
    if new.seq != expected:
        now = "none" if current is None else f"seq {current.seq}"
        raise OwnerRuleError(f"commit of {new.key!r} seq {new.seq} out of order: the "
                             f"directory holds {now}, so the next version is seq "
                             f"{expected}")
    return True


def unproducible(head: HeadInfo, holder: str, exc: BaseException) -> BaseException:
    """Rule 4: what a failed fetch of ``head``'s record from ``holder`` (the member that
    reported the head) means: an :class:`IntegrityError` naming the holder when it
    answered ``unknown_id``, else ``exc`` itself (a network failure stays one)."""
    if not (isinstance(exc, RemoteCallError) and exc.code == UNKNOWN_ID):
        return exc
    return IntegrityError(f"{holder!r} reported {head.key!r} seq {head.seq} "
                          f"({head.record_id.hex()[:12]}) but cannot produce that record "
                          f"(faulty member)")


def equivocation(held: Record, offered: Record) -> EquivocationError | None:
    """Rule 5: the error if two verified records of one owner share a version."""
    if (held.key, held.owner, held.seq) != (offered.key, offered.owner, offered.seq) \
            or held.id == offered.id:
        return None
    return EquivocationError(offered.owner, offered.key, offered.seq,
                             f"has two signed records ({held.id.hex()[:12]} held, "
                             f"{offered.id.hex()[:12]} offered)")
