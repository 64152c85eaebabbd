"""Every command's --help prints and exits 0 (argparse formats help strings with %, so a stray
'95%' in a help text turns --help into a stack trace)."""

import pytest

from policyzoo.cli import build_parser, main


def commands() -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(sub.choices)


@pytest.mark.parametrize("argv", [["--help"]] + [[c, "--help"] for c in commands()])
def test_help_prints_and_exits_0(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    assert "usage: policyzoo" in capsys.readouterr().out


def test_every_command_is_listed():
    # the commands README and docs name; a new one must join this list on purpose
    assert commands() == ["compare", "components", "config", "data", "doctor", "explain", "plan", "plot", "plugins",
                          "serve", "train", "zoo"]


@pytest.mark.parametrize("command", commands())
def test_every_option_has_help_text(command):
    # `policyzoo train --help` listed `--max-steps MAX_STEPS` with nothing after it
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    bare = [a.option_strings[0] for a in sub._actions if a.option_strings and not (a.help or "").strip()]
    assert bare == []


def test_max_steps_help_says_what_it_sets(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-steps N train N optimizer steps: the same as train.steps=N" in text
