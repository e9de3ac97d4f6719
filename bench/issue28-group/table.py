import re, glob, statistics, sys, collections
# table.py DIR: one row a run of DIR/VARIANT-DB-FLOW-N.txt (one.sh's outputs), then medians.
d = sys.argv[1] if len(sys.argv) > 1 else '/tmp/grp/out'
rows = collections.defaultdict(list)
print("variant db flow run | jobs/s complete_p99 lease_p99 | cpu ms/job srv pg lg | commits/job stmts/job | load1 | deadlocks")
for f in sorted(glob.glob(d + '/*.txt')):
    v, db, flow, n = f.split('/')[-1][:-4].split('-')
    t = open(f).read()
    m = re.search(r'([\d.]+) jobs/s', t)
    if not m or '# exit 0' not in t: print(f, 'FAILED'); continue
    jobs = float(m.group(1))
    cp = re.search(r'^\s*complete(?: \(batch\))?\s+\d+\s+\d+\s+\S+\s+([\d.]+)ms', t, re.M)
    lp = re.search(r'^\s*lease\s+\d+\s+\d+\s+\S+\s+([\d.]+)ms', t, re.M)
    cpu = re.search(r'server [\d.]+ s \(([\d.]+) ms per job.*?(?:postgres [\d.]+ s in \d+ backends of the database \(([\d.]+) ms per job\); )?loadgen [\d.]+ s \(([\d.]+) ms per job\); load average ([\d.]+)', t)
    pg = re.search(r'postgres: \d+ commits \(([\d.]+) per job\), \d+ rollbacks, \d+ statements \(([\d.]+) per job\)', t)
    dl = re.search(r'deadlocks=(\d+)', t)
    r = [jobs, float(cp.group(1)), float(lp.group(1)), float(cpu.group(1)), float(cpu.group(2) or 'nan'), float(cpu.group(3)),
         float(pg.group(1)) if pg else float('nan'), float(pg.group(2)) if pg else float('nan'), float(cpu.group(4)), int(dl.group(1)) if dl else 0]
    rows[(db, flow, v)].append(r)
    print(v, db, flow, n, '|', *r)
print()
for k in sorted(rows):
    cols = list(zip(*rows[k]))
    med = [statistics.median(c) for c in cols]
    print(*k, 'MEDIAN of', len(rows[k]), '|', ' '.join(f'{x:.2f}' for x in med[:-1]), 'deadlocks(sum)', sum(cols[-1]))
