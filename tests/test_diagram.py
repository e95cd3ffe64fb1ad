"""The diagram exports come from the spec and are well-formed: Mermaid, DOT, pictures, Markdown tables."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from mermaid_subset import MermaidSyntaxError, parse_label, parse_state_diagram

from colo_fsm import diagram
from colo_fsm.diagram.dot import _dot_quote
from colo_fsm.diagram.mermaid import _mermaid_id
from colo_fsm.errors import ConfigError
from colo_fsm.states.spec import LIFECYCLE, State

SPEC_EDGES = [(t.source.value, t.dest.value, t) for t in LIFECYCLE.transitions]
STATE_NAMES = {s.state.value for s in LIFECYCLE.states}


# ---------------------------------------------------------------------------------------------- mermaid
def test_mermaid_parses_and_declares_every_state() -> None:
    d = parse_state_diagram(diagram.to_mermaid())
    assert set(d.states) == STATE_NAMES
    for s in LIFECYCLE.states:
        assert d.states[s.state.value] == diagram.state_conditions(s)
    assert d.title == "colo-fsm lifecycle (lifecycle)"  # the spec's name: see tests/test_diagram_svg.py
    assert d.direction == "TB"


def test_mermaid_has_every_transition_once_with_its_label() -> None:
    d = parse_state_diagram(diagram.to_mermaid())
    edges = [(s, t, lab) for s, t, lab in d.edges if "[*]" not in (s, t)]
    assert len(edges) == len(LIFECYCLE.transitions)
    for (src, dst, label), spec_t in zip(edges, LIFECYCLE.transitions):
        assert (src, dst) == (spec_t.source.value, spec_t.dest.value)
        assert label is not None
        parsed = parse_label(label)
        assert parsed.trigger == spec_t.trigger
        assert parsed.automatic == spec_t.automatic, f"automatic mark wrong on {label!r}"
        assert parsed.when == tuple(str(f) for f in spec_t.when)
        assert parsed.unless == tuple(str(f) for f in spec_t.unless)
        assert parsed.actions == spec_t.actions
    assert ("[*]", LIFECYCLE.initial.value, None) in d.edges
    terminal = {s.state.value for s in LIFECYCLE.states if s.terminal}
    assert {s for s, t, _ in d.edges if t == "[*]"} == terminal


def test_mermaid_styles_each_state_by_kind() -> None:
    d = parse_state_diagram(diagram.to_mermaid())
    assert set(d.classes) == STATE_NAMES
    for s in LIFECYCLE.states:
        assert d.classes[s.state.value] == diagram.state_kind(LIFECYCLE, s)
    assert d.classes["Failed"] == "failed"
    assert d.classes["Generating"] == "resting"
    assert d.classes["Draining"] == "transient"


def test_mermaid_failure_note_names_every_failable_state() -> None:
    d = parse_state_diagram(diagram.to_mermaid())
    assert len(d.notes) == 1
    side, target, lines = d.notes[0]
    assert target == LIFECYCLE.failed.value
    named = set(re.findall(r"[A-Z][a-z]+", " ".join(lines)))
    assert {s.value for s in LIFECYCLE.failable()} <= named
    text = " ".join(lines)
    assert "collector paused" in text and "engine suspended" in text and "no teardown until stop" in text
    assert not any(t == LIFECYCLE.failed.value and s != "[*]" for s, t, _ in d.edges)


def test_mermaid_failure_edges_option() -> None:
    d = parse_state_diagram(diagram.to_mermaid(failure="edges", title=None, direction="LR", conditions=False))
    fail_edges = {s for s, t, lab in d.edges if t == "Failed" and lab and lab.startswith(LIFECYCLE.fail_trigger)}
    assert fail_edges == {s.value for s in LIFECYCLE.failable()}
    assert d.notes == [] and d.title is None and d.direction == "LR"


def test_mermaid_without_actions() -> None:
    d = parse_state_diagram(diagram.to_mermaid(actions=False))
    labels = [parse_label(lab) for s, t, lab in d.edges if lab]
    assert labels and all(lab.actions == () for lab in labels)


def test_diagram_follows_a_derived_spec() -> None:
    """The output is built from the data: dropping a transition drops exactly that edge."""
    dropped = LIFECYCLE.transitions[-1]
    variant = dataclasses.replace(LIFECYCLE, transitions=LIFECYCLE.transitions[:-1])
    full = parse_state_diagram(diagram.to_mermaid())
    less = parse_state_diagram(diagram.to_mermaid(variant))
    assert len(less.edges) == len(full.edges) - 1
    assert (dropped.source.value, dropped.dest.value) not in {(s, t) for s, t, _ in less.edges if s == "Failed"}
    assert f'"{dropped.source.value}" -> "{dropped.dest.value}"' not in diagram.to_dot(variant)
    assert diagram.transitions_table(variant).count("\n| ") == len(variant.transitions)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.replace("    Waking : engine suspended, collector paused\n", ""), "not a declared state"),
        (lambda t: t.replace("stateDiagram-v2", "stateDiagram"), "header"),
        (lambda t: t.replace("    [*] --> Created", "    [*] -> Created"), "not a statement"),
        (lambda t: t.replace("begin_step / ", "begin_step; "), "not a statement"),
        (lambda t: t.replace("    end note\n", ""), "not closed"),
        (lambda t: t.replace(" resting\n", " sleeping\n"), "no classDef"),
        (lambda t: t + "    Ghost --> Created : start\n", "not a declared state"),
        (lambda t: t.replace("    Created : engine absent", "Created : engine absent"), "indented"),
    ],
)
def test_mermaid_parser_rejects_broken_diagrams(mutate, message) -> None:  # type: ignore[no-untyped-def]
    text = diagram.to_mermaid()
    broken = mutate(text)
    assert broken != text, "mutation did not apply"
    with pytest.raises(MermaidSyntaxError, match=message):
        parse_state_diagram(broken)


def test_label_parser_rejects_other_formats() -> None:
    with pytest.raises(ValueError):
        parse_label("conclude when save_this_step")
    assert parse_label("(auto) conclude [a & !b] / x, y").unless == ("b",)


_MERMAID_VERSION, _JSDOM_VERSION = "11.17.2", "29.1.1"
_NODE_CHECK = r"""
import { JSDOM } from 'jsdom';
const dom = new JSDOM('<!doctype html><html><body></body></html>');
globalThis.window = dom.window; globalThis.document = dom.window.document;
Object.defineProperty(globalThis, 'navigator', {value: dom.window.navigator, configurable: true});
const { default: mermaid } = await import('mermaid');
mermaid.initialize({ startOnLoad: false });
let text = '';
for await (const chunk of process.stdin) text += chunk;
try {
  await mermaid.parse(text);
  const d = await mermaid.mermaidAPI.getDiagramFromText(text);
  const states = d.db.getStates();
  const names = states instanceof Map ? [...states.keys()] : Object.keys(states);
  const rel = d.db.getRelations().map(r => [r.id1, r.id2, r.relationTitle || '']);
  console.log(JSON.stringify({ok: true, type: d.type, states: names, relations: rel}));
} catch (e) {
  console.log(JSON.stringify({ok: false, error: String((e && e.message) || e)}));
}
"""


def _mermaid_node_dir() -> Path:
    """A node_modules with mermaid + jsdom: COLO_FSM_MERMAID_DIR, or a per-user cache filled by npm once."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the real Mermaid parse is skipped (the strict subset parser ran)")
    base = os.environ.get("COLO_FSM_MERMAID_DIR")
    d = Path(base) if base else Path.home() / ".cache" / "colo-fsm" / f"mermaid-{_MERMAID_VERSION}"
    if not (d / "node_modules" / "mermaid" / "package.json").is_file():
        if os.environ.get("COLO_FSM_NO_NPM") or shutil.which("npm") is None:
            pytest.skip(f"mermaid npm package not in {d} and npm unavailable or COLO_FSM_NO_NPM set")
        d.mkdir(parents=True, exist_ok=True)
        (d / "package.json").write_text('{"name": "colo-fsm-mermaid-check", "private": true, "type": "module"}\n')
        try:
            proc = subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error",
                 f"mermaid@{_MERMAID_VERSION}", f"jsdom@{_JSDOM_VERSION}"],
                cwd=d, capture_output=True, text=True, timeout=90, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.skip("npm install of mermaid took over 90 s (offline?)")
        if proc.returncode != 0:
            pytest.skip(f"npm install of mermaid failed (offline?): {proc.stderr.strip()[-300:]}")
    (d / "check.mjs").write_text(_NODE_CHECK)
    return d


def _real_mermaid_parse(text: str) -> dict[str, object]:
    d = _mermaid_node_dir()
    proc = subprocess.run(["node", "check.mjs"], cwd=d, input=text, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_real_mermaid_parses_the_diagram() -> None:
    """Mermaid itself (npm ``mermaid`` under node + jsdom) parses the output and sees every state and edge."""
    text = diagram.to_mermaid()
    result = _real_mermaid_parse(text)
    assert result["ok"], result
    assert str(result["type"]).startswith("state")
    states = set(result["states"]) - {"root_start", "root_end"}  # type: ignore[arg-type]
    assert states == STATE_NAMES
    rel = {(a, b, lab) for a, b, lab in result["relations"]}  # type: ignore[union-attr, misc]
    for src, dst, t in SPEC_EDGES:
        assert (src, dst, diagram.transition_label(t)) in rel
    broken = _real_mermaid_parse(text.replace("    [*] --> Created", "    --> Created"))
    assert not broken["ok"], "mermaid accepted a broken diagram: the real-parse check cannot fail"


# ---------------------------------------------------------------------------------------------- dot
_DOT_NODE = re.compile(r'\s*"([^"]+)" \[(.*)\];')
_DOT_EDGE = re.compile(r'\s*"([^"]+)" -> "([^"]+)" \[(.*)\];|\s*"([^"]+)" -> "([^"]+)";')


def _dot_structure(text: str) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """Nodes and edges of the DOT subset we emit; every line must be a known statement."""
    assert text.startswith("digraph colo_fsm_lifecycle {\n") and text.endswith("}\n")
    assert text.count("{") == text.count("}")
    nodes: dict[str, str] = {}
    edges: list[tuple[str, str, str]] = []
    for line in text.splitlines()[1:-1]:
        s = line.strip()
        if s.startswith(("graph [", "node [", "edge [", "subgraph cluster_")) or s == "}":
            continue
        if m := _DOT_EDGE.fullmatch(line):
            a, b, attrs = (m.group(1), m.group(2), m.group(3)) if m.group(1) else (m.group(4), m.group(5), "")
            edges.append((a, b, attrs))
        elif m := _DOT_NODE.fullmatch(line):
            nodes[m.group(1)] = m.group(2)
        else:
            raise AssertionError(f"unexpected DOT line: {line!r}")
    for a, b, _ in edges:
        assert a in nodes and b in nodes, f"edge {a} -> {b} to an undeclared node"
    return nodes, edges


def test_dot_declares_states_and_every_transition() -> None:
    nodes, edges = _dot_structure(diagram.to_dot())
    assert set(nodes) == STATE_NAMES | {"__start__"}
    spec_edges = [e for e in edges if e[0] != "__start__" and "ltail=" not in e[2]]
    assert [(a, b) for a, b, _ in spec_edges] == [(s, d) for s, d, _ in SPEC_EDGES]
    for (_, _, attrs), (_, _, t) in zip(spec_edges, SPEC_EDGES):
        assert ("style=dashed" in attrs) == t.automatic
        assert f'label="{"(auto) " if t.automatic else ""}{t.trigger}' in attrs
    fail = [e for e in edges if "ltail=cluster_failable" in e[2]]
    assert len(fail) == 1 and fail[0][1] == "Failed"
    cluster = diagram.to_dot().split("subgraph cluster_failable {")[1].split("    }")[0]
    assert set(re.findall(r'^\s+"(\w+)" \[', cluster, re.M)) == {s.value for s in LIFECYCLE.failable()}


def test_dot_failure_edges_option() -> None:
    _, edges = _dot_structure(diagram.to_dot(failure="edges", title=None))
    fail = {a for a, b, attrs in edges if b == "Failed" and "style=dotted" in attrs}
    assert fail == {s.value for s in LIFECYCLE.failable()}


def test_dot_quotes_text() -> None:
    assert _dot_quote('a "b" \\ c\nd') == '"a \\"b\\" \\\\ c\\nd"'


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install graphviz)")
def test_dot_parses_with_graphviz() -> None:
    for text in (diagram.to_dot(), diagram.to_dot(failure="edges", rankdir="LR", actions=False)):
        proc = subprocess.run(["dot", "-Tcanon"], input=text, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "Checkpointing" in proc.stdout
    bad = subprocess.run(["dot", "-Tcanon"], input="digraph { a -> }", capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install graphviz)")
def test_render_png_and_svg(tmp_path: Path) -> None:
    png = diagram.render(tmp_path / "lifecycle.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 400 and height > 400
    svg = diagram.render(tmp_path / "out" / "lifecycle.svg").read_text()
    assert "<svg" in svg and all(name in svg for name in STATE_NAMES)


def test_render_without_graphviz_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(diagram.GraphvizNotFound) as err:
        diagram.render(tmp_path / "x.png", dot_binary="colo-fsm-no-such-dot")
    msg = str(err.value)
    assert "apt-get install graphviz" in msg and "brew install graphviz" in msg and "conda" in msg
    assert not (tmp_path / "x.png").exists()


def test_render_rejects_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="output"):
        diagram.render(tmp_path / "x.jpg")


# ---------------------------------------------------------------------------------------------- markdown
def _table_rows(table: str) -> list[list[str]]:
    rows = []
    for line in table.splitlines():
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line)[1:-1]
            rows.append([c.strip() for c in cells])
    return rows


def test_transitions_table_lists_every_transition() -> None:
    rows = _table_rows(diagram.transitions_table())
    header, sep, body = rows[0], rows[1], rows[2:]
    assert header[:7] == ["#", "Trigger", "Source", "Destination", "Guards", "Actions", "Automatic"]
    assert all(len(r) == len(header) for r in rows) and set("".join(sep)) == {"-"}
    assert len(body) == len(LIFECYCLE.transitions)
    for row, t in zip(body, LIFECYCLE.transitions):
        assert row[1] == f"`{t.trigger}`" and row[2] == t.source.value and row[3] == t.dest.value
        assert row[6] == ("yes" if t.automatic else "no")
        assert re.findall(r"`([a-z_]+)`", row[5]) == list(t.actions)
        assert re.findall(r"`(!?[a-z_]+)`", row[4]) == [str(f) for f in t.when] + [f"!{f}" for f in t.unless]
    assert all(s.value in diagram.transitions_table() for s in LIFECYCLE.failable())


def test_states_and_actions_tables() -> None:
    rows = _table_rows(diagram.states_table())[2:]
    assert [r[0].split("**")[1] for r in rows] == [s.state.value for s in LIFECYCLE.states]
    for r, s in zip(rows, LIFECYCLE.states):
        assert (r[2], r[3]) == (s.engine.value, s.collector.value)
    actions = _table_rows(diagram.actions_table())[2:]
    assert [r[0].strip("`") for r in actions] == [a.name for a in LIFECYCLE.actions]


def test_markdown_embeds_mermaid() -> None:
    md = diagram.to_markdown()
    block = md.split("```mermaid\n")[1].split("```")[0]
    assert block == diagram.to_mermaid()


def test_diagram_text_rejects_unknown_format() -> None:
    with pytest.raises(ConfigError, match="format"):
        diagram.diagram_text("plantuml")
    with pytest.raises(ConfigError, match="failure"):
        diagram.to_mermaid(failure="arrows")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="spec"):
        diagram.to_dot("LIFECYCLE")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- docs blocks
def test_regenerate_docs_fills_and_detects(tmp_path: Path) -> None:
    text = "# t\n\n<!-- BEGIN GENERATED: mermaid -->\nold\n<!-- END GENERATED: mermaid -->\ntail\n"
    new, changed, found = diagram.regenerate_docs(text)
    assert changed == ("mermaid",) and found == ("mermaid",)
    assert diagram.to_mermaid() in new and new.endswith("<!-- END GENERATED: mermaid -->\ntail\n")
    again, changed2, _ = diagram.regenerate_docs(new)
    assert again == new and changed2 == ()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("<!-- BEGIN GENERATED: nope -->\n<!-- END GENERATED: nope -->\n", "named one of"),
        ("x\n<!-- BEGIN GENERATED: states -->\nno end\n", "closing"),
        ("<!-- BEGIN GENERATED: states -->\n<!-- END GENERATED: states -->\n" * 2, "once"),
    ],
)
def test_regenerate_docs_rejects_bad_markers(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        diagram.regenerate_docs(text, source="page.md")


def test_update_docs_requires_blocks_and_file(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("no markers\n")
    with pytest.raises(ConfigError, match="mermaid, transitions"):
        diagram.update_docs(page)
    with pytest.raises(ConfigError, match="docs"):
        diagram.update_docs(tmp_path / "missing.md")


def test_state_names_are_valid_mermaid_ids() -> None:
    for s in State:
        assert _mermaid_id(s) == s.value
    with pytest.raises(ConfigError):
        _mermaid_id("end")
