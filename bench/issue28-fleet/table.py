#!/usr/bin/env python3
"""table.py [DIR]: one row per fleet run in DIR (default /tmp/fl/out), then the medians of each build and db."""
import glob, os, re, statistics, sys

d = sys.argv[1] if len(sys.argv) > 1 else '/tmp/fl/out'
rows = []
for f in sorted(glob.glob(os.path.join(d, '*.txt'))):
    t = open(f).read()
    name = os.path.basename(f)[:-4]
    m = re.search(r'^\s+heartbeat\s+(\d+)\s+(\d+)\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms', t, re.M)
    lp = re.search(r'lease \(no job\)\s+(\d+)\s+\d+\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms', t)
    rss = re.search(r'([\d.]+) MiB at most', t)
    pg = re.search(r'\(([\d.]+) per heartbeat\).*\(([\d.]+) per heartbeat\)', t)
    loads = re.findall(r'load average: ([\d.]+)', t)
    claims = re.search(r'^\s*(\d+) \|[^|]+\|[^|]+\| WITH p AS MATERIALIZED', t, re.M)
    if not m:
        continue
    rows.append(dict(run=name, hb=int(m.group(1)), p50=float(m.group(3)), p99=float(m.group(4)), max=float(m.group(5)),
                     lp=int(lp.group(1)) if lp else 0, lp99=float(lp.group(3)) if lp else 0,
                     commits=float(pg.group(1)) if pg else None, stmts=float(pg.group(2)) if pg else None,
                     claims=int(claims.group(1)) if claims else None,
                     rss=float(rss.group(1)) if rss else None, load0=loads[0] if loads else '', load1=loads[1] if len(loads) > 1 else ''))

hdr = f"{'run':<14}{'hb p50':>8}{'hb p99':>9}{'hb max':>9}{'poll p99':>10}{'claims':>8}{'commits/hb':>11}{'stmts/hb':>9}{'RSS MiB':>8}  load start/end"
print(hdr)
for r in rows:
    c = f"{r['commits']:.2f}" if r['commits'] is not None else '-'
    s = f"{r['stmts']:.2f}" if r['stmts'] is not None else '-'
    cl = str(r['claims']) if r['claims'] is not None else '-'
    print(f"{r['run']:<14}{r['p50']:>8.1f}{r['p99']:>9.1f}{r['max']:>9.1f}{r['lp99']:>10.0f}{cl:>8}{c:>11}{s:>9}{r['rss'] or 0:>8.1f}  {r['load0']}/{r['load1']}")
print()
print('medians')
groups = {}
for r in rows:
    groups.setdefault(r['run'].rsplit('-', 1)[0], []).append(r)
for g, rs in sorted(groups.items()):
    med = lambda k: statistics.median([r[k] for r in rs if r[k] is not None]) if any(r[k] is not None for r in rs) else float('nan')
    print(f"{g:<14}{med('p50'):>8.1f}{med('p99'):>9.1f}{med('max'):>9.1f}{med('lp99'):>10.0f}{med('claims') if rs[0]['claims'] is not None else '-':>8}{med('commits'):>11.2f}{med('stmts'):>9.2f}{med('rss'):>8.1f}  (n={len(rs)})")
