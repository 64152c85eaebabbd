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
