"""CPU of opening and closing one AT&T team (5 agents), controller and descendants apart."""
import resource, sys, time, trio, os
from pathlib import Path
from testbed.tools.bench_lanes import bench_campaign
from testbed.campaign.parse import parse_campaign
from testbed.run.episode import EpisodeRunner

def ru():
    s = resource.getrusage(resource.RUSAGE_SELF); c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime

async def main():
    n = int(sys.argv[1])
    campaign = parse_campaign(bench_campaign(2), source="prof")
    cell, template = campaign.episodes()[0]
    runner = EpisodeRunner(campaign, shared_emulator=True)
    rows = []
    for i in range(n):
        a = ru(); w = time.monotonic()
        async with runner.open_group(cell.group_key, [cell]) as group:
            b = ru(); w2 = time.monotonic()
        c = ru()
        rows.append((b[0]-a[0], c[0]-b[0], c[1]-a[1], w2 - w, time.monotonic()-w2))
    for r in rows:
        print("open ctl %.3f  close ctl %.3f  descendants %.3f  wall open %.2f close %.2f" % r)
    import statistics
    k = rows[1:]
    print("median (excl first): open ctl %.3f close ctl %.3f desc %.3f" % tuple(statistics.median(x[j] for x in k) for j in range(3)))
trio.run(main)
