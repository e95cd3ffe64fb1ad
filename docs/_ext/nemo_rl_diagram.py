"""The NeMo-RL preset's diagram with NeMo-RL's own calls as notes, for docs/embedding.md (docs tooling).

The diagram is ``colo_fsm.diagram.to_mermaid(NEMO_RL)``: generated from the spec, never drawn by hand. Each
note names the calls of NeMo-RL's async GRPO step (``nemo_rl/algorithms/grpo.py``, ``async_grpo_train``) that
happen while the machine is in that state, so a NeMo-RL reviewer finds ``prepare_for_refit``,
``set_weight_version`` or ``offload_after_refit`` on the picture. The page shows it as an SVG drawn by
``colo_fsm.diagram.to_svg`` (at :data:`PICTURE`), with the Mermaid source below it.
``tests/test_docs_content.py`` checks that the page and the SVG hold exactly what this module generates;
``python docs/_ext/nemo_rl_diagram.py`` rewrites both.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "embedding.md"
PICTURE = PAGE.parent / "diagrams" / "nemo_rl_annotated.svg"
TITLE = "colo-fsm NEMO_RL preset, with NeMo-RL's calls as notes"
BEGIN, END = "<!-- BEGIN GENERATED: nemo-rl-annotated -->", "<!-- END GENERATED: nemo-rl-annotated -->"

NEMO_RL_CALLS: dict[str, tuple[str, ...]] = {
    "Starting": ("policy_generation.prepare_for_generation()", "dp_openai_server_base_urls published"),
    "Generating": ("trajectory_collector.set_weight_version(v)", "start_collection() or resume_after_refit()"),
    "Draining": ("trajectory_collector.prepare_for_refit()", "policy_generation.finish_generation(release_gpu=True)"),
    "Training": (
        "policy.prepare_for_lp_inference(), policy.get_logprobs()",
        "policy.prepare_for_training(), policy.train()",
        "weight_version += 1",
    ),
    "Waking": (
        "policy.offload_before_refit(), policy.offload_after_refit()",
        "refit_policy_generation() is not needed (weights read in place)",
        "then trajectory_collector.resume_after_refit()",
    ),
    "Validating": ("trajectory_collector.pause()", "policy_generation.prepare_for_generation(), validate()"),
    "Concluding": (
        "_validation_early_stop_message()",
        "saving_this_step = will_save_checkpoint or early_stop",
        "finish_generation(release_gpu=saving_this_step)",
    ),
    "Checkpointing": (
        "checkpointer.finalize_pending(), policy.save_checkpoint()",
        "begin_finalization(wait_fn=policy.finalize_async_save)",
    ),
    "Stopped": ("checkpointer.shutdown()",),
}
"""NeMo-RL's calls of one async GRPO step (colocated Megatron generation), by the colo-fsm state they fall in."""


def annotated_mermaid() -> str:
    """Mermaid text of the NEMO_RL preset with one note of NeMo-RL calls per state of :data:`NEMO_RL_CALLS`."""
    from colo_fsm.diagram import to_mermaid
    from colo_fsm.states import NEMO_RL

    states = {s.state.value for s in NEMO_RL.states}
    unknown = sorted(set(NEMO_RL_CALLS) - states)
    if unknown:
        raise ValueError(f"NEMO_RL_CALLS names states the NEMO_RL preset does not have: {unknown}")
    lines = to_mermaid(NEMO_RL, title=TITLE).rstrip("\n").split("\n")
    at = next(i for i, ln in enumerate(lines) if ln.startswith("    class "))
    notes: list[str] = []
    for state, calls in NEMO_RL_CALLS.items():
        notes.append(f"    note right of {state}")
        notes += [f"        {'NeMo-RL ' if i == 0 else ''}{c}" for i, c in enumerate(calls)]
        notes.append("    end note")
    return "\n".join([*lines[:at], *notes, *lines[at:]]) + "\n"


def annotated_svg() -> str:
    """The same diagram as an SVG picture, the calls written under each state's conditions."""
    from colo_fsm.diagram import to_svg
    from colo_fsm.states import NEMO_RL

    notes = {
        state: [f"NeMo-RL: {c}" if i == 0 else c for i, c in enumerate(calls)] for state, calls in NEMO_RL_CALLS.items()
    }
    return to_svg(NEMO_RL, title=TITLE, notes=notes)


def block() -> str:
    """The page's generated section, markers included: the picture, then its Mermaid source folded."""
    link = f"diagrams/{PICTURE.name}"
    return (
        f"{BEGIN}\n[![{TITLE}]({link})]({link})\n\n"
        '<details markdown="1"><summary>The same diagram as Mermaid source (GitHub draws it too)</summary>\n\n'
        f"```mermaid\n{annotated_mermaid()}```\n\n</details>\n{END}"
    )


def current(text: str) -> str:
    """The generated section as it stands in ``text``."""
    m = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, re.S)
    if not m:
        raise ValueError(f"{PAGE}: no {BEGIN} ... {END} section")
    return m.group(0)


def main(argv: list[str]) -> int:
    """Rewrite the section (``--check``: only say whether it is up to date)."""
    text = PAGE.read_text(encoding="utf-8")
    fresh, svg = block(), annotated_svg()
    svg_ok = PICTURE.is_file() and PICTURE.read_text(encoding="utf-8") == svg
    if current(text) == fresh and svg_ok:
        print(f"{PAGE}: up to date")
        return 0
    if "--check" in argv:
        print(f"{PAGE}: the NeMo-RL diagram is out of date; run python docs/_ext/nemo_rl_diagram.py")
        return 1
    PAGE.write_text(text.replace(current(text), fresh), encoding="utf-8")
    PICTURE.parent.mkdir(parents=True, exist_ok=True)
    PICTURE.write_text(svg, encoding="utf-8")
    print(f"{PAGE}: updated ({PICTURE.name} too)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
