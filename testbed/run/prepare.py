"""The start every episode and trial shares: a reset team, seeded keys, a restarted trace.

Rules:

1. Every node is reset for the cell (policy, connection setting, the schedule's
   owners) with identities bound to the episode key (``Team.reset_all``), so nothing
   signed in another episode is accepted in this one.
2. Every key is seeded at its owner, all at once; the traffic this takes is the
   episode's ``setup`` phase (``testbed.run.accounting`` rule 2).
3. With the ``reuse_warm`` connection setting every agent opens its pooled connection
   to every other member (owners and the central service) after the reset and before
   seeding, so no measured operation opens one; that traffic is ``setup``.
4. The link traces restart last, so the first event of the episode meets the start of
   the trace (offsets included) whatever the setup took.
5. Just before that every node starts a new scheduling-delay window (control op
   ``sched`` with ``restart``), so the seeding's own contention (every owner seeds at
   once) is not read as disturbance (``testbed/run/disturbance.py``).
"""

from __future__ import annotations

import trio

from testbed.campaign.model import Cell, episode_key
from testbed.campaign.workload import Schedule, Seed
from testbed.net.topology import Topology
from testbed.run.accounting import PhaseTally, total_sent
from testbed.run.team import Team


async def start_episode(team: Team, topo: Topology, cell: Cell, schedule: Schedule
                        ) -> PhaseTally:
    """Reset, seed and restart the trace (module rules); the tally holds the setup."""
    await team.reset_all(policy=cell.policy, connection=cell.connection,
                         owners=schedule.owners,
                         episode=episode_key(cell, schedule.template))
    if cell.connection == "reuse_warm":
        async with trio.open_nursery() as nursery:
            for agent in team.agents:
                nursery.start_soon(lambda a: team.call(a, "warm"), agent)

    async def seed_key(seed: Seed) -> None:
        await team.call(seed.owner, "seed", key=seed.key, content=seed.content,
                        rtype=seed.rtype)

    async with trio.open_nursery() as nursery:
        for seed in schedule.seeds:
            nursery.start_soon(seed_key, seed)
    phases = PhaseTally(setup=total_sent(await team.counters()))
    await team.each_call("sched", restart=True)
    await topo.restart_trace()
    return phases
