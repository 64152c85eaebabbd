"""``policyzoo train --dry-run`` refuses everything the real run refuses before its weights load.

The real run's pre-load phase is ``session.prepare``; it raises nothing itself and calls
``checks.preload``, which the dry run calls too. The refusal sites of ``preload`` (its ``raise``
statements and the checks it calls) are enumerated from its source: each must have a case below
(or be listed as unable to refuse), and each case must be refused by both, with the same ``where``."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from pathlib import Path

import pytest
from _engine_helpers import tiny_model

from policyzoo.catalog import get_catalog
from policyzoo.cli import main
from policyzoo.engine import device, dist
from policyzoo.engine.run import preload as checks  # the pre-load phase
from policyzoo.engine.run import session
from policyzoo.errors import UserError
from policyzoo.run_config import load_config

PARTS = (checks.preload, checks._preload, checks._fit_model, checks._check_run_dir)
#: calls in PARTS that cannot refuse a run (they build values or warnings from checked input)
CANNOT_REFUSE = {"dist.world_size", "datetime.now", "dist.broadcast", "RunDir", "encode_prompt", "tok", "list",
                 "len", "min", "max", "getattr", "resolved_view", "system_turn_warning", "sampling_warning",
                 "old_train_settings", "rows_drawn", "optimizer_notes", "PreLoad", "ModelFit", "RunPlace", "_warnings",
                 "env.env", "count",
                 "rundir.latest", "row.get", "_fit_model", "_check_run_dir", "str", "ConfigError", "ResumeError",
                 "get_catalog", "warnings.catch_warnings", "warnings.simplefilter", "Path", "w.message",
                 "Path(w.filename).resolve", "str(Path(w.filename).resolve()).startswith", "issubclass",
                 "pre.warnings.append", "warnings.warn_explicit", "_preload", "Path(__file__).resolve",
                 "lr_plan", "resume_schedule", "rundir.claim", "encode_text",
                 "check_sampling_options", "dict", "filter_bias_warning", "state.get", "local_world_size", "any",
                 "LengthCache", "cache_dir", "cache.wrap", "cache.save", "time.perf_counter", "run.components",
                 "comp.notes", "run_warnings", "notes_and_warnings", "gpu_profile.on_gpu", "algo.replace"}
# LengthCache and its wrap/save: an unreadable or unwritable cache is skipped, never refused;
# run.components and comp.notes: the components' lines for the dry run (text; the sandbox's refusals
# happen when it is built, in Run);
# run_warnings: the gradient probe (policyzoo.equivalence) turns any failure into a line, never a refusal;
# get_catalog: see check_same_catalog; check_sampling_options: both engines honour every option today
# (tests/test_sampling_paths.py refuses one an engine does not name); algo.replace: the default folder's
# name (str.replace)


def _name(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return "?"


def refusal_sites() -> set[str]:
    """``raise:<where>`` for every raise, the dotted name of every other call, in PARTS."""
    sites = set()
    for fn in PARTS:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise):
                first = node.exc.args[0]
                sites.add(f"raise:{first.value if isinstance(first, ast.Constant) else ast.unparse(first)}")
            elif isinstance(node, ast.Call):
                sites.add(_name(node.func))
    return {s for s in sites if s not in CANNOT_REFUSE and not s.startswith("?")}


def _rows(tmp_path, rows, name="data.jsonl"):
    f = tmp_path / name
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def _checkpoint(tmp_path, step=2):
    run = tmp_path / "old-run"
    (run / "checkpoints" / f"step-{step}").mkdir(parents=True)
    (run / "checkpoints" / f"step-{step}" / "state.json").write_text(json.dumps({"step": step, "batches": step}))
    (run / "checkpoints" / "latest.json").write_text(json.dumps({"path": f"step-{step}"}))
    return run


GOOD = [{"prompt": f"what is {i} + 1?", "answer": str(i + 1)} for i in range(8)]
LONG = GOOD + [{"prompt": "x " * 900, "answer": "1"}]  # 900+ tokens of a 1024-token context less 12

#: site -> [(label, setup(tmp_path, monkeypatch) -> (overrides, resume), expected where)]
CASES = {
    "check_ranks": [("3 ranks, 2 prompts", lambda t, m: (m.setenv("WORLD_SIZE", "3"), [])[1],
                     "train.prompts_per_step")],
    "_device_profile": [("GPUs torch cannot see", lambda t, m: (m.setattr(device, "nvidia_present", lambda: True),
                                                                m.delenv("CUDA_VISIBLE_DEVICES", raising=False),
                                                                [])[2], "torch")],
    # a step too large for the GPU: tests/test_gpu_profile.py (a 7B shape; the tiny model fits any GPU)
    "gpu_fit.plan_profile": [("a GPU the planner does not know", lambda t, m: ["engine.plan_gpu=tpu-v5"],
                              "engine.plan_gpu"),
                             ("vLLM's batched tokens below the context on CPU",
                              lambda t, m: ["engine.vllm_max_num_batched_tokens=8"],
                              "engine.vllm_max_num_batched_tokens")],
    "check_vllm_threads": [("threads against OMP", lambda t, m: (m.setenv("OMP_NUM_THREADS", "1"),
                                                                   ["engine.rollout=vllm", "engine.threads=3"])[1],
                            "engine.threads")],
    "dist.check_same_catalog": [("unknown plugin allowlist", lambda t, m: (m.setenv("POLICYZOO_PLUGINS", "no-such"),
                                                                             [])[1], "POLICYZOO_PLUGINS")],
    "load_task": [
        ("missing data file", lambda t, m: [f"data.path={t / 'nope.jsonl'}"], "data"),
        ("no prompt column", lambda t, m: [f"data.path={_rows(t, [{'question': 'q', 'answer': '1'}] * 4)}"], "data"),
        ("empty data file", lambda t, m: [f"data.path={_rows(t, [])}"], "data"),
    ],
    "resolve_algorithm": [("unknown clip", lambda t, m: ["algorithm.clip.use=no_such_clip"], "algorithm")],
    "reward_uses": [("empty rewards", lambda t, m: ["rewards=[]"], "rewards")],
    "Run": [("two samplers", lambda t, m: ["algorithm.sample=[{use: group_sample}, {use: group_sample}]"],
             "algorithm")],
    "check_answers": [("no answer column", lambda t, m: [f"data.path={_rows(t, [{'prompt': 'q'}] * 4)}",
                                                         "rewards=[{use: answer_match}]"], "data")],
    "rules.check_run": [  # the cross-section rules that read the run (policyzoo.rules)
        ("overlap with an env", lambda t, m: ["engine.overlap=one_step", "algorithm.env.use=calculator"],
         "engine.overlap"),
        ("async with an env", lambda t, m: ["engine.max_staleness=1", "algorithm.env.use=calculator"],
         "engine.max_staleness"),
        ("async and overlap", lambda t, m: ["engine.max_staleness=2", "engine.overlap=one_step"],
         "engine.max_staleness")],
    "check_trackers": [("tracker not installed", lambda t, m: ["train.report_to=[wandb]"], "report_to")],
    "check_device_options": [("vLLM sleep mode on CPU", lambda t, m: ["engine.vllm_sleep=1"], "engine.vllm_sleep")],
    "check_tensor_parallel": [("vLLM TP 2 on one rank", lambda t, m: ["engine.vllm_tensor_parallel_size=2"],
                               "engine.vllm_tensor_parallel_size")],
    # the tiny model has 4 attention heads: 3 ranks sharing one engine 3 ways cannot shard them
    "check_heads": [("vLLM TP 3 of 4 heads", lambda t, m: (m.setenv("WORLD_SIZE", "3"), [
        "engine.vllm_tensor_parallel_size=3", "train.prompts_per_step=3"])[1], "engine.vllm_tensor_parallel_size")],
    "check_engine": [("missing DeepSpeed config", lambda t, m: [f"engine.deepspeed={t / 'ds.json'}"], "deepspeed")],
    "step_settings": [("clip params for the loss", lambda t, m: ["algorithm.reduce.use=no_such_reduce"], "algorithm")],
    "resolve_model": [("missing model folder", lambda t, m: [f"model.path={t / 'no-model'}"], "model.path")],
    "raise:key": [("response longer than the context", lambda t, m: ["algorithm.sample.max_tokens=5000"],
                   "algorithm.sample.max_tokens")],
    "connect_servers": [("rollout server mode without servers", lambda t, m: ["engine.rollout=server"],
                         "engine.servers")],  # unreachable / another model: tests/test_server_engine.py
    "check_chat_template": [("chat prompts, no template", lambda t, m: [f"model.path={_no_template(t)}",
                                                                        "data.name=gsm8k"], "model.path")],
    "fit_prompts": [("over-long prompt", lambda t, m: [f"data.path={_rows(t, LONG)}",
                                                        "data.on_long_prompt=error"], "data")],
    "check_teacher": [("distill term without a teacher", lambda t, m: ["algorithm.term=[{use: distill}]"],
                       "algorithm.term"),
                      ("teacher with another vocabulary", lambda t, m: ["algorithm.term=[{use: distill}]",
                                                                        "algorithm.kl=null",
                                                                        f"model.teacher={_swapped_vocab(t)}"],
                       "model.teacher")],
    "raise:str(resume)": [("resume without checkpoint", lambda t, m: ([], str((t / "empty-run").mkdir() or
                                                                            t / "empty-run"))[0:2], "empty-run")],
    "check_resume": [("resume past train.steps", lambda t, m: (["train.steps=2"], str(_checkpoint(t))), "step-2")],
    "run.load_state_dict": [("adaptive KL resumed from a checkpoint without its state",
                                 lambda t, m: (m.setattr(checks, "check_resume", lambda *a: []),
                                               ["algorithm.kl.use=adaptive"], str(_checkpoint(t)))[1:],
                                 "step-2.components")],
    "raise:out": [("output dir holds a run", lambda t, m: [f"output_dir={_checkpoint(t)}"], "old-run")],
    "rundir.check_live": [("output dir of a live run", lambda t, m: [f"output_dir={_live(t)}"], "live-run"),
                               ("resume of a live run", lambda t, m: ([], str(_live(t))), "live-run")],
    "rundir.check_new": [("output dir is a file", lambda t, m: [f"output_dir={_rows(t, [], 'a-file')}"],
                              "output_dir"),
                             ("output dir where no file can be made", lambda t, m: ["output_dir=/proc/pz_run"],
                              "output_dir /proc/pz_run"),
                             ("output dir holding the user's config.yaml", lambda t, m: [
                                 f"output_dir={_rows(t, [], 'mine/config.yaml').parent}"], "output_dir"),
                             ("output dir holding a killed run's metrics", lambda t, m: [
                                 f"output_dir={_rows(t, [{'step': 1}], 'killed/metrics.jsonl').parent}"],
                              "output_dir")],
    # an env with its own data set (verifiers, tests/verifiers_envs): its rows, then their prompts
    "run.env.task_rows": [("verifiers env with an empty dataset", lambda t, m: (
        m.syspath_prepend(str(TESTS / "verifiers_envs")), ["algorithm.env.use=verifiers",
                                                           "algorithm.env.id=vf_sum_weighted",
                                                           "algorithm.env.args={n: 0, eval_n: 2}"])[1],
        "algorithm.env (verifiers: vf_sum_weighted), dataset")],
    "env_task": [("verifiers prompt ending with the assistant", lambda t, m: (
        m.syspath_prepend(str(TESTS)), ["algorithm.env.use=verifiers",
                                        "algorithm.env.id=test_preflight:assistant_last_env"])[1],
        "env verifiers, training row 0")],
}
TESTS = Path(__file__).resolve().parent


def assistant_last_env():
    """A verifiers environment whose one prompt ends with an assistant message (nothing to answer)."""
    import verifiers as vf
    from datasets import Dataset

    rows = [{"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "answer": "1"}]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric())


def _live(tmp_path):
    """A run folder whose run.pid names a live process of this host (pytest's parent)."""
    import os

    run = _checkpoint(tmp_path).rename(tmp_path / "live-run")
    (run / "run.pid").write_text(json.dumps({"pid": os.getppid(), "host": os.uname().nodename, "started": "now"}))
    return run


def _swapped_vocab(tmp_path):
    """A copy of the tiny model whose tokenizer gives two tokens each other's ids."""
    import shutil

    folder = tmp_path / "swapped-vocab"
    shutil.copytree(tiny_model(), folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def _no_template(tmp_path):
    import shutil

    folder = tmp_path / "no-template"
    shutil.copytree(tiny_model(), folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    return folder


def test_every_refusal_site_of_the_pre_load_phase_has_a_case():
    # session.prepare refuses only through preload: it raises nothing of its own
    prepare = ast.parse(textwrap.dedent(inspect.getsource(session.prepare)))
    assert not [n for n in ast.walk(prepare) if isinstance(n, ast.Raise)]
    assert "preload" in {_name(n.func) for n in ast.walk(prepare) if isinstance(n, ast.Call)}
    found = refusal_sites()
    assert found == set(CASES), (f"sites without a case: {sorted(found - set(CASES))}; "
                                 f"cases of no site: {sorted(set(CASES) - found)}")


CASE_LIST = [(site, label, setup, where) for site, cases in CASES.items() for label, setup, where in cases]


@pytest.mark.parametrize("site,label,setup,where", CASE_LIST, ids=[f"{c[0]}-{c[1]}" for c in CASE_LIST])
def test_the_real_run_and_the_dry_run_refuse_alike(site, label, setup, where, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dist, "init", lambda timeout_s=600.0: None)  # joining a process group is no check
    got = setup(tmp_path, monkeypatch)
    overrides, resume = got if isinstance(got, tuple) else (got, None)
    data = [] if any(o.startswith("data.") for o in overrides) else [f"data.path={_rows(tmp_path, GOOD, 'good.jsonl')}"]
    base = [f"model.path={tiny_model()}", "algorithm.sample.max_tokens=12", "train.prompts_per_step=2",
            f"output_dir={tmp_path / 'new-run'}", "rewards=[{use: answer_match}]", *data]
    args = [*base, *overrides]  # later overrides win
    get_catalog.cache_clear()
    try:
        with pytest.raises(UserError) as real:
            session.prepare(load_config(None, "grpo", args), resume)
        get_catalog.cache_clear()
        cli = ["train", "--algo", "grpo", "--dry-run", *args] + (["--resume", resume] if resume else [])
        assert main(cli) == 2, f"the dry run accepted what the real run refused: {real.value}"
    finally:
        get_catalog.cache_clear()
    err = capsys.readouterr().err
    assert where in real.value.where, real.value
    assert "".join(real.value.where.split()) in "".join(err.split()), err  # the same refusal, same place
    assert not (tmp_path / "new-run").exists()  # neither created the run folder


def test_a_good_dry_run_passes_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path / "cache"))
    args = [f"model.path={tiny_model()}", "algorithm.sample.max_tokens=12", "train.prompts_per_step=2",
            f"data.path={_rows(tmp_path, GOOD)}", "rewards=[{use: answer_match}]"]
    assert main(["train", "--algo", "grpo", "--dry-run", "--output-dir", str(tmp_path / "run"), *args]) == 0
    assert "every check before loading weights passed" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def _base(tmp_path, rows=GOOD):
    return [f"model.path={tiny_model()}", "algorithm.sample.max_tokens=12", "train.prompts_per_step=2",
            f"data.path={_rows(tmp_path, rows)}", "rewards=[{use: answer_match}]", f"output_dir={tmp_path / 'run'}"]


def test_a_component_warning_comes_as_the_products_warning_not_a_python_one(tmp_path, monkeypatch, recwarn, capsys):
    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path / "cache"))
    extra = ["algorithm.ratio.use=sequence", "algorithm.reduce.use=token_sum"]  # length-weighted sequence ratio
    pre = checks.preload(load_config(None, "grpo", [*_base(tmp_path), *extra]), dry_run=True)
    assert [w for w in pre.warnings if w.startswith("algorithm.reduce (token_sum): the sequence-level ratio")]
    assert not [w for w in recwarn if "sums the loss" in str(w.message)]  # no raw UserWarning line
    assert main(["train", "--algo", "grpo", "--dry-run", *_base(tmp_path), *extra]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "warning: algorithm.reduce (token_sum): the sequence-level ratio" in err and "assembly.py" not in err


def test_dropped_long_prompts_are_named_by_their_file_row(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path / "cache"))
    rows = GOOD[:3] + [LONG[-1]] + GOOD[3:] + [LONG[-1]]  # file rows 3 and 9 (0-based) are too long
    pre = checks.preload(load_config(None, "grpo", [*_base(tmp_path, rows), "data.on_long_prompt=drop"]),
                         dry_run=True)
    (w,) = [w for w in pre.warnings if w.startswith("dropped")]
    where = f"data.path ({tmp_path / 'data.jsonl'})"
    assert f"{where}, row 3; {where}, row 9 (data.on_long_prompt: drop" in w, w
    assert len(pre.task.train_rows) + len(pre.task.eval_rows) == 8


def test_every_run_warning_reaches_the_console_startup_log_and_summary(tmp_path):
    from types import SimpleNamespace

    from _engine_helpers import stand_in_part
    from rich.console import Console

    from policyzoo.engine.run.loop import RunLoop
    from policyzoo.engine.rundir import RunDir

    pre = SimpleNamespace(rundir=RunDir(tmp_path / "run"), state={"step": 2, "tokens_seen": 0}, rows_drawn=0,
                          run=SimpleNamespace(bundle=SimpleNamespace(name="grpo"), reward=()),
                          model=SimpleNamespace(path=tmp_path), task_rewards_n=0, prompt_counts={})
    console = Console(file=open(tmp_path / "console.txt", "w"), width=300)
    trainer = SimpleNamespace(export=lambda path: None, models_loaded=lambda: 1, trainable_params=1, stage=0,
                              share_prompt=False, share_prompt_check=None)
    s = stand_in_part(load_config(None, "grpo", []), console, pre, trainer=trainer,
                      tracker=SimpleNamespace(close=lambda: None))
    s.rundir.path.mkdir()
    s.warnings.warn("first")
    s.warnings.warn("step 3: second")
    s.console.file.flush()
    assert (tmp_path / "console.txt").read_text().splitlines() == ["warning: first", "warning: step 3: second"]
    assert (s.rundir.path / "startup.log").read_text().splitlines() == ["warning: first", "warning: step 3: second"]
    # finish() writes them into summary.json
    loop = RunLoop(s)
    loop.last_saved, loop.last_eval = 2, {"step": 2}
    loop.first_eval = lambda: None
    loop.finish()
    assert json.loads((s.rundir.path / "summary.json").read_text())["warnings"] == ["first", "step 3: second"]


def test_run_pid_of_a_dead_or_this_process_does_not_hold_the_folder(tmp_path):
    import os
    import subprocess
    import sys

    from policyzoo.engine.rundir import RunDir

    rd = RunDir(tmp_path / "run")
    rd.claim()  # this process: not "another live run"
    assert json.loads((rd.path / "run.pid").read_text())["pid"] == os.getpid() and rd.live_owner() is None
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (rd.path / "run.pid").write_text(json.dumps({"pid": int(dead.stdout), "host": os.uname().nodename}))
    rd.check_live()  # a killed run's pid file is ignored
    (rd.path / "run.pid").write_text(json.dumps({"pid": os.getppid(), "host": os.uname().nodename}))
    with pytest.raises(UserError, match="a live run"):
        rd.check_live()
