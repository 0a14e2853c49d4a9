import os, traceback, collections, sys, runpy, subprocess
seen = collections.Counter()
def before():
    st = traceback.extract_stack(limit=14)
    key = " <- ".join(f"{f.name}({os.path.basename(f.filename)}:{f.lineno})" for f in st[-9:-1][::-1])
    seen[key] += 1
os.register_at_fork(before=before)
orig = subprocess.Popen.__init__
def popen(self, args, *a, **k):
    seen["Popen " + " ".join(map(str, args if isinstance(args, (list, tuple)) else [args]))[:100]] += 1
    return orig(self, args, *a, **k)
subprocess.Popen.__init__ = popen
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    for k, v in seen.most_common(): print(v, k, file=sys.stderr)
