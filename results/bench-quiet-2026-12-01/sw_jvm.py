import sys, json
sys.path.insert(0, "benchmarks")
from bench_envs import bench_pool
if __name__ == "__main__":
    names = ["find-living-thing", "find-non-living-thing", "boil", "melt"]
    out = {}
    for label, opts in [("default", "-Xmx384m -XX:+UseSerialGC"),
                        ("apc1", "-Xmx384m -XX:+UseSerialGC -XX:ActiveProcessorCount=1"),
                        ("c1only", "-Xmx384m -XX:+UseSerialGC -XX:TieredStopAtLevel=1")]:
        r = bench_pool("scienceworld", {"task_names": names, "max_variations": 2, "java_options": opts}, 8, "expert", [1, 2])
        out[label] = {k: r[f"scienceworld_pool_{k}"] for k in ("episodes_per_s", "cores_used", "speedup", "same_outcomes")}
        print(label, json.dumps(out[label]), flush=True)
