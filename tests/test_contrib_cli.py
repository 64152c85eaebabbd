"""The CLI with the contrib distributions installed: `policyzoo plugins` lists each distribution
with version, hooks and components; `components` and `zoo` show plugin entries with their
source; `train --dry-run` shows which slot of a hybrid came from where."""

import pytest
import yaml

from policyzoo import cli
from policyzoo.catalog import get_catalog


@pytest.fixture(autouse=True)
def fresh_catalog(monkeypatch):
    monkeypatch.delenv("POLICYZOO_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setenv("POLICYZOO_PLUGINS", "policyzoo-sapo,policyzoo-tis")
    get_catalog.cache_clear()
    yield
    get_catalog.cache_clear()


def _run(capsys, *argv) -> str:
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def _rows(text: str) -> dict[str, str]:
    """Table rows keyed by their first cell (continuation lines are joined to their row)."""
    rows, key = {}, None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) < 2:
            continue
        key = cells[0] or key
        rows[key] = rows.get(key, "") + " " + " ".join(cells[1:])
    return rows


def test_plugins_lists_each_distribution_with_version_hooks_and_components(capsys):
    rows = _rows(_run(capsys, "plugins"))
    assert "0.1.0" in rows["policyzoo-sapo"] and "clip:sapo" in rows["policyzoo-sapo"]
    assert "register_components" in rows["policyzoo-sapo"] and "register_bundles" in rows["policyzoo-sapo"]
    assert "sapo" in rows["policyzoo-sapo"].split("clip:sapo", 1)[1]  # the bundle column
    assert "ratio:geo_tis" in rows["policyzoo-tis"] and "0.2.0" in rows["policyzoo-tis"]


def test_components_and_zoo_show_plugin_entries_with_their_source(capsys):
    text = _run(capsys, "components", "--slot", "clip")
    line = next(x for x in text.splitlines() if " sapo " in x)
    assert "policyzoo-sapo 0.1.0" in line
    zoo = _rows(_run(capsys, "zoo"))
    assert "policyzoo-sapo" in zoo["sapo"] and "group_norm" in zoo["sapo"] and "sapo" in zoo["sapo"]


def test_dry_run_shows_where_each_slot_of_a_hybrid_came_from(capsys):
    out = _run(capsys, "train", "--dry-run", "--algo", "grpo", "algorithm.clip.use=sapo",
               "algorithm.ratio.use=geo_tis", "algorithm.ratio.cap=3.0")
    view = yaml.safe_load(out)["algorithm"]
    assert view["base"] == "grpo"
    assert view["slots"]["clip"]["from"] == "override" and view["slots"]["baseline"]["from"] == "grpo default"
    assert view["slots"]["ratio"]["components"] == [{"use": "geo_tis", "cap": 3.0, "placement": "loss",
                                                    "max_log_ratio": 20.0}]
    assert view["sources"]["clip"].startswith("sapo from policyzoo-sapo 0.1.0")
    assert view["sources"]["ratio"].startswith("geo_tis from policyzoo-tis 0.2.0")
    assert view["sources"]["kl"].startswith("k3 from policyzoo 0.1.0")


def test_dry_run_of_a_yaml_hybrid_file(capsys, tmp_path):
    config = tmp_path / "hybrid.yaml"
    config.write_text("algorithm:\n  base: grpo\n  clip: {use: cispo, eps_high: 5.0}\n")
    view = yaml.safe_load(_run(capsys, "train", "--dry-run", "--config", str(config)))["algorithm"]
    assert view["name"] == "grpo+clip=cispo+clip.eps_high=5.0" and view["slots"]["clip"]["from"] == "override"
    assert view["slots"]["clip"]["components"] == [{"use": "cispo", "eps_high": 5.0, "eps_low": None}]
    assert view["slots"]["kl"]["from"] == "grpo default"
