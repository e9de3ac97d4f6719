import re,glob,statistics as st,sys
# table.py [DIR]: the table of one.sh's outputs DIR/[VARIANT-]DB-FLOW-N.txt (default /tmp/lgb/out),
# by [variant,] database and flow, with medians.
out=sys.argv[1] if len(sys.argv)>1 else '/tmp/lgb/out'
rows={}
for f in sorted(glob.glob(out+'/*-*[0-9].txt')):
    s=open(f).read()
    *v,db,flow,n=f.split('/')[-1][:-4].split('-')
    db=' '.join(v+[db])
    g=lambda p: (lambda m: m.group(1) if m else None)(re.search(p,s))
    comp='complete \\(batch\\)' if flow=='batched' else 'complete'
    m=re.search(r'\n\s*'+comp+r'\s+\d+\s+\d+\s+([0-9.]+)ms\s+([0-9.]+)ms',s)
    dl=re.search(r'dispatch→lease\s+\d+\s+\d+\s+([0-9.]+)ms\s+([0-9.]+)ms',s)
    r=dict(jobs=g(r'([0-9.]+) jobs/s'), cp50=m and m.group(1), cp99=m and m.group(2), dlp99=dl and dl.group(2),
        srv=g(r'server [0-9.]+ s \(([0-9.]+) ms per job'), pg=g(r'postgres [0-9.]+ s in \d+ backends of the database \(([0-9.]+) ms'),
        lg=g(r'loadgen [0-9.]+ s \(([0-9.]+) ms'), commits=g(r'commits \(([0-9.]+) per job'), stmts=g(r'statements \(([0-9.]+) per job'),
        load=g(r'load average ([0-9.]+)'), rss=g(r'at the start, ([0-9.]+) MiB at most'), ok='ok' if '# exit 0' in s else 'FAIL')
    rows.setdefault((db,flow),[]).append((n,r))
keys=['jobs','cp50','cp99','dlp99','srv','pg','lg','commits','stmts','load','rss']
print('db flow run | '+' '.join(keys)+' ok')
for (db,flow),rs in sorted(rows.items()):
    for n,r in rs: print(db,flow,n,'|',' '.join(str(r[k]) for k in keys),r['ok'])
    med=[]
    for k in keys:
        v=[float(r[k]) for n,r in rs if r[k] is not None]
        med.append('%.2f'%st.median(v) if v else '-')
    print(db,flow,'MEDIAN |',' '.join(med))
