import sys, json, time
sys.path.insert(0, "benchmarks")
from bench_envs import _play_in_process, _play_pool, _cpu_s, _cpu_since
from interq.envs import make_env
from interq.envs.pool import EnvPool
if __name__ == "__main__":
    names = ["find-living-thing", "find-non-living-thing", "boil", "melt"]
    kw = {"task_names": names, "max_variations": 2}
    env = make_env("scienceworld", **kw); tasks = env.tasks("train")[:8]
    for p in range(3):
        c0, t0 = _cpu_s(), time.perf_counter()
        dt, ref = _play_in_process(env, tasks, "expert")
        print("in_process pass", p, round(len(tasks) / dt, 3), "eps/s", round(_cpu_since(c0) / (time.perf_counter() - t0), 2), "cores", flush=True)
    env.close()
    for w in (1, 2):
        pool = EnvPool.from_name("scienceworld", num_envs=w, step_timeout_s=600.0, **kw)
        for p in range(3):
            c0, t0 = _cpu_s(), time.perf_counter()
            dt, got, f = _play_pool(pool, tasks, "expert")
            print(w, "workers pass", p, round(len(tasks) / dt, 3), "eps/s", round(_cpu_since(c0) / (time.perf_counter() - t0), 2), "cores", got == ref, flush=True)
        pool.close()
