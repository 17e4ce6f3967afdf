"""The shared ``-o`` formats: kubectl ages, plain tables, JSONPath templates, columns."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from drahealth.cli._output import (
    MAX_SPEC,
    OUTPUT,
    Output,
    emit,
    human_age,
    jsonpath,
    jsonpath_template,
    parse_output,
    table_text,
)

ROWS = [
    {"device": "d/p/gpu-0", "health": "Unhealthy", "consumers": [{"pod": "a"}, {"pod": "b"}]},
    {"device": "d/p/gpu-1", "health": "Healthy", "consumers": []},
]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "<unknown>"),
        (-5, "<invalid>"),
        (-0.5, "0s"),
        (0, "0s"),
        (5, "5s"),
        (119, "119s"),
        (120, "2m"),
        (192, "3m12s"),
        (599, "9m59s"),
        (600, "10m"),
        (3 * 3600 - 1, "179m"),
        (3 * 3600, "3h"),
        (5 * 3600 + 3 * 60, "5h3m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (2 * 86400 + 4 * 3600, "2d4h"),
        (3 * 86400, "3d"),
        (8 * 86400, "8d"),
        (400 * 86400, "400d"),
        (2 * 365 * 86400 + 10 * 86400, "2y10d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_ages_are_spelled_as_kubectl_spells_them(seconds: float | None, text: str) -> None:
    assert human_age(seconds) == text


def test_tables_have_no_leading_or_trailing_spaces_and_no_control_characters() -> None:
    text = table_text(["NAME", "MESSAGE"], [["a", "x\x1b[31mred"], ["longer-name", ""]])
    lines = text.splitlines()
    assert lines == ["NAME          MESSAGE", "a             xred", "longer-name"]


def test_jsonpath_fields_indexes_wildcards_slices_recursion_and_filters() -> None:
    data = {"kind": "List", "items": ROWS}
    assert jsonpath(".items[*].device", data) == ["d/p/gpu-0", "d/p/gpu-1"]
    assert jsonpath("{.items[0].consumers[*].pod}", data) == ["a", "b"]
    assert jsonpath(".items[-1].health", data) == ["Healthy"]
    assert jsonpath(".items[0:1].device", data) == ["d/p/gpu-0"]
    assert jsonpath("..pod", data) == ["a", "b"]
    assert jsonpath("$.items[?(@.health=='Healthy')].device", data) == ["d/p/gpu-1"]
    assert jsonpath('.items[?(@.health!="Healthy")].device', data) == ["d/p/gpu-0"]
    assert jsonpath(".items[*]['device']", data) == ["d/p/gpu-0", "d/p/gpu-1"]
    assert jsonpath(".items[5].device", data) == []
    assert jsonpath(".missing.field", data) == []


def test_jsonpath_templates_with_range_and_literals() -> None:
    data = {"kind": "List", "items": ROWS}
    text = jsonpath_template('{range .items[*]}{.device}{"\\t"}{.health}{"\\n"}{end}', data)
    assert text == "d/p/gpu-0\tUnhealthy\nd/p/gpu-1\tHealthy\n"
    assert jsonpath_template("devices: {.items[*].device}", data) == (
        "devices: d/p/gpu-0 d/p/gpu-1"
    )
    # values that are not strings print as JSON
    assert jsonpath_template("{.items[0].consumers[0]}", data) == '{"pod": "a"}'


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("xml", "use one of table, wide, json, yaml, name, jsonpath=TEMPLATE"),
        ("jsonpath={.items[", "unclosed {"),
        ("jsonpath={.items[*].a", "unclosed {"),
        ("jsonpath={range .items[*]}{.a}", "{range} without {end}"),
        ("jsonpath={end}", "{end} without {range}"),
        ("jsonpath={.items[?(bad)]}", "cannot read"),
        ("jsonpath={.items!}", "unexpected"),
        ("custom-columns=NAME", "must be HEADER:PATH"),
        ("custom-columns=NAME:.a,:.b", "must be HEADER:PATH"),
        ("custom-columns=NAME:.a[", "unexpected '['"),
        ("custom-columns=" + "A:.a," * MAX_SPEC, f"at most {MAX_SPEC} characters"),
    ],
)
def test_bad_output_formats_are_usage_errors_naming_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(click.BadParameter) as info:
        parse_output(text)
    assert fragment in info.value.format_message()


def test_an_output_option_hands_the_command_a_parsed_format() -> None:
    @click.command()
    @OUTPUT
    def cmd(output: Output) -> None:
        click.echo(f"{output.kind}|{output.columns}")

    result = CliRunner().invoke(cmd, ["-o", "custom-columns=DEV:.device,HEALTH:{.health}"])
    assert result.output == "custom-columns|(('DEV', '.device'), ('HEALTH', '.health'))\n"
    assert CliRunner().invoke(cmd, ["-o", "nope"]).exit_code == 2


def _emit(rows: list[dict[str, object]], text: str) -> tuple[str, str]:
    @click.command()
    @OUTPUT
    def cmd(output: Output) -> None:
        emit(
            rows,
            output,
            machine=lambda r: {**r, "machine": True},
            table=lambda rs, wide: (
                ["DEVICE", "HEALTH"] + ["PODS"] * wide,
                [[r["device"], r["health"]] + [str(len(r["consumers"]))] * wide for r in rs],
            ),
            name=lambda r: f"device/{r['device']}",
            empty="No devices found.",
        )

    result = CliRunner().invoke(cmd, ["-o", text])
    assert result.exit_code == 0, result.output
    return result.stdout, result.stderr


def test_every_format_prints_the_rows() -> None:
    out, _ = _emit(ROWS, "table")
    assert out.splitlines()[0] == "DEVICE      HEALTH"
    out, _ = _emit(ROWS, "wide")
    assert out.splitlines()[1] == "d/p/gpu-0   Unhealthy   2"
    out, _ = _emit(ROWS, "json")
    assert [r["machine"] for r in json.loads(out)] == [True, True]
    out, _ = _emit(ROWS, "yaml")
    assert "- device: d/p/gpu-0" in out and "machine: true" in out
    out, _ = _emit(ROWS, "name")
    assert out == "device/d/p/gpu-0\ndevice/d/p/gpu-1\n"
    out, _ = _emit(ROWS, "jsonpath={.items[*].device}")
    assert out == "d/p/gpu-0 d/p/gpu-1"  # as kubectl: no newline added
    out, _ = _emit(ROWS, "custom-columns=DEV:.device,PODS:.consumers[*].pod,X:.nope")
    assert out.splitlines() == [
        "DEV         PODS     X",
        "d/p/gpu-0   a,b      <none>",
        "d/p/gpu-1   <none>   <none>",
    ]


def test_an_empty_result_says_so_on_stderr_for_tables_and_prints_an_empty_list_otherwise() -> None:
    out, err = _emit([], "table")
    assert (out, err) == ("", "No devices found.\n")
    out, err = _emit([], "json")
    assert (json.loads(out), err) == ([], "")
    out, err = _emit([], "custom-columns=DEV:.device")
    assert (out, err) == ("", "No devices found.\n")
