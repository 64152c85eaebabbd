"""Local files and `datasets` folders through the prompt/answer column mapping, and their errors."""

import json

import pytest

from policyzoo.data import DataSettings, load_task, normalize_number
from policyzoo.errors import ConfigError, DataError

ROWS = [{"q": f"What is {i} + 1?", "a": str(i + 1), "level": i % 3} for i in range(12)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def load(path, **kw):
    return load_task(DataSettings(path=str(path), prompt_column="q", answer_column="a", **kw))


def test_jsonl_rows_map_to_chat_prompts_and_keep_other_columns(tmp_path):
    task = load(write_jsonl(tmp_path / "d.jsonl", ROWS), eval_size=2, system_prompt="Be brief.")
    assert len(task.train_rows) == 10 and len(task.eval_rows) == 2
    row = next(r for r in task.train_rows if r["q"] == "What is 4 + 1?")
    assert row["prompt"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 4 + 1?"}]
    assert row["answer"] == "5" and row["level"] == 1  # 4 + 1 = 5; 4 % 3 = 1
    assert [u.name for u in task.default_rewards] == ["math_verify"]
    # held-out rows and training rows partition the file
    assert sorted(r["q"] for r in task.train_rows + task.eval_rows) == sorted(r["q"] for r in ROWS)


def test_held_out_split_is_seeded_and_training_rows_keep_file_order(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    a, b, c = load(path, eval_size=3, seed=1), load(path, eval_size=3, seed=1), load(path, eval_size=3, seed=2)
    assert a.eval_rows == b.eval_rows and a.eval_rows != c.eval_rows
    order = [int(r["a"]) for r in a.train_rows]
    assert order == sorted(order)


def test_limit_and_few_shot_from_the_file(tmp_path):
    task = load(write_jsonl(tmp_path / "d.jsonl", ROWS), eval_size=0, few_shot=1, limit=4)
    # first row is the example (0 + 1 = 1), then the first 4 of the rest
    assert [r["q"] for r in task.train_rows] == [f"What is {i} + 1?" for i in (1, 2, 3, 4)]
    assert task.train_rows[0]["prompt"] == [
        {"role": "user", "content": "What is 0 + 1?"}, {"role": "assistant", "content": "1"},
        {"role": "user", "content": "What is 1 + 1?"}]


def test_json_and_parquet_and_message_prompts(tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "2+2?"}], "answer": 4},
            {"prompt": "3+3?", "answer": 6.0}]
    (tmp_path / "d.json").write_text(json.dumps(rows))
    task = load_task(DataSettings(path=str(tmp_path / "d.json"), eval_size=0, system_prompt="default"))
    # a row's own system message wins; a string prompt gets the configured one; 6.0 -> "6"
    assert task.train_rows[0]["prompt"][0] == {"role": "system", "content": "S"}
    assert task.train_rows[1]["prompt"] == [{"role": "system", "content": "default"},
                                            {"role": "user", "content": "3+3?"}]
    assert [r["answer"] for r in task.train_rows] == ["4", "6"]

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    assert load(tmp_path / "d.parquet", eval_size=0).train_rows[3]["answer"] == "4"  # 3 + 1


def test_datasets_folder_with_splits(tmp_path):
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:8]),
                               "test": datasets.Dataset.from_list(ROWS[8:])})
    dd.save_to_disk(str(tmp_path / "ds"))
    task = load(tmp_path / "ds", eval_split="test", eval_size=3)
    assert len(task.train_rows) == 8 and [r["a"] for r in task.eval_rows] == ["9", "10", "11"]
    with pytest.raises(DataError, match="no split 'tran'.*did you mean 'train'"):
        load(tmp_path / "ds", split="tran")


def test_uncached_datasets_name_is_an_error_not_a_download():
    with pytest.raises(DataError, match="not a built-in task.*local `datasets` cache"):
        load_task(DataSettings(name="nobody/no-such-dataset-xyz"))


def test_answers_are_normalised_numbers():
    assert normalize_number(" 1,000 ") == "1000" and normalize_number("+3.50") == "3.50"
    assert normalize_number(-7) == "-7" and normalize_number(5.0) == "5" and normalize_number(0.25) == "0.25"
    for bad in ("12 apples", "$5", "1,00", "", True, None, float("nan"), "1/2"):
        assert normalize_number(bad) is None, bad


# ------------------------------------------------------------------------------------ errors
def test_missing_file(tmp_path):
    with pytest.raises(DataError) as e:
        load_task({"path": str(tmp_path / "nope.jsonl")})
    assert "no such file" in e.value.why and "nope.jsonl" in e.value.why and e.value.fix


def test_unknown_format(tmp_path):
    (tmp_path / "d.txt").write_text("q,a\n")
    with pytest.raises(DataError, match="unknown data format '.txt'") as e:
        load_task({"path": str(tmp_path / "d.txt")})
    assert ".jsonl" in e.value.fix and ".csv" in e.value.fix


def test_missing_column_lists_columns_and_suggests(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(DataError) as e:
        load_task({"path": path, "prompt_column": "qq", "answer_column": "a"})
    assert "no column 'qq'" in e.value.why and "did you mean 'q'" in e.value.why
    assert "columns are: q, a, level" in e.value.why and "prompt_column" in e.value.where


def test_empty_data_set(tmp_path):
    (tmp_path / "d.jsonl").write_text("\n")
    with pytest.raises(DataError, match="empty"):
        load_task({"path": str(tmp_path / "d.jsonl")})


def test_non_numeric_answer_names_the_row(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[7]["a"] = "eight"
    with pytest.raises(DataError) as e:
        load(write_jsonl(tmp_path / "d.jsonl", rows))
    assert "row 7" in e.value.where and "'eight' is not a number" in e.value.why and "answer_type: text" in e.value.fix
    assert load(tmp_path / "d.jsonl", answer_type="text", eval_size=0).train_rows[7]["answer"] == "eight"


def test_bad_rows_and_bad_json(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"q": "x", "a": 1}\n{"q": "y", "a": \n')
    with pytest.raises(DataError, match="line 2"):
        load(tmp_path / "d.jsonl")
    (tmp_path / "d.json").write_text('{"q": "x"}')
    with pytest.raises(DataError, match="list of objects"):
        load(tmp_path / "d.json")
    write_jsonl(tmp_path / "m.jsonl", [{"q": [{"role": "user", "content": "x"}], "a": 1},
                                       {"q": [{"role": "robot", "content": "x"}], "a": 1}])
    with pytest.raises(DataError) as e:
        load(tmp_path / "m.jsonl")
    assert "row 1" in e.value.where and "message 0" in e.value.where


def test_nothing_left_to_train_on(tmp_path):
    with pytest.raises(DataError, match="no training rows left") as e:
        load(write_jsonl(tmp_path / "d.jsonl", ROWS), eval_size=0, few_shot=12)
    assert "eval_size" in e.value.fix


def test_repeating_prompts_are_named_with_a_fix_that_acts(tmp_path):
    # 40 rows, 4 distinct prompts (each repeated 10 times): eval_size=10 is < half of 40 rows, so 10 distinct
    # prompts are asked for; only 4 exist, all 4 are held out and their 36 repeats leave training -> 0 rows left
    rows = [{"q": f"What is {i % 4} + 1?", "a": str(i % 4 + 1)} for i in range(40)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError) as e:
        load(path, eval_size=10)
    assert "the prompts repeat: 4 distinct of 40 rows" in e.value.why
    assert "split by distinct prompt" in e.value.why and "lower data.eval_size" not in e.value.fix
    # (4 - 1) // 4 = 0 -> at least 1 prompt held out, 4 - 1 = 3 left
    assert "hold out fewer prompts (data.eval_size=1 leaves 3 to train on)" in e.value.fix
    assert "data.eval_path" in e.value.fix
    # the fix acts: one held-out prompt (its 10 rows held out as 1 row + 9 left out), 3 prompts x 10 rows train
    task = load(path, eval_size=1)
    assert (len(task.eval_rows), len(task.train_rows)) == (1, 30)
    assert (len(load(path, eval_size=0).train_rows)) == 40  # and no held-out set: every row trains
    one = write_jsonl(tmp_path / "one.jsonl", [{"q": "What is 1 + 1?", "a": "2"}] * 10)  # 1 prompt: none to spare
    with pytest.raises(DataError) as e:
        load(one, eval_size=2)
    assert "1 distinct of 10 rows" in e.value.why
    assert "fewer prompts" not in e.value.fix and "eval_size=0" in e.value.fix


def test_eval_size_never_takes_a_small_file(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    # 12 rows: a count of 6 or more would hold out half of them or more -> none held out, one warning
    for asked in (6, 12, 100):
        task = load(path, eval_size=asked)
        assert (len(task.eval_rows), len(task.train_rows)) == (0, 12)
        assert len(task.warnings) == 1 and f"eval_size={asked} would leave {max(12 - asked, 0)} of the 12 rows" \
            in task.warnings[0]
        assert "fraction" in task.warnings[0]
    task = load(path, eval_size=5)  # 2 x 5 = 10 < 12: held out as asked
    assert (len(task.eval_rows), len(task.train_rows), task.warnings) == (5, 7, [])
    task = load(path, eval_size=0.25)  # a fraction: 0.25 x 12 = 3 rows
    assert (len(task.eval_rows), len(task.train_rows), task.warnings) == (3, 9, [])
    held = {r["q"] for r in task.eval_rows}
    assert held.isdisjoint(r["q"] for r in task.train_rows)


def test_unknown_setting_is_a_config_error():
    with pytest.raises(ConfigError, match="did you mean 'prompt_column'") as e:
        load_task({"promt_column": "q"})
    assert e.value.where == "data.promt_column"
    with pytest.raises(ConfigError, match="eval_size"):
        load_task({"eval_size": -1})


def test_prompt_longer_than_the_context_names_the_row():
    from policyzoo.data import check_prompt_lengths

    rows = [{"prompt": [{"role": "user", "content": "a b c"}]}, {"prompt": [{"role": "user", "content": "a b c d e"}]}]
    words = lambda messages: sum(len(m["content"].split()) for m in messages)  # noqa: E731
    assert check_prompt_lengths(rows, words, 5) == [3, 5]  # 3 and 5 words, both fit in 5
    with pytest.raises(DataError) as e:
        check_prompt_lengths(rows, words, 4, where="data.path (x.jsonl)")
    assert e.value.where == "data.path (x.jsonl), row 1" and "5 tokens, longer than the 4" in e.value.why


def test_an_over_long_prompt_is_named_by_the_file_and_its_own_row(tmp_path):
    from policyzoo.data import check_prompt_lengths

    rows = [*ROWS[:10], {"q": "word " * 50, "a": "1", "level": 0}, *ROWS[10:]]  # the long prompt is row 10
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    task = load(path, eval_size=3, few_shot=1)
    # every origin names the file and the row's index in it; the rows partition the file but
    # for the one few-shot example (the first remaining row)
    origins = task.train_origins + task.eval_origins
    assert all(o.startswith(f"data.path ({path}), row ") for o in origins)
    assert len(origins) == 12 and len(set(origins)) == 12  # 13 rows, 1 used as the example
    # data.seed 0 holds out rows 1, 2 and 9 (the seeded shuffle), row 0 is the example, so the
    # training rows are 3-8 and 10-12 and the long row is training row 6
    assert [int(o.rsplit(" ", 1)[1]) for o in task.train_origins] == [3, 4, 5, 6, 7, 8, 10, 11, 12]
    assert task.train_rows[6]["q"].startswith("word")
    words = lambda messages: sum(len(m["content"].split()) for m in messages)  # noqa: E731
    with pytest.raises(DataError) as e:
        check_prompt_lengths(task.train_rows, words, 40, "data (training rows)", task.train_origins)
    assert e.value.where == f"data.path ({path}), row 10"  # not "data (training rows), row 6"


def test_eval_split_of_a_single_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="has no splits"):
        load(write_jsonl(tmp_path / "d.jsonl", ROWS), eval_split="test")


def _wrong_answer_column(tmp_path, *extra):
    """`policyzoo train --dry-run` on a file whose answers are in 'solution' while data.answer_column
    stays 'answer': the exit code and stderr."""
    from policyzoo.cli import main

    rows = [{"question": f"What is {i} + 1?", "solution": str(i + 1)} for i in range(30)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    return main(["train", "--algo", "grpo", "--dry-run", f"data.path={path}", "data.prompt_column=question",
                 "model.path=/nonexistent", f"output_dir={tmp_path / 'run'}", *extra])


@pytest.mark.parametrize("few_shot", [[], ["data.few_shot=2"]])
def test_a_wrong_answer_column_is_the_same_clear_error_with_or_without_few_shot(tmp_path, capsys, few_shot):
    # without few-shot the rows are prompt-only, and grpo's default reward (math_verify) needs answers;
    # with few-shot the two solved examples need them first (was: KeyError 'answer', exit 1)
    assert _wrong_answer_column(tmp_path, *few_shot) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err and "KeyError" not in err
    assert f"error at data.path ({tmp_path / 'd.jsonl'}) (data.answer_column):" in err
    assert "no column 'answer' in the data; columns are: question, solution" in err
    assert "fix: set data.answer_column to the column that holds the answer" in err
    assert ("data.few_shot=2 shows 2 solved examples" in err) == bool(few_shot)
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.parametrize("few_shot", [0, 2])
def test_a_misnamed_answer_column_beside_a_column_named_answer_is_refused(tmp_path, few_shot):
    # data.answer_column=ans names no column; the file's own 'answer' column (here a worked solution) must not
    # stand in for it unchecked (it did: the run trained against the solution text, answer_type never applied)
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} plus one is {i + 1}"} for i in range(30)]
    with pytest.raises(DataError) as e:
        load_task({"path": write_jsonl(tmp_path / "d.jsonl", rows), "prompt_column": "question",
                   "answer_column": "ans", "few_shot": few_shot})
    assert e.value.where.endswith("(data.answer_column)")
    assert e.value.why.startswith("no column 'ans' in the data") and "columns are: question, answer" in e.value.why


def test_few_shot_on_prompt_only_data_raises_before_any_prompt_is_built(tmp_path):
    rows = [{"question": f"What is {i} + 1?", "solution": str(i + 1)} for i in range(30)]
    with pytest.raises(DataError) as e:
        load_task({"path": write_jsonl(tmp_path / "d.jsonl", rows), "prompt_column": "question", "few_shot": 1})
    assert e.value.where.endswith("(data.answer_column)") and "columns are: question, solution" in e.value.why
    assert "set data.few_shot=0" in e.value.fix
    # the same file with its answer column named loads, the first pool row becoming the one example
    task = load_task({"path": str(tmp_path / "d.jsonl"), "prompt_column": "question", "answer_column": "solution",
                      "few_shot": 1, "eval_size": 0})
    assert task.train_rows[0]["prompt"][:2] == [{"role": "user", "content": "What is 0 + 1?"},
                                                {"role": "assistant", "content": "1"}]  # row 0: 0 + 1 = 1
