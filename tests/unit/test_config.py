import pytest
from pydantic import Field

from brorl.config import StrictModel, load_config
from brorl.errors import InvalidArgument
from brorl.runconfig import parse_run_config


class Inner(StrictModel):
    x: int = Field(1, ge=0)
    name: str = "a"


class Outer(StrictModel):
    inner: Inner = Inner()
    lr: float = 1e-3


def test_precedence_defaults_file_env_cli(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("lr: 0.5\ninner: {x: 2, name: file}\n")
    cfg = load_config(Outer, f, ["inner.x=7"], environ={"BRORL_INNER__NAME": "env", "BRORL_INNER__X": "3"})
    assert (cfg.lr, cfg.inner.x, cfg.inner.name) == (0.5, 7, "env")
    assert load_config(Outer, None, [], environ={}).lr == 1e-3


def test_unknown_key_is_rejected_with_its_name():
    with pytest.raises(InvalidArgument) as err:
        load_config(Outer, None, ["inner.typo=1"], environ={})
    assert err.value.field == "inner.typo"
    assert "unknown key" in str(err.value)


def test_range_violation_names_the_field():
    with pytest.raises(InvalidArgument) as err:
        load_config(Outer, None, ["inner.x=-1"], environ={})
    assert err.value.field == "inner.x"


def test_run_config_errors_name_fields():
    ok = parse_run_config("model: m\ndata: {train_path: d.jsonl}\nasync: {max_staleness: 1}")
    assert ok.asynchrony.max_staleness == 1 and ok.sampling.n == 512
    for text, field in [("model: m", "data"), ("model: m\ndata: {train_path: d}\nsampling: {n: 0}", "sampling.n"),
                        ("model: m\ndata: {train_path: d}\ntrain: {lr: -1}", "train.lr"),
                        ("- a\n- b", "config_yaml"), ("model: [unclosed", "config_yaml")]:
        with pytest.raises(InvalidArgument) as err:
            parse_run_config(text)
        assert err.value.field == field, (text, str(err.value))
