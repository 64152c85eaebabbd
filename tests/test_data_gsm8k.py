"""GSM8K shipped inside the package: answer parsing, splits, prompts, size and license."""

from importlib import resources

from policyzoo.data import gsm8k_final_answer, load_task
from policyzoo.data.answers import gsm8k_worked_solution

NATALIA = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
           "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")


def test_final_answer_parsing_by_hand():
    # 48 clips in April, half as many (24) in May: 48 + 24 = 72
    assert gsm8k_final_answer(NATALIA) == "72"
    assert gsm8k_final_answer("... so 1,000 + 80 = 1,080\n#### 1,080") == "1080"
    assert gsm8k_final_answer("no marker 5") is None and gsm8k_final_answer("#### five") is None


def test_worked_solution_drops_calculator_marks_and_boxes_the_answer():
    assert gsm8k_worked_solution(NATALIA, "72") == (
        "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n"
        "The answer is \\boxed{72}.")


def test_load_by_name():
    task = load_task({"name": "gsm8k"})
    assert len(task.train_rows) == 2000 and len(task.eval_rows) == 100  # shipped train rows; eval_size default
    first = task.train_rows[0]
    assert first["question"].startswith("Natalia sold clips") and first["answer"] == "72"
    assert first["solution"] == NATALIA
    assert [m["role"] for m in first["prompt"]] == ["system", "user"] and "\\boxed" in first["prompt"][0]["content"]
    # test split, in file order: Janet's ducks lay 16, she eats 3 and bakes with 4: (16 - 3 - 4) x $2 = $18
    assert task.eval_rows[0]["question"].startswith("Janet") and task.eval_rows[0]["answer"] == "18"
    assert [u.name for u in task.default_rewards] == ["math_verify"]


def test_full_test_split_and_few_shot():
    task = load_task({"name": "gsm8k", "eval_size": 5000, "few_shot": 2, "limit": 10})
    assert len(task.eval_rows) == 1319 and len(task.train_rows) == 10
    prompt = task.train_rows[0]["prompt"]
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert prompt[2]["content"].endswith("The answer is \\boxed{72}.")  # Natalia is the first example
    assert "Natalia" not in task.train_rows[0]["question"]


def test_package_data_is_small_and_licensed():
    root = resources.files("policyzoo.data")
    size = sum(len((root / f).read_bytes()) for f in ("gsm8k_train.jsonl", "gsm8k_test.jsonl"))
    assert size < 5 * 2**20
    assert "MIT License" in (root / "LICENSE-gsm8k").read_text()
