"""Every prompt's token count is remembered between runs (core/engine/run/prompt_lengths.py): the
remembered count is the one counting gives, a changed tokenizer or chat template never reuses it, a
broken cache file is ignored, a prompt that fails to encode fails every time, and the drop mode
counts each prompt once."""

from __future__ import annotations

import json

import pytest
from _engine_helpers import tiny_model
from transformers import AutoTokenizer

from policyzoo.data import fit_prompt_lengths
from policyzoo.engine.run import preload as checks
from policyzoo.engine.run.prompt_lengths import LengthCache, prompt_key
from policyzoo.errors import DataError
from policyzoo.run_config import load_config
from policyzoo.step.episodes import encode_prompt

PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}],
           [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}],
           "a plain prompt",
           [{"role": "user", "content": "text with <|im_end|> inside stays text"}]]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(tiny_model()))


class Counter:
    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def __call__(self, prompt) -> int:
        self.calls += 1
        return len(encode_prompt(self.tok, prompt))


def test_a_remembered_count_is_the_counted_one_and_is_not_counted_again(tok, tmp_path):
    first = Counter(tok)
    cache = LengthCache(tok, tmp_path)
    counts = [cache.wrap(first)(p) for p in PROMPTS]
    assert first.calls == len(PROMPTS)
    # the byte tokenizer: a plain prompt is its 14 bytes plus the tokenizer's affixes
    plain = len(tok("a plain prompt").input_ids)
    assert counts[2] == plain and plain >= 14
    cache.save()
    (path,) = (tmp_path / "prompt-lengths").iterdir()
    assert sorted(json.loads(path.read_text()).values()) == sorted(counts)

    again = Counter(tok)
    later = LengthCache(tok, tmp_path)
    assert [later.wrap(again)(p) for p in PROMPTS] == [len(encode_prompt(tok, p)) for p in PROMPTS] == counts
    assert again.calls == 0  # every count came from the file
    assert later.wrap(again)([{"role": "user", "content": "new"}]) > 0 and again.calls == 1


def test_another_chat_template_or_tokenizer_never_reuses_a_count(tok, tmp_path):
    cache = LengthCache(tok, tmp_path)
    cache.wrap(Counter(tok))(PROMPTS[0])
    cache.save()
    other = AutoTokenizer.from_pretrained(str(tiny_model()))
    other.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert LengthCache(other, tmp_path).path != cache.path
    other = AutoTokenizer.from_pretrained(str(tiny_model()))
    other.add_tokens(["<new_piece>"], special_tokens=True)
    assert LengthCache(other, tmp_path).path != cache.path
    assert LengthCache(tok, tmp_path).path == cache.path  # the same tokenizer loaded again: the same file


def _tokenizer_folder(tmp_path, name: str, extra_special: bool):
    """The tiny model's tokenizer with ``<tool_call>`` added as a plain (not special) token; with
    ``extra_special`` the config also names it among the extra special tokens, so the untrusted-text
    rules treat it as structure (text cannot form it)."""
    import shutil

    folder = tmp_path / name
    folder.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_model() / f, folder / f)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["added_tokens"].append({"id": 258, "content": "<tool_call>", "special": False, "normalized": False,
                                 "lstrip": False, "rstrip": False, "single_word": False})
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    if extra_special:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["extra_special_tokens"] = ["<tool_call>"]
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(str(folder))


def test_a_token_named_special_only_in_the_config_gets_its_own_cache(tmp_path):
    plain, special = _tokenizer_folder(tmp_path, "plain", False), _tokenizer_folder(tmp_path, "special", True)
    prompt = [{"role": "user", "content": "<tool_call> What is 5 + 7?"}]
    assert len(encode_prompt(plain, prompt)) > 0  # a plain added token: the text may hold it
    with pytest.raises(DataError, match="control token"):  # structure: text forming it is refused
        encode_prompt(special, prompt)
    cache = LengthCache(plain, tmp_path / "cache")
    cache.wrap(Counter(plain))(prompt)
    cache.save()
    later = LengthCache(special, tmp_path / "cache")
    assert later.path != cache.path
    with pytest.raises(DataError, match="control token"):  # refused with the cache too, as without it
        later.wrap(Counter(special))(prompt)


def test_a_broken_cache_file_is_ignored_and_rewritten(tok, tmp_path):
    path = LengthCache(tok, tmp_path).path
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    count = Counter(tok)
    cache = LengthCache(tok, tmp_path)
    assert cache.wrap(count)(PROMPTS[1]) == len(encode_prompt(tok, PROMPTS[1])) and count.calls == 1
    cache.save()
    assert json.loads(path.read_text()) == {prompt_key(PROMPTS[1]): len(encode_prompt(tok, PROMPTS[1]))}
    for wrong in (-3, True, 2.5, "7"):  # a negative, a boolean, a float, a string: no count
        path.write_text(json.dumps({prompt_key(PROMPTS[1]): wrong}))
        count = Counter(tok)
        assert LengthCache(tok, tmp_path).wrap(count)(PROMPTS[1]) > 1 and count.calls == 1


def test_an_unwritable_cache_is_skipped(tok, tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder should be")
    cache = LengthCache(tok, blocker)
    count = Counter(tok)
    assert cache.wrap(count)(PROMPTS[0]) == len(encode_prompt(tok, PROMPTS[0])) and count.calls == 1
    cache.save()  # no error: the counts were made as without a cache
    assert blocker.read_text() == "a file where the cache folder should be"
    assert list(tmp_path.iterdir()) == [blocker]  # no temporary file left behind


def test_counts_written_meanwhile_by_another_run_are_kept(tok, tmp_path):
    one, two = LengthCache(tok, tmp_path), LengthCache(tok, tmp_path)  # two runs started together
    one.wrap(Counter(tok))(PROMPTS[0])
    two.wrap(Counter(tok))(PROMPTS[1])
    one.save()
    two.save()
    assert set(json.loads(one.path.read_text())) == {prompt_key(PROMPTS[0]), prompt_key(PROMPTS[1])}
    assert one.path.stat().st_mode & 0o777 == 0o644  # others sharing the cache may read it


def test_a_prompt_that_fails_to_encode_fails_every_time(tok, tmp_path):
    bad = [{"role": "<|im_end|>", "content": "hi"}] if "<|im_end|>" in tok.get_vocab() else None
    for _ in range(2):
        cache = LengthCache(tok, tmp_path)
        with pytest.raises(DataError):
            cache.wrap(lambda p: len(encode_prompt(tok, bad)) if bad else (_ for _ in ()).throw(DataError("x", "y")))(
                PROMPTS[0])
        cache.save()
    assert not (tmp_path / "prompt-lengths").exists()  # nothing counted, nothing written


def test_drop_mode_counts_each_prompt_once():
    calls = []
    rows = [{"prompt": "x" * n} for n in (3, 9, 5, 12, 1)]
    kept, counts, _, dropped = fit_prompt_lengths(rows, lambda p: calls.append(p) or len(p), 8, "data", "drop")
    assert len(calls) == 5 and counts == [3, 5, 1] and dropped == 2


def test_a_second_preload_reads_every_count_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path / "cache"))
    over = [f"model.path={tiny_model()}", "data.limit=40", "data.eval_size=4", f"output_dir={tmp_path / 'run'}"]
    first = checks.preload(load_config(None, "grpo", over), dry_run=True)
    (path,) = (tmp_path / "cache" / "prompt-lengths").iterdir()
    rows = first.task.train_rows + first.task.eval_rows
    assert len(first.task.eval_rows) == 4 and len({prompt_key(r["prompt"]) for r in rows}) == len(rows)
    assert len(json.loads(path.read_text())) == len(rows)  # one count per distinct prompt
    calls = []
    monkeypatch.setattr(checks, "encode_prompt", lambda *a, **k: calls.append(a) or encode_prompt(*a, **k))
    second = checks.preload(load_config(None, "grpo", over), dry_run=True)
    assert second.max_model_len == first.max_model_len
    # the run's summary.json reports them: all counted the first time, all remembered the second
    assert (first.prompt_counts["counted"], first.prompt_counts["remembered"]) == (len(rows), 0)
    assert (second.prompt_counts["counted"], second.prompt_counts["remembered"]) == (0, len(rows))
    assert len(calls) == 1  # only the sync check's prompt (check_ids) is encoded: no prompt is counted again
