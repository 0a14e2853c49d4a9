#!/bin/bash
# measure.sh TEMPLATES JOBS OUT TAG: per-process CPU, host busy and steal
t=$1; j=$2; out=$3; tag=$4
cd ${REPO:-/work/main}; export PYTHONPATH=$PWD
s0=$(head -1 /proc/stat)
/tmp/spy/bin/python /tmp/prof/cpuwatch.py /work/main/.venv/bin/python /tmp/prof/run1.py $t $j $out > /tmp/prof/$tag.txt
s1=$(head -1 /proc/stat)
python3 -c "
a='$s0'.split()[1:];b='$s1'.split()[1:]
d=[int(y)-int(x) for x,y in zip(a,b)]
print('busy_excl_steal s',(sum(d)-d[3]-d[4]-d[7])/100,'steal',d[7]/100, 'sys', d[2]/100)" >> /tmp/prof/$tag.txt
/work/main/.venv/bin/python -c "
import pandas as pd; e=pd.read_parquet('$out/episodes.parquet'); print('episodes',len(e),'late_p99_median',e['emulator_late_p99_ms'].median(),'disturbed',int(e['disturbed'].sum()), 'stall_median', e['stall_ms_per_action'].median())" >> /tmp/prof/$tag.txt
cp $out/episodes.parquet /tmp/prof/$tag.parquet
rm -rf $out
cat /tmp/prof/$tag.txt
