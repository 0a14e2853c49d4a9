import io, sys, time, trio
from pathlib import Path
from rich.console import Console
from testbed.tools.bench_lanes import bench_campaign
from testbed.campaign.parse import parse_campaign
from testbed.run.episode import EpisodeRunner
from testbed.run.loop import run_campaign
templates = int(sys.argv[1]); jobs = int(sys.argv[2]); out = Path(sys.argv[3])
campaign = parse_campaign(bench_campaign(templates), source="prof")
async def main():
    await run_campaign(campaign, out, resume=False, console=Console(file=sys.stderr, width=160), jobs=jobs,
                       runner=EpisodeRunner(campaign, shared_emulator=True))
trio.run(main)
