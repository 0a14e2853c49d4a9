"""Phases of the team opens in a bench-lanes run."""
import sys, time, trio, collections
from pathlib import Path
from contextlib import asynccontextmanager
from rich.console import Console
from testbed.tools.bench_lanes import bench_campaign
from testbed.campaign.parse import parse_campaign
import testbed.run.episode as E
import testbed.run.team as T
from testbed.run.loop import run_campaign
T0 = time.monotonic()
events = []
def ev(kind, tag=""): events.append((time.monotonic() - T0, kind, tag))
def wrap_cm(mod, name):
    orig = getattr(mod, name)
    @asynccontextmanager
    async def w(*a, **k):
        ev(name + "-start")
        async with orig(*a, **k) as x:
            ev(name + "-end")
            yield x
            ev(name + "-close")
        ev(name + "-closed")
    setattr(mod, name, w)
wrap_cm(E, "open_topology"); wrap_cm(E, "open_team")
durs = collections.defaultdict(list)
def wrap_m(cls, name):
    orig = getattr(cls, name)
    async def w(self, *a, **k):
        ev(name + "-start"); t = time.monotonic()
        try: return await orig(self, *a, **k)
        finally: ev(name + "-end"); durs[name].append(time.monotonic() - t)
    setattr(cls, name, w)
for n in ["_configure_all", "_each"]: wrap_m(T.Team, n)
for n in ["run_episode", "_run"]: wrap_m(E.TeamGroup, n)
_se = E.start_episode
async def se(*a, **k):
    t = time.monotonic()
    try: return await _se(*a, **k)
    finally: durs["start_episode"].append(time.monotonic() - t)
E.start_episode = se
_ed = E.episode_disturbance
async def ed(*a, **k):
    t = time.monotonic()
    try: return await _ed(*a, **k)
    finally: durs["episode_disturbance"].append(time.monotonic() - t)
E.episode_disturbance = ed
import testbed.links.userspace as U
_cf = U._configure
async def cf(*a, **k):
    t = time.monotonic()
    try: return await _cf(*a, **k)
    finally: durs["emu_configure"].append(time.monotonic() - t)
U._configure = cf
_st = U._setup_tun
def st(*a, **k):
    t = time.monotonic()
    try: return _st(*a, **k)
    finally: durs["setup_tun"].append(time.monotonic() - t)
U._setup_tun = st
import testbed.run.node_spawner as NS
wrap_m(NS.NodeSpawner, "spawn")
import testbed.run.startup as SU
_orig_ms = T.measure_start_s
async def ms(env):
    ev("probe-start")
    try: return await _orig_ms(env)
    finally: ev("probe-end")
T.measure_start_s = ms
_orig_probe = SU._probe
async def pr(env):
    ev("realprobe-start")
    try: return await _orig_probe(env)
    finally: ev("realprobe-end")
SU._probe = pr
templates = int(sys.argv[1]); jobs = int(sys.argv[2]); out = Path(sys.argv[3])
campaign = parse_campaign(bench_campaign(templates), source="prof")
async def main():
    await run_campaign(campaign, out, resume=False, console=Console(file=open("/dev/null", "w")), jobs=jobs,
                       runner=E.EpisodeRunner(campaign, shared_emulator=True))
trio.run(main)
ev("done")
for e in events: print(f"{e[0]:.2f} {e[1]}")
import statistics
for k, v in durs.items(): print("DUR", k, len(v), "median %.3f max %.3f sum %.2f" % (statistics.median(v), max(v), sum(v)))
