"""A compare-spec method that extends another (of its spec, or FILE#METHOD of a spec
beside it) runs that method's overrides, then its own; a control of it gets the whole
chain; every bad reference is refused naming the field. Specs are planned, not trained."""

from pathlib import Path

import pytest
from g2rpo.common.errors import ConfigError
from g2rpo.evaluation.compare_spec import CONTROL, load_spec, plan_runs

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
MIX = ["algorithm.name=mixgrpo", "sampling.eta=0.7", "optim.lr=3.0e-5"]


def _write(path: Path, name: str, methods: str) -> Path:
    path.write_text(f"""
name: {name}
base_config: {TINY}
seeds: [0]
budget: {{iterations: 2}}
methods:
{methods}""")
    return path


@pytest.fixture
def catalogue(tmp_path):
    _write(
        tmp_path / "catalogue.yaml",
        "catalogue",
        f"  mix: {{set: {MIX}}}\n  mix_slow: {{extends: mix, set: [optim.lr=1.0e-6]}}\n"
        "  mix_control: {control_of: mix}\n",
    )
    return tmp_path


def test_a_chain_across_two_specs_resolves_to_every_override_in_order(catalogue):
    path = _write(
        catalogue / "sweep.yaml",
        "sweep",
        "  a: {extends: catalogue.yaml#mix_slow, set: [optim.lr=1.0e-5]}\n"
        "  b: {extends: a, set: [sampling.eta=0.5]}\n"
        "  b_control: {control_of: b}\n",
    )
    spec = load_spec(path)
    # the catalogue's chain (mix, then mix_slow), then a's, then b's: later wins
    b = [*MIX, "optim.lr=1.0e-6", "optim.lr=1.0e-5", "sampling.eta=0.5"]
    assert spec.method_overrides("b") == b
    assert spec.method_overrides("b_control") == [*b, CONTROL]
    assert spec.record()["method_overrides"]["b_control"] == [*b, CONTROL]
    runs = {r.method: r.config for r in plan_runs(spec)}
    assert runs["a"].algorithm.name == "mixgrpo" and runs["a"].optim.lr == 1.0e-5
    assert runs["a"].sampling.eta == 0.7 and runs["b"].sampling.eta == 0.5
    assert runs["b"].optim.lr == 1.0e-5 and not runs["b"].algorithm.control
    assert runs["b_control"].algorithm.control
    assert runs["b_control"].algorithm.model_copy(update={"control": False}) == runs["b"].algorithm
    assert runs["b_control"].sampling == runs["b"].sampling


@pytest.mark.parametrize(
    ("methods", "message"),
    [
        ("  a: {extends: nope}\n", r"methods\.a\.extends: 'nope' is not one of the other"),
        ("  a: {extends: a}\n", r"methods\.a\.extends: 'a' is not one of the other"),
        (
            "  a: {extends: b}\n  b: {extends: c}\n  c: {extends: a}\n",
            r"methods\.a: control_of/extends go round in a loop: a -> b -> c -> a",
        ),
        ("  a: {}\n  b: {extends: a, control_of: a}\n", r"methods\.b: give one of control_of"),
        (
            "  a: {extends: catalogue.yaml#mixx}\n",
            r"methods\.a\.extends: 'catalogue.yaml#mixx': .* has no method 'mixx' "
            r"\(it has: mix, mix_slow, mix_control\)",
        ),
        ("  a: {extends: other.yaml#mix}\n", r"methods\.a\.extends: 'other.yaml#mix': no spec"),
        ("  a: {extends: '#mix'}\n", r"methods\.a\.extends: '#mix': write FILE#METHOD"),
        # a control of something that extends a control is a control of a control
        (
            "  a: {extends: catalogue.yaml#mix_control}\n  b: {control_of: a}\n",
            r"methods\.b\.control_of: 'a' is itself a control",
        ),
    ],
)
def test_a_bad_reference_is_refused_naming_the_method_and_field(catalogue, methods, message):
    with pytest.raises(ConfigError, match=message):
        load_spec(_write(catalogue / "sweep.yaml", "sweep", methods))


def test_specs_that_extend_each_other_are_refused_not_followed_forever(tmp_path):
    _write(tmp_path / "one.yaml", "one", "  x: {extends: two.yaml#y}\n")
    _write(tmp_path / "two.yaml", "two", "  y: {extends: one.yaml#x}\n")
    with pytest.raises(ConfigError, match=r"the specs extend each other in a loop"):
        load_spec(tmp_path / "one.yaml")


def test_a_broken_spec_it_extends_is_named_with_the_method_that_reads_it(catalogue):
    _write(catalogue / "broken.yaml", "broken", "  m: {set: [optim.lr=1e-5], colour: red}\n")
    named = r"(?s)methods\.a\.extends: 'broken.yaml#m': .*methods\.m\.colour"
    with pytest.raises(ConfigError, match=named):
        load_spec(_write(catalogue / "sweep.yaml", "sweep", "  a: {extends: broken.yaml#m}\n"))
