import collections,sys
ev=[l.split() for l in open(sys.argv[1]) if l[0].isdigit()]
by=collections.defaultdict(list)
for t,k in ev: by[k].append(float(t))
for k,v in by.items(): print(f"{k:25} n={len(v):3} first={min(v):6.2f} last={max(v):6.2f}")
