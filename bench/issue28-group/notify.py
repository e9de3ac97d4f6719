import subprocess, time
# listener: psql session listening, prints notifications after the sender's commit
p = subprocess.Popen(["psql","-h","127.0.0.1","-p","5433","-U","postgres","-d","postgres","-X","-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
p.stdin.write("LISTEN grp_chan;\n"); p.stdin.flush()
time.sleep(0.5)
subprocess.run(["psql","-h","127.0.0.1","-p","5433","-U","postgres","-d","postgres","-X","-q","-c",
 "BEGIN; SAVEPOINT a; SELECT pg_notify('grp_chan',''); RELEASE SAVEPOINT a; SAVEPOINT a; SELECT pg_notify('grp_chan',''); RELEASE SAVEPOINT a; SAVEPOINT a; SELECT pg_notify('grp_chan','x'); ROLLBACK TO SAVEPOINT a; RELEASE SAVEPOINT a; SELECT pg_notify('grp_chan',''); COMMIT;"], capture_output=True)
time.sleep(0.5)
p.stdin.write("SELECT 1;\n"); p.stdin.flush(); time.sleep(0.5)
p.stdin.close(); print(p.stdout.read())
