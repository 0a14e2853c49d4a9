import resource, sys, time, trio, os, statistics
from pathlib import Path
from testbed.tools.bench_lanes import bench_campaign
from testbed.campaign.parse import parse_campaign
from testbed.run.episode import EpisodeRunner
TCK = os.sysconf("SC_CLK_TCK")
def cpu(pid):
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TCK
def kids(pid):
    out = []
    for t in Path(f"/proc/{pid}/task").iterdir():
        try: out += [int(x) for x in (t / "children").read_text().split()]
        except OSError: pass
    return out
def tree(pid):
    res = {}
    for k in kids(pid):
        try: cmd = Path(f"/proc/{k}/cmdline").read_bytes().replace(b"\0", b" ")[:60].decode()
        except OSError: continue
        res[k] = (cmd, cpu(k)); res.update(tree(k))
    return res
import threading
def watch(pids, stop, last):
    while not stop.is_set():
        for pid in pids:
            try: last[pid] = cpu(pid)
            except (OSError, IndexError): pass
        time.sleep(0.01)
async def main():
    n = int(sys.argv[1])
    campaign = parse_campaign(bench_campaign(2), source="prof")
    cell, template = campaign.episodes()[0]
    runner = EpisodeRunner(campaign, shared_emulator=True)
    for i in range(n):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        async with runner.open_group(cell.group_key, [cell]) as group:
            await trio.sleep(2)
            t = tree(os.getpid())
            agg = {}
            for pid, (cmd, c) in t.items():
                kind = ("zygote" if kids(pid) else "node") if "zygote" in cmd else "emulator" if "emulator" in cmd else "node" if "nodes" in cmd else cmd
                agg[kind] = agg.get(kind, 0) + c
            print({k: round(v, 3) for k, v in agg.items()}, end=" ")
            stop = threading.Event(); last = {}
            kinds = {pid: ("zygote" if kids(pid) else "node") if "zygote" in cmd else "emulator" if "emulator" in cmd else "other" for pid, (cmd, c) in t.items()}
            th = threading.Thread(target=watch, args=(list(t), stop, last)); th.start()
        time.sleep(0.3); stop.set(); th.join()
        shut = {}
        for pid, v in last.items():
            shut[kinds[pid]] = shut.get(kinds[pid], 0) + v - t[pid][1]
        print("at close", {k: round(v, 3) for k, v in shut.items()}, end=" ")
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        print("reaped", round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 3))
trio.run(main)
