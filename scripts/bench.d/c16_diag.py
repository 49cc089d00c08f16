"""Where the CNN's c=16 loss goes (docs/performance.md): serves the real CNN with 2
workers and --metrics-port, runs wrk at c=4, 16, 4, 16 and prints, per run, req/s, the
forward passes and their mean time (vramfork_forward_duration_seconds), how busy the two
model threads were, and the new TCP connections the kernel counted (nstat TcpPassiveOpens).
Run after `scripts/bench --only real` (which builds the models and the release binaries):

    python3 scripts/bench.d/c16_diag.py
"""
import os, re, subprocess, sys, time, urllib.request
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BIN, ROOT, free_port  # noqa: E402
REAL = f"{ROOT}/bench/tmp/real"
port, mport = free_port(), free_port()
log=open(f"{ROOT}/bench/tmp/c16-diag.log","w")
env=dict(os.environ, VRAMFORK_LOG="info", VRAMFORK_LOG_FORMAT="json")
p=subprocess.Popen([f"{BIN}/app","--production","--metadata",f"{REAL}/cnn.json","--workers","2","--port",str(port),"--metrics-port",str(mport)],stdout=log,stderr=log,env=env,start_new_session=True)
body=open(f"{REAL}/cnn.body").read()
def scrape():
    t=urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics").read().decode()
    s=float(re.search(r"^vramfork_forward_duration_seconds_sum (\S+)",t,re.M).group(1))
    c=float(re.search(r"^vramfork_forward_duration_seconds_count (\S+)",t,re.M).group(1))
    return s,c
def opens():
    out=subprocess.run(["nstat","-az","TcpPassiveOpens"],capture_output=True,text=True).stdout
    m=re.search(r"TcpPassiveOpens\s+(\d+)",out); return int(m.group(1)) if m else -1
for _ in range(200):
    try:
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/",data=body.encode()),timeout=5).read(); break
    except Exception: time.sleep(0.5)
open(f"{ROOT}/bench/tmp/c16-body","w").write(body)
env2=dict(os.environ,BENCH_BODY_FILE=f"{ROOT}/bench/tmp/c16-body")
for c in [4,16,4,16]:
    time.sleep(2.5)  # heartbeats carry the figures
    s0,c0=scrape(); o0=opens(); t0=time.time()
    out=subprocess.run(["wrk","-t","1","-c",str(c),"-d","6s","--timeout","10s","-s",f"{ROOT}/scripts/bench.d/post.lua",f"http://127.0.0.1:{port}/"],capture_output=True,text=True,env=env2).stdout
    wall=time.time()-t0; o1=opens(); time.sleep(2.5); s1,c1=scrape()
    rps=re.search(r"Requests/sec:\s+(\S+)",out).group(1)
    print(f"c={c}: {rps} req/s; passes {c1-c0:.0f}, per pass {(s1-s0)/(c1-c0)*1e3:.2f} ms, model busy {(s1-s0)/(wall*2):.2f} of 2 workers; new connections {o1-o0}",flush=True)
os.killpg(p.pid,9)
