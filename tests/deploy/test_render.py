"""The Go-template renderer behind the chart tests: the language subset, Helm's value
merging, and clear errors (file:line) for malformed templates, values and flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy._render import render

TemplateError = render.TemplateError


def run(text: str, values: dict[str, Any] | None = None, **root: Any) -> str:
    nodes = render.parse(text, "t.yaml")
    defines = {n.name: n for n in nodes if n.kind == "define"}
    dot = {"Values": values or {}, **root}
    return str(render._Renderer(defines, dot).render(nodes, dot, {"$": dot}))


@pytest.mark.parametrize(
    ("text", "values", "want"),
    [
        ("a {{ .Values.x }} b", {"x": 1}, "a 1 b"),
        ("a\n  {{- .Values.x -}}\n  b", {"x": "y"}, "ayb"),
        ("{{/* gone */}}x", {}, "x"),
        ("{{ .Values.missing }}|", {}, "|"),
        ("{{ if .Values.on }}yes{{ else }}no{{ end }}", {"on": False}, "no"),
        ("{{ if .Values.n }}a{{ else if .Values.m }}b{{ else }}c{{ end }}", {"m": 1}, "b"),
        ("{{ with .Values.m }}{{ .k }}{{ else }}none{{ end }}", {"m": {"k": "v"}}, "v"),
        ("{{ with .Values.m }}{{ .k }}{{ else }}none{{ end }}", {"m": {}}, "none"),
        ("{{ range .Values.l }}[{{ . }}]{{ end }}", {"l": [1, 2]}, "[1][2]"),
        (
            "{{ range $k, $v := .Values.m }}{{ $k }}={{ $v }};{{ end }}",
            {"m": {"b": 2, "a": 1}},
            "a=1;b=2;",
        ),
        ("{{ range .Values.l }}x{{ else }}empty{{ end }}", {"l": []}, "empty"),
        ('{{ .Values.s | default "d" | quote }}', {"s": ""}, '"d"'),
        ('{{ .Values.s | default "d" }}', {"s": "set"}, "set"),
        ('{{ printf "%s-%d" "a" 3 }}', {}, "a-3"),
        ('{{ printf "%q" "x" }}', {}, '"x"'),
        ('{{ "abcdef-" | trunc 7 | trimSuffix "-" }}', {}, "abcdef"),
        (
            "{{ toYaml .Values.m | nindent 2 }}",
            {"m": {"b": [1], "a": "x"}},
            "\n  a: x\n  b:\n  - 1",
        ),
        ("{{ $x := .Values.v }}{{ $x }}", {"v": 5}, "5"),
        ('{{ define "t" }}<{{ . }}>{{ end }}{{ include "t" .Values.v }}', {"v": 1}, "<1>"),
        ('{{ define "t" }}<{{ . }}>{{ end }}{{ template "t" .Values.v }}', {"v": 2}, "<2>"),
        ('{{ (index .Values.m "k").z }}', {"m": {"k": {"z": 9}}}, "9"),
        ("{{ and .Values.a .Values.b }}|{{ or .Values.a .Values.b }}", {"a": 1, "b": 0}, "0|1"),
        ('{{ if eq .Values.p "x" "y" }}in{{ end }}', {"p": "y"}, "in"),
        ("{{ not .Values.a }}", {"a": []}, "true"),
        # '=' inside a block sets the variable declared outside it (Go's text/template)
        ("{{ $f := 0 }}{{ if .Values.on }}{{ $f = 1 }}{{ end }}{{ $f }}", {"on": 1}, "1"),
        (
            "{{ $n := 0 }}{{ range .Values.l }}{{ if . }}{{ $n = . }}{{ end }}{{ end }}{{ $n }}",
            {"l": [0, 3, 0]},
            "3",
        ),
        # ':=' inside a block declares a new variable there: the outer one is unchanged
        ("{{ $f := 0 }}{{ if .Values.on }}{{ $f := 1 }}{{ end }}{{ $f }}", {"on": 1}, "0"),
    ],
)
def test_language(text: str, values: dict[str, Any], want: str) -> None:
    assert run(text, values) == want


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{{ .Values.a.b }}", "t.yaml:1: nil pointer evaluating .Values.a.b"),
        ("x\n{{ nosuch 1 }}", "t.yaml:2: function 'nosuch' not defined"),
        ("{{ if .Values.a }}x", "missing {{end}}"),
        ("{{ end }}", "unexpected {{end}}"),
        ("{{ .Values.a", "t.yaml:1: unclosed action"),
        ("{{ $y }}", "undefined variable $y"),
        ('{{ include "nope" . }}', "no template 'nope' defined"),
        ('{{ required "need x" .Values.x }}', "need x"),
        ('{{ fail "stop here" }}', "stop here"),
        ("{{ .Values.m }}", "printing a dict directly"),
        ('{{ printf "%s %s" "a" }}', "too few arguments"),
        ("{{ .Values | }}", "missing value"),
        ('{{ define "r" }}{{ include "r" . }}{{ end }}{{ include "r" . }}', "nested too deeply"),
        ('{{ block "b" . }}{{ end }}', "block is not supported"),
        ("{{ range .Values.s }}{{ end }}", "range over str"),
        ("{{ /* open }}", "unterminated comment"),
    ],
)
def test_errors_name_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(TemplateError, match=None) as info:
        run(text, {"m": {"k": 1}, "s": "str"})
    assert message in str(info.value)


def test_values_merge_like_helm() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1, "e": {"f": 1}}
    over = {"a": {"c": [3]}, "d": None, "e": {"g": 2}}
    assert render.merge_values(base, over) == {"a": {"b": 1, "c": [3]}, "e": {"f": 1, "g": 2}}
    assert base["d"] == 1  # inputs untouched


def test_to_yaml_writes_a_shared_value_out_each_time() -> None:
    """A values file's alias (one object met twice) comes out as helm writes it: twice,
    no anchor."""
    shared = {"transitions": 10}
    out = run("{{ toYaml .Values.rules }}", {"rules": [{"h": shared}, {"h": shared}]})
    assert out == "- h:\n    transitions: 10\n- h:\n    transitions: 10"


def test_set_flag() -> None:
    assert render.parse_set("a.b=3") == {"a": {"b": 3}}
    assert render.parse_set("a=true") == {"a": True}
    with pytest.raises(ValueError, match="expected key=value"):
        render.parse_set("novalue")


def test_cli_reports_bad_values_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "v.yaml"
    bad.write_text("- a list\n")
    assert render.main([str(tmp_path.parent), "-f", str(bad)]) == 1
    assert "expected a map at the top" in capsys.readouterr().err
    bad.write_text("a: [unclosed\n")
    assert render.main([str(tmp_path.parent), "-f", str(bad)]) == 1
    assert f"values {bad}" in capsys.readouterr().err


def test_chart_missing_fields(tmp_path: Path) -> None:
    (tmp_path / "templates").mkdir()
    (tmp_path / "Chart.yaml").write_text("apiVersion: v2\nname: x\n")
    with pytest.raises(TemplateError, match=r"Chart\.yaml: version is missing"):
        render.render_chart(tmp_path)


def test_template_that_renders_invalid_yaml_is_named(tmp_path: Path) -> None:
    (tmp_path / "templates").mkdir()
    (tmp_path / "Chart.yaml").write_text("apiVersion: v2\nname: x\nversion: 1.0.0\n")
    (tmp_path / "templates" / "bad.yaml").write_text("a: {{ .Values.v }}\n  b: c\n")
    rendered = render.render_chart(tmp_path, {"v": "x"})
    with pytest.raises(TemplateError, match=r"templates/bad\.yaml does not render to valid YAML"):
        render.manifests(rendered)
