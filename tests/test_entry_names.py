"""A hybrid's name is an entry the tool reads back: the name :meth:`Bundle.replace` prints (the run's name,
its folder) is accepted by ``compare --algos``, ``--algo``, ``explain`` and a config's ``algorithm:``, and
resolves to the same components, in every slot. ``none`` empties an optional or collect slot (older names
printed it) except where a component is named ``none`` (``clip: none``, no clipping)."""

import pytest

from policyzoo import ConfigError, assemble, resolve_algorithm, use
from policyzoo.catalog import get_catalog
from policyzoo.cli import main
from policyzoo.contract import SLOTS
from policyzoo.resolve import expand_entry, parse_entry
from policyzoo.run_config import load_config, validate
from policyzoo.zoo.grpo import BUNDLE as GRPO

CATALOG = get_catalog()


def _read_back(name: str):
    """What ``--algo NAME`` (and ``algorithm: NAME``) resolves to."""
    return resolve_algorithm(validate({"algorithm": name}).algorithm, CATALOG)


def _hybrids(bundle):
    """Every one-slot hybrid of ``bundle``: each component of the catalog in each slot, and each optional or
    collect slot emptied."""
    for slot, kind in SLOTS.items():
        for name in sorted(CATALOG.components[slot]):
            yield slot, bundle.replace(**{slot: (use(name),) if kind == "collect" else use(name)})
        if kind != "single":
            yield slot, bundle.replace(**{slot: None})


@pytest.mark.parametrize("base", sorted(get_catalog().bundles))
def test_every_printed_hybrid_name_reads_back_to_the_same_slots(base):
    bundle = CATALOG.bundle(base)
    seen = 0
    for slot, hybrid in _hybrids(bundle):
        back = _read_back(hybrid.name)
        assert back.name == hybrid.name, (hybrid.name, back.name)
        for s in SLOTS:  # the changed slot and every other one
            assert getattr(back, s) == getattr(hybrid, s), (hybrid.name, s)
        seen += 1
    # every component of every slot, plus an emptied kl, env, reward, filter and term
    assert seen == sum(len(c) for c in CATALOG.components.values()) + 5


def test_removed_slots_print_null_and_none_reads_as_null_except_a_real_none_component():
    assert "none" in CATALOG.components["clip"]  # the clip component that does not clip
    assert all("none" not in CATALOG.components[s] for s, kind in SLOTS.items() if kind != "single")
    assert GRPO.replace(kl=None).name == "grpo+kl=null"
    for written in ("grpo+kl=none", "grpo+kl=null"):  # --algo / explain / algorithm: NAME
        assert _read_back(written).kl is None
    assert resolve_algorithm({"base": "grpo", "kl": "none"}, CATALOG).kl is None  # YAML `kl: none`
    assert resolve_algorithm({"base": "dapo", "filter": "none"}, CATALOG).filter == ()
    assert load_config(None, "grpo", ["algorithm.kl.use=none"]).algorithm == {"base": "grpo", "kl": {"use": "none"}}
    assert resolve_algorithm(load_config(None, "grpo", ["algorithm.kl.use=none"]).algorithm, CATALOG).kl is None
    # clip is a single slot with a component named none: the name means that component, both ways
    hybrid = GRPO.replace(clip=use("none"))
    assert hybrid.name == "grpo+clip=none" and _read_back("grpo+clip=none").clip == use("none")
    assert type(assemble("grpo+clip=none", catalog=CATALOG).clip).__name__ == type(
        assemble(hybrid, catalog=CATALOG).clip).__name__
    with pytest.raises(ConfigError, match="`none` is the component"):
        resolve_algorithm({"base": "grpo", "clip": None}, CATALOG)
    # `none` with parameters names a component, which kl has not: the refusal says how to leave the slot out
    with pytest.raises(ConfigError, match=r"to leave the kl slot out write null \(kl: null, grpo\+kl=null\)"):
        assemble({"base": "grpo", "kl": {"use": "none", "beta": 0.1}}, catalog=CATALOG)


def test_compare_entries_with_none_are_accepted(tmp_path, capsys):
    code = main(["compare", "--print-commands", "--output-dir", str(tmp_path), "--seeds", "1",
                 "--algos", "grpo+kl=none,grpo+clip=none"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "grpo+kl=none/seed0 algorithm.kl.use=none" in out.out and "algorithm.clip.use=none" in out.out


def test_a_parameter_only_replace_keeps_the_component_and_equals_the_cli_override():
    hybrid = GRPO.replace(clip={"eps_high": 0.28})
    # grpo's clip is ppo_clip(eps_low=0.2, eps_high=0.2); the change merges eps_high=0.28 into it
    assert hybrid.clip == use("ppo_clip", eps_low=0.2, eps_high=0.28)
    assert hybrid.name == "grpo+clip.eps_high=0.28" == parse_entry(hybrid.name)[0] + "+clip.eps_high=0.28"
    assert parse_entry(hybrid.name)[1] == ["algorithm.clip.eps_high=0.28"]
    cli = resolve_algorithm(load_config(None, "grpo", ["algorithm.clip.eps_high=0.28"]).algorithm, CATALOG)
    assert cli == hybrid  # same name, same slots
    a, b = assemble(hybrid, catalog=CATALOG), assemble(cli, catalog=CATALOG)
    for slot in SLOTS:
        mine, theirs = getattr(a, slot), getattr(b, slot)
        mine, theirs = (x if isinstance(x, list) else [x] if x else [] for x in (mine, theirs))
        assert [(type(c), c.params) for c in mine] == [(type(c), c.params) for c in theirs], slot
    assert (a.clip.params.eps_low, a.clip.params.eps_high) == (0.2, 0.28)
    # naming the same component with a parameter merges too (as a bundle's parent does)
    assert GRPO.replace(clip=use("ppo_clip", eps_high=0.28)) == hybrid
    with pytest.raises(ConfigError, match="no component named"):  # parameters for a slot that is empty
        GRPO.replace(env={"max_turns": 2})


def test_a_swapped_component_names_its_parameters_and_reads_back():
    hybrid = GRPO.replace(clip=use("cispo", eps_high=4.0))  # cispo's default is 5.0: 4.0 is a change
    assert hybrid.name == "grpo+clip=cispo+clip.eps_high=4.0"
    assert _read_back(hybrid.name) == hybrid


def test_explain_and_train_take_every_entry_compare_takes(capsys):
    for entry, clip in (("grpo+clip=cispo", "cispo"), ("grpo+clip.eps_high=0.28", "ppo_clip")):
        assert main(["explain", entry]) == 0
        out = capsys.readouterr().out
        assert out.startswith(entry + ":") and f"clip      {clip}" in out
        # --algo reads the entry the same way (train --dry-run then resolves it like this)
        assert resolve_algorithm(load_config(None, entry, []).algorithm, CATALOG).name == entry
    assert "eps_high = 0.28" in (main(["explain", "grpo+clip.eps_high=0.28"]), capsys.readouterr().out)[1]
    assert load_config(None, "grpo+clip=cispo", ["algorithm.kl.beta=0.01"]).algorithm == {
        "base": "grpo", "clip": {"use": "cispo"}, "kl": {"beta": 0.01}}


def test_an_entry_and_a_key_that_set_the_same_thing_are_refused_naming_both(capsys):
    with pytest.raises(ConfigError, match="the entry sets clip.use and the config also sets algorithm.clip.use"):
        load_config(None, "grpo+clip=cispo", ["algorithm.clip.use=ppo_clip"])
    with pytest.raises(ConfigError, match="sets kl and the config also sets algorithm.kl.beta"):
        expand_entry({"base": "grpo+kl=null", "kl": {"beta": 0.1}})
    assert main(["explain", "grpo+clip=cisp"]) == 2  # a misspelled component: one error block, exit 2
    err = capsys.readouterr().err
    assert "no clip component named 'cisp'" in err and "did you mean 'cispo'" in err and "Traceback" not in err


def test_a_parameter_set_to_what_it_already_is_is_no_change_and_not_in_the_name():
    # the group sampler's temperature defaults to 1.0 and grpo states none: temperature=1.0 changes nothing;
    # max_tokens=64 does (grpo's sampler states no max_tokens of 64). A TRL config spells every sampling default.
    hybrid = resolve_algorithm("grpo+sample.temperature=1.0+sample.max_tokens=64", CATALOG)
    assert hybrid.name == "grpo+sample.max_tokens=64"
    assert hybrid.sample.params == {"n": 8, "temperature": 1.0, "max_tokens": 64}  # kept as written: name only
    # another component's parameters are named as written, even at its default (cispo's eps_high is 5.0), as
    # Bundle.replace names them
    assert resolve_algorithm("grpo+clip=cispo+clip.eps_high=5.0", CATALOG).name == "grpo+clip=cispo+clip.eps_high=5.0"
    # grpo states eps_low 0.2: setting it to 0.2 again is grpo itself
    assert resolve_algorithm("grpo+clip.eps_low=0.2", CATALOG).name == "grpo"
    # a value the base states differently from the component's default is a change even when it equals that
    # default: grpo's k3 KL states beta 0.04, so beta=0.0 stays (and is named)
    assert resolve_algorithm("grpo+kl.beta=0.0", CATALOG).name == "grpo+kl.beta=0.0"


@pytest.mark.parametrize("entry, slot", [("grpo+kl.beta=0.01+kl=null", "kl"), ("grpo+kl=null+kl.beta=0.01", "kl"),
                                         ("grpo+clip=cispo+clip=ppo_clip", "clip"),
                                         ("grpo+clip.eps_high=0.3+clip.eps_high=0.28", "clip.eps_high")])
def test_an_entry_that_sets_a_slot_twice_is_refused_in_either_order(entry, slot):
    with pytest.raises(ConfigError) as e:
        parse_entry(entry)
    assert f"both set {slot}: one would silently replace the other" in e.value.why
    # a component then its parameters is one statement of the slot, not two
    assert parse_entry("grpo+clip=cispo+clip.eps_high=4.0")[1] == ["algorithm.clip.use=cispo",
                                                                  "algorithm.clip.eps_high=4.0"]


def test_an_override_that_replaces_an_earlier_overrides_section_is_refused():
    # algorithm.kl.beta=0.01 then algorithm.kl=null would drop the beta without a word
    with pytest.raises(ConfigError) as e:
        load_config(None, "grpo", ["algorithm.kl.beta=0.01", "algorithm.kl=null"])
    assert e.value.where == "algorithm.kl" and "would be dropped" in e.value.why
    # the other order is refused too ('kl' is no section once it is null), and a file's section may be replaced
    with pytest.raises(ConfigError):
        load_config(None, "grpo", ["algorithm.kl=null", "algorithm.kl.beta=0.01"])
    assert load_config(None, None, ["algorithm={base: grpo, kl: {beta: 0.01}}", "algorithm.kl=null"]
                       ).algorithm["kl"] is None


def test_a_hybrids_summary_names_its_changes_not_only_its_parents():
    hybrid = GRPO.replace(clip=use("cispo"), kl=None)
    assert hybrid.summary.startswith("grpo with clip=cispo, kl=null; grpo itself: ")
    assert GRPO.replace().summary == GRPO.summary  # no change, the parent's line


def test_algo_does_not_silently_replace_a_configs_hybrid(tmp_path):
    config = tmp_path / "hybrid.yaml"
    config.write_text("algorithm: grpo+clip=cispo\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(config), "dapo", [])
    assert "the hybrid grpo+clip=cispo and --algo names dapo" in e.value.why
    # the same name, or a plain base with slot overrides in the file (--algo names the base), are fine
    assert load_config(str(config), "grpo+clip=cispo", []).algorithm == {"base": "grpo", "clip": {"use": "cispo"}}
    config.write_text("algorithm: {base: grpo, clip: {use: cispo}}\n")
    assert load_config(str(config), "dapo", []).algorithm == {"base": "dapo", "clip": {"use": "cispo"}}
