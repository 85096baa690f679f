"""Flags with GEARSHIFT_* environment fallbacks."""

from __future__ import annotations

import pytest

from gearshift.common.config import Option, build_parser, env_vars, parse_bool, parse_config

OPTIONS = [
    Option("listen", "where to listen", "127.0.0.1:1"),
    Option("rounds", "round length", 360.0, float),
    Option("verbose", "talk more", False, parse_bool),
    Option("token", "secret", "", secret=True),
    Option("mode", "a mode", "a", choices=("a", "b")),
]


def test_defaults_apply_without_flags_or_environment() -> None:
    config = parse_config("x", "", OPTIONS, [], environ={})
    assert (config.listen, config.rounds, config.verbose, config.mode) == (
        "127.0.0.1:1",
        360.0,
        False,
        "a",
    )


def test_environment_overrides_default_and_flag_overrides_environment() -> None:
    env = {"GEARSHIFT_ROUNDS": "6", "GEARSHIFT_VERBOSE": "yes", "GEARSHIFT_LISTEN": "h:2"}
    config = parse_config("x", "", OPTIONS, ["--rounds", "7"], environ=env)
    assert config.rounds == 7.0
    assert config.verbose is True
    assert config.listen == "h:2"
    assert parse_config("x", "", OPTIONS, ["--no-verbose"], environ=env).verbose is False


def test_bad_environment_value_names_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config("x", "", OPTIONS, [], environ={"GEARSHIFT_ROUNDS": "soon"})
    with pytest.raises(SystemExit) as exc:
        parse_config("x", "", OPTIONS, [], environ={"GEARSHIFT_MODE": "c"})
    assert "GEARSHIFT_MODE" in str(exc.value)


def test_bad_flag_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config("x", "", OPTIONS, ["--rounds", "soon"], environ={})
    assert exc.value.code == 2
    assert "--rounds" in capsys.readouterr().err


def test_help_lists_every_flag_and_variable_but_hides_secrets() -> None:
    text = build_parser("x", "", OPTIONS, {"GEARSHIFT_TOKEN": "hunter2"}).format_help()
    for option in OPTIONS:
        assert option.flag in text
        assert option.env in text
    assert "hunter2" not in text


def test_env_vars_lists_what_a_daemon_reads() -> None:
    assert env_vars(OPTIONS) == {
        "GEARSHIFT_LISTEN",
        "GEARSHIFT_ROUNDS",
        "GEARSHIFT_VERBOSE",
        "GEARSHIFT_TOKEN",
        "GEARSHIFT_MODE",
    }


@pytest.mark.parametrize("text", ["maybe", "2"])
def test_parse_bool_rejects_non_booleans(text: str) -> None:
    with pytest.raises(ValueError, match="not a boolean"):
        parse_bool(text)
