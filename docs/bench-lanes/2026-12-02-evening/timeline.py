"""Where a bench-lanes run's wall time goes: group opens, episodes, and the rest."""
import sys, time, trio
from pathlib import Path
from contextlib import asynccontextmanager
from rich.console import Console
from testbed.tools.bench_lanes import bench_campaign
from testbed.campaign.parse import parse_campaign
from testbed.run.episode import EpisodeRunner, TeamGroup
from testbed.run.loop import run_campaign
T0 = time.monotonic()
events = []
def ev(kind, *a): events.append((round(time.monotonic() - T0, 2), kind, *a))
orig_open = EpisodeRunner.open_group
@asynccontextmanager
async def open_group(self, key, cells):
    ev("open-start")
    async with orig_open(self, key, cells) as g:
        ev("open-end")
        yield g
        ev("close-start")
    ev("close-end")
EpisodeRunner.open_group = open_group
orig_run = TeamGroup.run_episode
async def run_episode(self, cell, schedule):
    ev("ep-start")
    try:
        return await orig_run(self, cell, schedule)
    finally:
        ev("ep-end")
TeamGroup.run_episode = run_episode
templates = int(sys.argv[1]); jobs = int(sys.argv[2]); out = Path(sys.argv[3])
ev("parse-start")
campaign = parse_campaign(bench_campaign(templates), source="prof")
ev("parse-end")
async def main():
    await run_campaign(campaign, out, resume=False, console=Console(file=open("/dev/null", "w")), jobs=jobs,
                       runner=EpisodeRunner(campaign, shared_emulator=True))
trio.run(main)
ev("done")
import collections
for e in events: print(*e)
opens = [e[0] for e in events if e[1] == "open-start"]; opene = [e[0] for e in events if e[1] == "open-end"]
eps = [e[0] for e in events if e[1] == "ep-start"]; epe = [e[0] for e in events if e[1] == "ep-end"]
print("first open start", min(opens), "last open end", max(opene), "first ep", min(eps), "last ep end", max(epe), "done", events[-1][0])
