import re,sys,statistics as st
rows={}
for line in open(sys.argv[1]):
    m=re.search(r'round=(\d+) (before|after) load=\[([^\]]*)\] BenchmarkLeaseAcceptComplete/(\S+)-2\s+\d+\s+\d+ ns/op\s+([\d.]+) commits/job\s+([\d.]+) jobs/s\s+([\d.]+) stmts/job',line)
    if not m: continue
    r,v,load,name,c,j,s=m.groups()
    rows.setdefault((name,v),[]).append((float(j),float(c),float(s),load.split(',')[0]))
for (name,v),xs in sorted(rows.items()):
    print(f"{name:45s} {v:6s} jobs/s median {st.median(x[0] for x in xs):8.0f} (runs {', '.join('%.0f'%x[0] for x in xs)})  commits/job {st.median(x[1] for x in xs):.4f}  stmts/job {st.median(x[2] for x in xs):.4f}  load1 {','.join(x[3] for x in xs)}")
