"""Run a command; sample every descendant's cpu_times every 0.1 s; print totals by kind."""
import subprocess, sys, time, psutil, json, collections
cmd = sys.argv[1:]
t0=time.time()
p = subprocess.Popen(cmd, stdout=open('/tmp/prof/watch.out','w'), stderr=subprocess.STDOUT)
root = psutil.Process(p.pid)
last = {}
def kind(c):
    s=' '.join(c)
    if '-m nodes' in s: return 'node'
    if 'links.emulator' in s: return 'emulator'
    if 'run1.py' in s: return 'controller'
    return s[:60]
while p.poll() is None:
    try: procs=[root]+root.children(recursive=True)
    except psutil.Error: procs=[]
    for q in procs:
        try:
            ct=q.cpu_times(); last[q.pid]=(kind(q.cmdline()), ct.user+ct.system, ct.children_user+ct.children_system)
        except psutil.Error: pass
    time.sleep(0.1)
agg=collections.Counter(); n=collections.Counter()
for pid,(k,c,ch) in last.items(): agg[k]+=c; n[k]+=1
print('wall', round(time.time()-t0,1))
for k,v in agg.most_common(): print(f'{v:8.2f} s  x{n[k]}  {k}')
