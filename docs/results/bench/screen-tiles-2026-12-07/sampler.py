import subprocess, sys, time, json
def read(pid):
    d = {}
    try:
        for line in open(f"/proc/{pid}/status"):
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                d[k] = int(v.split()[0])
    except OSError:
        return None
    return d
out = sys.argv[1]
p = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
best = None; t0 = time.time(); trace = []
while p.poll() is None:
    d = read(p.pid)
    if d and "VmRSS" in d:
        trace.append((round(time.time() - t0, 2), d["VmRSS"], d.get("RssAnon"), d.get("RssFile")))
        if best is None or d["VmRSS"] > best["VmRSS"]:
            best = dict(d, t=round(time.time() - t0, 2))
        last = d
    time.sleep(0.02)
json.dump({"best": best, "last": last, "rc": p.returncode, "trace": trace[::10]}, open(out, "w"))
print(out, best, last.get("VmHWM"))
