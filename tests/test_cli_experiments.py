"""`interq demo` and `interq compare` end to end on the toy environment (tiny, one or two steps)."""

import json
import math
import os
import sys
from pathlib import Path

import pytest

from interq.cli import main

TOY = ["env.name=toy", "env.task_types=", "env.max_turns=3", "env.num_train_tasks=8", "env.num_eval_tasks=2",
       "env.env_kwargs={length: 2}", "env.show_admissible=true", "algo.layout=concatenated",
       "model.vocab_size=300", "model.hidden_size=16", "model.intermediate_size=32", "model.num_heads=2",
       "model.num_kv_heads=1", "model.head_dim=8", "warm_start.num_demos=8", "warm_start.steps=2",
       "train.tasks_per_step=2", "train.episodes_per_task=2", "train.progress=false", "rollout.max_action_tokens=3",
       "train.steps=2", "train.eval_every_steps=1", "train.eval_episodes_per_task=1", "train.checkpoint_every_steps=2",
       "train.threads=1"]


def _result(text: str) -> dict:
    last = text.strip().splitlines()[-1]
    assert last.startswith("RESULT "), last
    return json.loads(last[len("RESULT "):])


@pytest.mark.slow
def test_demo_prints_table_plot_and_result(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), *TOY]) == 0
    res = _result(capsys.readouterr().out)
    for arm in ("bf16", "q-interq"):
        assert set(res[arm]) == {"success_before", "success_after", "gain_ci95", "eval_episodes", "wall_s", "cpu_s",
                                 "learner_forward_passes_per_step"}
        assert res[arm]["learner_forward_passes_per_step"] == 1.0 and res[arm]["eval_episodes"] == 2
        lo, hi = res[arm]["gain_ci95"]  # after minus before on the same held-out episodes
        assert lo <= res[arm]["success_after"] - res[arm]["success_before"] <= hi
    assert (tmp_path / "demo.png").is_file() and (tmp_path / "demo.md").is_file()
    md = (tmp_path / "demo.md").read_text()
    assert res["regime"] == "natural" and "Regime `natural`" in md and "docs/results.md" in md
    # the toy environment is not the setting the shipped warm start was made for: the demo made its own
    assert res["warm_start"] == "made" and not (tmp_path / "warm_start" / "shipped_from.txt").exists()


@pytest.mark.slow
def test_demo_in_the_matched_regime_runs_the_w4a4_kv4_executor(tmp_path, capsys):
    import yaml

    assert main(["demo", "--out", str(tmp_path), "--regime", "matched", *TOY, "train.steps=1"]) == 0
    res = _result(capsys.readouterr().out)
    assert res["regime"] == "matched" and "W4A4-KV4" in (tmp_path / "demo.md").read_text()
    cfg = yaml.safe_load((tmp_path / "q-interq@matched-s0" / "config.yaml").read_text())
    assert (cfg["rollout"]["w_bits"], cfg["rollout"]["a_bits"], cfg["rollout"]["kv_bits"]) == (4, 4, 4)


@pytest.mark.slow
def test_compare_writes_table_curves_and_mismatch_plot(tmp_path, capsys):
    args = ["compare", "--out", str(tmp_path), "--arms", "q-tis,q-interq", "--seeds", "0,1", "--threshold", "0.0", *TOY]
    assert main(args) == 0
    res = _result(capsys.readouterr().out)
    assert res["seeds"] == [0, 1] and res["partial"] is False
    arms = res["regimes"]["natural"]
    assert arms["q-interq"]["learner_forward_passes_per_step"] == arms["q-tis"]["learner_forward_passes_per_step"]
    for arm in ("q-tis", "q-interq"):
        s = arms[arm]
        assert set(s) >= {"final_mean", "final_std", "ci95", "late_regression", "seeds"} and s["seeds"] == 2
        # the pooled interval holds the pooled mean (2 seeds x 2 held-out episodes)
        assert s["ci95"][0] <= s["final_mean"] <= s["ci95"][1]
    assert "q-interq - q-tis" in res["paired"]["natural"]
    md = (tmp_path / "compare.md").read_text()
    assert "| q-interq |" in md and "late regression" in md and "Command: `interq compare" in md
    assert (tmp_path / "curves.png").is_file() and (tmp_path / "mismatch.png").is_file()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "abs_prefix_logratio" in summary["accumulation"]["natural"]["q-tis"]
    assert "abs_Lambda" in summary["accumulation"]["natural"]["q-interq"]
    # a second invocation reuses the finished runs (resume) and gives the same table
    assert main(args) == 0
    assert (tmp_path / "compare.md").read_text().split("| arm |")[1].split("wall s")[0] == md.split("| arm |")[1].split("wall s")[0]


def test_compare_runs_extra_methods_as_q_arms(tmp_path, capsys):
    import yaml

    args = ["compare", "--out", str(tmp_path), "--arms", "q-interq", "--methods", "icepop", "--seeds", "0", *TOY,
            "train.steps=1"]
    assert main(args) == 0
    res = _result(capsys.readouterr().out)
    assert set(res["regimes"]["natural"]) >= {"q-interq", "q-icepop"}
    cfg = yaml.safe_load((tmp_path / "q-icepop-s0" / "config.yaml").read_text())
    assert cfg["algo"]["correction"] == "icepop" and cfg["algo"]["align"] is True
    assert cfg["rollout"]["executor"] == "w8a8"


def test_compare_rejects_an_unknown_arm_before_any_work(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["compare", "--out", str(tmp_path), "--methods", "magic", *TOY])
    assert e.value.code == 2
    assert "q-magic" in capsys.readouterr().err
    assert not (tmp_path / "warm_start").exists()


@pytest.mark.slow
def test_compare_regimes_budgets_and_a_partial_report(tmp_path, capsys):
    import yaml

    args = ["compare", "--out", str(tmp_path), "--arms", "bf16,q-interq", "--budgets", "inf", "--regimes",
            "natural,matched", "--seeds", "0", "--jobs", "2", *TOY, "train.steps=1"]
    # report-only before anything ran: every run is missing, nothing is trained
    assert main([*args, "--report-only"]) == 0
    res = _result(capsys.readouterr().out)
    assert res["partial"] is True and res["regimes"] == {}
    assert res["runs"] == {"planned": 5, "finished": 0, "unfinished": 0, "not_run": 5}
    assert not (tmp_path / "warm_start").exists()
    assert main(args) == 0
    res = _result(capsys.readouterr().out)
    assert set(res["regimes"]) == {"natural", "matched"} and res["partial"] is False
    assert res["runs"] == {"planned": 5, "finished": 5, "unfinished": 0, "not_run": 0}
    assert set(res["regimes"]["matched"]) == {"bf16", "q-interq", "q-interq-Binf"}
    # bf16 is one run shared by both regimes; the quantized arms run again under the matched executor
    dirs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir() and p.name != "warm_start")
    assert dirs == ["bf16-s0", "q-interq-Binf-s0", "q-interq-Binf@matched-s0", "q-interq-s0", "q-interq@matched-s0"]
    matched = yaml.safe_load((tmp_path / "q-interq-Binf@matched-s0" / "config.yaml").read_text())
    assert (matched["rollout"]["w_bits"], matched["rollout"]["a_bits"], matched["rollout"]["kv_bits"]) == (4, 4, 4)
    assert matched["algo"]["budget"] == float("inf") and matched["algo"]["correction"] == "interq"
    natural = yaml.safe_load((tmp_path / "q-interq-s0" / "config.yaml").read_text())
    assert natural["rollout"]["w_bits"] == 8 and natural["algo"]["budget"] == 0.5
    assert res["regimes"]["matched"]["bf16"] == res["regimes"]["natural"]["bf16"]
    md = (tmp_path / "compare.md").read_text()
    assert "Regime `matched`" in md and "95% CI" in md
    assert (tmp_path / "curves_matched.png").is_file() and (tmp_path / "mismatch_natural.png").is_file()
    # a run cut short (its log ends before the last step) is listed apart, not averaged with the finished ones
    log = tmp_path / "q-interq-s0" / "metrics.jsonl"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines() if json.loads(line).get("step", 0) < 1))
    assert main([*args, "--report-only"]) == 0
    out = capsys.readouterr().out
    res = _result(out)
    assert res["partial"] is True and "q-interq" not in res["regimes"]["natural"]
    assert res["runs"] == {"planned": 5, "finished": 4, "unfinished": 1, "not_run": 0}
    assert "partial: 1 of 5 runs unfinished (q-interq-s0)" in out
    assert set(res["regimes"]["matched"]) == {"bf16", "q-interq", "q-interq-Binf"}
    assert res["in_progress"]["q-interq-s0"]["step"] == 0 and res["in_progress"]["q-interq-s0"]["target"] == 1
    assert res["in_progress"]["q-interq-s0"]["last_eval_step"] == 0
    assert "Runs not finished" in (tmp_path / "compare.md").read_text() and "| q-interq-s0 | 0/1 |" in out


@pytest.mark.parametrize("value", ["0", "1.5"])
def test_compare_rejects_a_target_mde_outside_zero_to_one_before_any_work(tmp_path, capsys, value):
    assert main(["compare", "--out", str(tmp_path), "--target-mde", value, *TOY]) == 2
    assert "--target-mde" in capsys.readouterr().err
    assert not (tmp_path / "warm_start").exists()


def test_compare_rejects_an_unknown_regime_before_any_work(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["compare", "--out", str(tmp_path), "--regimes", "natural,extreme", *TOY])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "extreme" in err and "matched" in err
    assert not (tmp_path / "warm_start").exists()


def test_study_setting_resolves_for_every_arm_and_regime():
    """The study's built-in settings validate for the five arms in both regimes (no work is done)."""
    from interq.train.config import ARMS
    from interq.train.experiments import SETTINGS, plan_runs

    plan = plan_runs(list(ARMS) + ["q-interq-B0.1", "q-prefix_is"], [0, 1, 2], SETTINGS["study"], ["natural", "matched"])
    cfg = plan[("matched", "q-interq", 2)][1]
    assert (cfg.env.eval_split, cfg.env.num_eval_tasks, cfg.env.max_turns, cfg.train.steps) == ("valid_seen", 200, 12, 200)
    assert (cfg.rollout.w_bits, cfg.rollout.a_bits, cfg.rollout.kv_bits, cfg.train.seed) == (4, 4, 4, 2)
    assert plan[("matched", "bf16", 0)][0] == plan[("natural", "bf16", 0)][0] == "bf16-s0"
    assert plan[("matched", "q-interq-B0.1", 1)][1].algo.budget == 0.1
    assert plan[("natural", "q-prefix_is", 0)][1].algo.correction == "prefix_is"
    assert (cfg.env.action_format, cfg.rollout.max_action_tokens, cfg.model.num_layers) == ("text", 10, 4)
    # the study's first setting (docs/results.md, "The index-answer setting"): the action's number
    old = plan_runs(["q-interq"], [0], SETTINGS["study-index"], ["matched"])[("matched", "q-interq", 0)][1]
    assert (old.env.action_format, old.rollout.max_action_tokens, old.model.num_layers) == ("index", 4, 4)
    assert old.algo == cfg.algo and old.train.steps == cfg.train.steps and old.rollout.kv_bits == 4


@pytest.mark.parametrize("override", ["train.eval_every_steps=0", "env.num_eval_tasks=0"])
def test_compare_and_demo_refuse_runs_without_held_out_evaluation(tmp_path, capsys, override):
    for cmd in (["compare", "--arms", "bf16"], ["demo"]):
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--out", str(tmp_path), *TOY, override])
        assert e.value.code == 2
        assert override.split("=")[0] in capsys.readouterr().err
        assert not (tmp_path / "warm_start").exists()


def _run(final: str) -> list[dict]:
    """Records of a finished run: held-out outcomes ``final`` (one character per episode) at step 10, after 0101."""
    return [{"step": 0, "eval/success": 0.5, "eval/outcomes": "0101"},
            {"step": 10, "eval/success": final.count("1") / 4, "eval/outcomes": final}]


def test_paired_differences_use_the_seeds_both_arms_have():
    from interq.train.experiments import paired_differences, paired_table

    runs = {"bf16": [_run("1111"), _run("1110"), _run("1100")], "q-interq": [_run("1100"), _run("0000")]}
    # q-interq has seeds 0 and 2 (seed 1 unfinished): paired with bf16's seeds 0 and 2, not its first two runs
    out = paired_differences(runs, {"bf16": [0, 1, 2], "q-interq": [0, 2]})
    d = out["q-interq - bf16"]
    assert d["seed_ids"] == [0, 2] and d["seeds"] == 2 and d["episodes"] == 4
    assert d["diff"] == pytest.approx(((2 - 4) + (0 - 2)) / 2 / 4)  # mean over seeds and episodes
    assert d["per_seed"] == [pytest.approx(-0.5), pytest.approx(-0.5)]  # seed 0: 1100 vs 1111, seed 2: 0000 vs 1100
    assert d["ci95_seeds_and_tasks"][0] <= d["diff"] <= d["ci95_seeds_and_tasks"][1]
    assert "(seeds 0, 2)" in paired_table(out) and "-0.500 / -0.500" in paired_table(out)
    # the same difference in both seeds: no spread, so the fewest seeds a t test can use reach any target MDE
    assert d["seeds_for_mde"] == 2 and "| seeds for MDE 0.03 |" in paired_table(out)
    # without seeds: paired by position, which needs as many runs in both arms
    assert paired_differences(runs) == {}
    # no seed in common: no pair
    assert paired_differences(runs, {"bf16": [0, 1, 2], "q-interq": [3, 4]}) == {}


def test_the_paired_table_rounds_whole_values_not_the_results_rounded_ones():
    """The RESULT line rounds to 4 decimals; the table formats 3 from the whole value: rounding twice would turn a
    mean of -0.081474 into -0.0815 and then -0.082."""
    from interq.train.experiments import _rounded_tree, paired_differences, paired_table

    runs = {"bf16": [_run("1111")] * 3, "q-interq": [_run("0111"), _run("1111"), _run("1111")]}
    d = paired_differences(runs, {a: [0, 1, 2] for a in runs})["q-interq - bf16"]
    assert d["diff"] == pytest.approx(-1 / 12, abs=1e-12) and d["per_seed"] == [-0.25, 0.0, 0.0]  # not rounded
    assert _rounded_tree({"q-interq - bf16": d})["q-interq - bf16"]["diff"] == -0.0833
    assert "| -0.081 |" in paired_table({"q - b": {**d, "diff": -1.548 / 19}})


def test_a_runs_wall_time_sums_its_phases_and_its_cpu_time_is_apart():
    """time/env is inside the rollout's wall time and the *_cpu fields are CPU seconds: neither adds to the wall."""
    from interq.train.experiments import markdown_table, summarize

    step = {"time/rollout": 3.0, "time/learner": 2.0, "time/sync": 0.5, "time/env": 1.0, "time/rollout_cpu": 2.5,
            "time/learner_cpu": 4.0}
    recs = [{"step": 0, "eval/success": 0.5, "time/eval": 7.0}, {"step": 1, **step},
            {"step": 2, **step, "eval/success": 0.75, "time/eval": 7.0}]
    s = summarize({"a": [recs], "b": [[{k: v for k, v in r.items() if not k.endswith("_cpu")} for r in recs]]}, 0.6)
    assert s["a"]["wall_s"] == pytest.approx(7.0 + 2 * (3.0 + 2.0 + 0.5) + 7.0)
    assert s["a"]["cpu_s"] == pytest.approx(2 * (2.5 + 4.0))
    assert math.isnan(s["b"]["cpu_s"]) and s["b"]["wall_s"] == s["a"]["wall_s"]  # records without CPU times
    rows = markdown_table(s, 0.6).splitlines()
    assert rows[2].endswith("| 25 | 13 |") and rows[3].endswith("| 25 | - |")


def test_the_learning_difference_is_the_paired_mean_over_evaluations_after_step_zero():
    """Against a naive loop: per seed, the mean over steps > 0 of A's held-out success minus B's, then a paired t
    over the seeds both arms have; a run evaluated at other steps leaves no learning row."""
    import statistics

    from interq.train.experiments import learning_difference, paired_differences, paired_table
    from interq.train.stats import student_t_quantile

    def run(curve):  # held-out success at steps 0, 50, 100, 150
        return [{"step": 50 * i, "eval/success": x, "eval/outcomes": "1" * round(4 * x) + "0" * (4 - round(4 * x))}
                for i, x in enumerate(curve)]

    a = {0: [0.5, 0.75, 0.75, 1.0], 1: [0.5, 0.5, 1.0, 1.0], 2: [0.5, 0.5, 0.5, 0.75], 3: [0.5, 1.0, 1.0, 1.0]}
    b = {0: [0.5, 0.5, 0.75, 0.75], 1: [0.5, 0.5, 0.5, 1.0], 2: [0.5, 0.5, 0.5, 0.5], 4: [0.0, 0.0, 0.0, 0.0]}
    runs = {"q-interq": [run(c) for c in a.values()], "q-align": [run(c) for c in b.values()]}
    seeds = {"q-interq": list(a), "q-align": list(b)}
    d = learning_difference(runs, seeds, "q-interq", "q-align")
    naive = [sum(x - y for x, y in zip(a[s][1:], b[s][1:])) / 3 for s in (0, 1, 2)]  # seed 3 and 4: one arm only
    assert d["per_seed"] == pytest.approx(naive) and d["diff"] == pytest.approx(statistics.mean(naive))
    half = student_t_quantile(0.975, 2) * statistics.stdev(naive) / 3 ** 0.5
    assert d["ci95_paired_t"] == pytest.approx([statistics.mean(naive) - half, statistics.mean(naive) + half])
    assert d["steps"] == [50, 100, 150] and d["seeds"] == 3
    assert d["by_step"] == pytest.approx([sum(a[s][i] - b[s][i] for s in (0, 1, 2)) / 3 for i in (1, 2, 3)])
    assert d["diff"] > 0 and d["p_sign_flip"] == 0.25  # all three seeds positive: the smallest exact p of 3 seeds
    pair = paired_differences(runs, seeds)["q-interq - q-align"]
    assert pair["learning"]["per_seed"] == d["per_seed"]
    assert "evaluations at steps 50, 100, 150" in paired_table({"q-interq - q-align": pair})
    runs["q-align"][0] = runs["q-align"][0][:2] + runs["q-align"][0][3:]  # seed 0 of B not evaluated at step 100
    assert learning_difference(runs, seeds, "q-interq", "q-align") is None


def test_budget_trend_fits_success_against_log_budget_over_common_seeds():
    from interq.train.experiments import budget_trend, budget_trend_line

    runs = {"q-interq-B0.1": [_run("1000"), _run("0000")], "q-interq": [_run("1100"), _run("1000")],  # q-interq: B = 1
            "q-interq-B10": [_run("1110"), _run("1100")], "q-interq-B100": [_run("1111"), _run("1110"), _run("1111")],
            "q-interq-Binf": [_run("0000"), _run("0000")], "bf16": [_run("1111"), _run("1111")]}
    seeds = {"q-interq-B0.1": [0, 1], "q-interq": [0, 1], "q-interq-B10": [0, 1], "q-interq-B100": [0, 1, 2],
             "q-interq-Binf": [0, 1], "bf16": [0, 1]}
    t = budget_trend(runs, seeds, base_budget=1.0)
    assert t["arms"] == ["q-interq-B0.1", "q-interq", "q-interq-B10", "q-interq-B100"]  # inf and bf16 are off the axis
    assert t["budgets"] == [0.1, 1.0, 10.0, 100.0] and t["seed_ids"] == [0, 1] and (t["seeds"], t["episodes"]) == (2, 4)
    assert t["means"] == [0.125, 0.375, 0.625, 0.875]  # B100 over seeds 0-1 only: (4 + 3) / 8
    assert t["slope_per_decade"] == pytest.approx(0.25)  # exactly linear in log10(B): +0.25 per decade
    assert t["ci95_seeds_and_tasks"][0] <= 0.25 <= t["ci95_seeds_and_tasks"][1]
    assert "+0.250 per decade of B" in budget_trend_line(t)
    # fewer than three finite budgets: no trend; nothing printed
    assert budget_trend({a: runs[a] for a in ("q-interq", "q-interq-B10", "q-interq-Binf")}, seeds, 1.0) is None
    assert budget_trend_line(None) == ""


def test_paired_differences_compare_the_two_existing_fixes():
    """Alignment and token-level TIS, the two fixes InterQ is measured against, are also compared with each other
    (alignment minus TIS), beside the pairs against q-interq and bf16."""
    from interq.train.experiments import paired_differences

    runs = {"q-tis": [_run("1110"), _run("1100")], "q-align": [_run("1000"), _run("1100")],
            "q-interq": [_run("1111"), _run("1110")]}
    out = paired_differences(runs, {a: [0, 1] for a in runs})
    assert set(out) == {"q-interq - q-tis", "q-interq - q-align", "q-align - q-tis"}
    assert out["q-align - q-tis"]["per_seed"] == [pytest.approx(-0.5), pytest.approx(0.0)]
    assert out["q-align - q-tis"]["diff"] == pytest.approx(-0.25)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_a_jobs_worker_stops_when_the_comparing_process_dies(tmp_path):
    """A ``--jobs`` worker gets SIGTERM when the process that started it dies (killed with SIGKILL here), rather than
    training on as an orphan that keeps its run directory locked."""
    import signal
    import subprocess
    import textwrap
    import time

    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing as mp, os, sys, time
        from concurrent.futures import ProcessPoolExecutor
        from interq.train.experiments import _worker_init
        if __name__ == "__main__":
            pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                                       initargs=(os.getpid(),))
            print(pool.submit(os.getpid).result(), flush=True)
            pool.submit(time.sleep, 120)
            time.sleep(120)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())

    def alive(pid: int) -> bool:  # a zombie nobody reaped yet has exited
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    assert alive(worker)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 20
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(worker):
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the worker outlived the comparing process")
