"""Twentieth session: aggregates a py-spy raw profile of spy_decode.py: where the samples of the timed decode fall
(no native frame under the Python line, libtorch_python, interq's kernels ...), and per interq / transformers function."""
import re, sys, collections
LINE = sys.argv[2] if len(sys.argv) > 2 else "21"  # the line of spy_decode.py that runs the timed decode
tot = collections.Counter(); n_all = 0
leafcls = collections.Counter()
pyfn = collections.Counter()
for line in open(sys.argv[1]):
    stack, _, cnt = line.rstrip().rpartition(" ")
    cnt = int(cnt)
    frames = stack.split(";")
    if not any("spy_decode.py:" + LINE + "" in f for f in frames):  # the timed decode(N) call only
        continue
    n_all += cnt
    # last python frame and whether something native sits below it
    py_idx = max(i for i, f in enumerate(frames) if re.search(r"\.py:\d+\)$", f) or "<frozen" in f)
    below = frames[py_idx + 1:]
    lastpy = frames[py_idx]
    libs = [re.search(r"\(([^()]*)\)$", f).group(1) if re.search(r"\(([^()]*)\)$", f) else "?" for f in below]
    if not below:
        cls = "python(no native)"
    elif all("libpython" in l or "python3" in l for l in libs):
        cls = "python interp"
    else:
        # first non-python lib
        nonpy = [l for l in libs if "libpython" not in l and "python3" not in l]
        cls = "native:" + nonpy[-1]  # leaf-most lib
    leafcls[cls] += cnt
    pyfn[lastpy] += cnt
print("samples in timed decode:", n_all)
for k, v in leafcls.most_common(25):
    print(f"{v/n_all*100:6.1f}%  {k}")
print()
for k, v in pyfn.most_common(45):
    print(f"{v/n_all*100:6.1f}%  {k}")
print()
per = collections.defaultdict(collections.Counter)
for line in open(sys.argv[1]):
    stack, _, cnt = line.rstrip().rpartition(" ")
    cnt = int(cnt); frames = stack.split(";")
    if not any("spy_decode.py:" + LINE + "" in f for f in frames):
        continue
    pyf = [f for f in frames if re.search(r"\.py:\d+\)$", f)]
    # attribute to the outermost frame inside these modules
    key = None
    for f in pyf:
        m = re.match(r"(\S+) \((\S+?)\.py:\d+\)", f)
        if m and ("modeling_llama" in m.group(2) or "interq" in m.group(2)):
            key = m.group(1) + " " + m.group(2).split("/")[-1]
    libs = [re.search(r"\(([^()]*)\)$", f).group(1) for f in frames[frames.index(pyf[-1]) + 1:] if re.search(r"\(([^()]*)\)$", f)]
    nonpy = [l for l in libs if "libpython" not in l and "python3" not in l]
    kind = "kern" if any("interq_int8" in l or "gomp" in l for l in nonpy) else ("aten" if any("libtorch_cpu" in l for l in nonpy) else "ovh")
    per[key][kind] += cnt
rows = sorted(per.items(), key=lambda kv: -sum(kv[1].values()))
print("innermost model/interq function: total% (kern / aten / pure overhead)")
for k, c in rows[:30]:
    s = sum(c.values())
    print(f"{s/n_all*100:6.1f}%  kern {c['kern']/n_all*100:5.1f}  aten {c['aten']/n_all*100:5.1f}  ovh {c['ovh']/n_all*100:5.1f}  {k}")
