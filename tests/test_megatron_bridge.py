"""The real megatron-bridge (0.6.2, installed with ``--no-deps`` by ``make setup``): its ``AutoMapping`` cannot
tell how a module of class ``InferenceColumnParallelLinear`` is sharded until colo-fsm registers megatron-core's
inference linear types (:func:`~colo_fsm.adapters.megatron.bridge.register_inference_linear_types`), can after,
and registering twice changes nothing.

``import megatron.bridge`` loads every model bridge (transformers, rich, ...: the dependencies ``--no-deps``
leaves out), so the script imports only the registry module, ``megatron.bridge.models.conversion.param_mapping``:
the package ``__init__`` files are skipped, and the two names its helper module takes from transformers and rich
at import (used only for type hints and printing tables) are placeholders when those packages are absent. It runs
in a subprocess so none of that reaches other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec

import pytest

pytest.importorskip("megatron.core")

SCRIPT = r"""
import importlib.machinery, importlib.util, json, sys, types
from pathlib import Path

root = Path(importlib.util.find_spec("megatron.bridge").submodule_search_locations[0])
for name, sub in [("megatron.bridge", "."), ("megatron.bridge.models", "models"),
                  ("megatron.bridge.models.conversion", "models/conversion"), ("megatron.bridge.utils", "utils")]:
    pkg = types.ModuleType(name)
    pkg.__path__ = [str(root / sub)]
    pkg.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    sys.modules[name] = pkg
placeholders = []
for module, attr in [("transformers.configuration_utils", "PretrainedConfig"), ("rich.table", "Table")]:
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is None:
        for name in (top, module):
            sys.modules.setdefault(name, types.ModuleType(name))
        setattr(sys.modules[module], attr, type(attr, (), {}))
        placeholders.append(module)

import torch
from megatron.bridge.models.conversion.param_mapping import AutoMapping

from colo_fsm.adapters.megatron.bridge import INFERENCE_LINEAR_TYPES, megatron_bridge_available, register_inference_linear_types

# megatron-core's own InferenceColumnParallelLinear subclasses a Transformer Engine layer (absent on a CPU
# machine); the registry looks the module up by its class name, so a torch module of that class stands in.
module = type("InferenceColumnParallelLinear", (torch.nn.Module,), {})()
mapping = AutoMapping("decoder.layers.0.mlp.linear_fc1.weight", "model.layers.0.mlp.up_proj.weight")

def detect():
    try:
        return mapping._detect_parallelism_type(module)
    except ValueError as exc:
        return "error: " + str(exc).splitlines()[0]

def snapshot():
    return {k: sorted(v) for k, v in AutoMapping._MODULE_TYPE_REGISTRY.items()}

before = detect()
first = register_inference_linear_types()
after, registry = detect(), snapshot()
second = register_inference_linear_types()
print(json.dumps({
    "placeholders": placeholders, "available": megatron_bridge_available(), "before": before, "after": after,
    "first": first, "second": second, "idempotent": snapshot() == registry, "after_second": detect(),
    "registered": {n: n in registry[k] for n, k in INFERENCE_LINEAR_TYPES.items()},
}))
"""


def test_inference_column_linear_needs_the_registration_and_it_is_idempotent() -> None:
    assert find_spec("megatron.bridge") is not None, "megatron-bridge 0.6.2 is not installed: run `make setup`"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["available"][0], res["available"]
    assert res["before"].startswith(
        "error: Cannot determine parallelism type for module 'InferenceColumnParallelLinear'"
    )
    assert res["after"] == "column" and res["after_second"] == "column"
    assert (
        res["first"]
        == res["second"]
        == {
            "InferenceColumnParallelLinear": "column",
            "InferenceLayerNormColumnParallelLinear": "column",
            "InferenceRowParallelLinear": "row",
        }
    )
    assert res["idempotent"] and all(res["registered"].values()), res
