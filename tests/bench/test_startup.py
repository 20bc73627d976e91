"""Start-up (issue 25 item 4): megatron-core imported without TorchDynamo/Inductor and wandb
(``bio_megatron/parallel/lean_import.py``), with nothing else changed: the fused helpers still compile through the
real ``torch.compile`` on their first call, ``torch.compile`` and ``wandb`` are themselves again afterwards.

The import is checked in a fresh interpreter (this test process has megatron-core loaded already); the deferral
itself in a forked child, with a recording backend (Inductor would spend its C++ compile here; compiling in the test
process would leave TorchDynamo's state there, after which a backward pass in it poisons every later forked world).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from harness import run_world

PROBE = r"""
import importlib.util, json, sys
import torch
real = torch.compile
from bio_megatron.parallel.lean_import import deferred_compile
from bio_megatron.parallel.seam import import_megatron_core
import_megatron_core()
import megatron.core.jit as jit
from megatron.core.fusions import fused_bias_gelu
out = {
    "inductor": "torch._inductor.compile_fx" in sys.modules,
    "wandb_loaded": "wandb" in sys.modules,
    "compile_restored": torch.compile is real,
    "jit_fuser_deferred": jit.jit_fuser is deferred_compile,
    "helper_wraps": getattr(fused_bias_gelu.bias_gelu, "__wrapped__", None) is not None,
    "wandb_installed": importlib.util.find_spec("wandb") is not None,
}
if out["wandb_installed"]:
    import wandb
    out["wandb_after"] = wandb.__name__
print(json.dumps(out))
"""


def test_megatron_core_imports_without_inductor_and_wandb_and_leaves_both_usable():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["inductor"] is False and got["wandb_loaded"] is False, got  # the two costs not paid at import
    assert got["compile_restored"] and got["jit_fuser_deferred"] and got["helper_wraps"], got
    if got["wandb_installed"]:  # hidden only while megatron-core loaded: our W&B tracker can still import it
        assert got["wandb_after"] == "wandb", got


def _deferred_helper_compiles() -> bool:
    from bio_megatron.parallel.lean_import import deferred_compile

    graphs = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:  # torch.compile's backend contract
        graphs.append(gm)
        return gm.forward

    def gelu_bias(bias: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = bias + y
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    lazy = deferred_compile(backend=backend, fullgraph=True)(gelu_bias)  # the @torch.compile(...) form
    assert lazy.__wrapped__ is gelu_bias and lazy.__name__ == "gelu_bias"
    assert not graphs  # nothing compiled at decoration time
    b, y = torch.randn(8), torch.randn(4, 8)
    expected = gelu_bias(b, y)
    torch.testing.assert_close(lazy(b, y), expected, rtol=0, atol=0)
    assert len(graphs) == 1  # compiled by the real torch.compile, with our backend, on the first call ...
    torch.testing.assert_close(lazy(b, y), expected, rtol=0, atol=0)
    assert len(graphs) == 1  # ... and reused after that
    module = torch.nn.Linear(2, 2)  # anything but a function is compiled at once, as torch.compile does
    assert type(deferred_compile(module, backend="eager")) is type(torch.compile(module, backend="eager"))
    return True


def test_a_deferred_helper_compiles_on_first_call_with_the_given_options():
    # in a forked child: compiling in the test process would load TorchDynamo there, after which a backward pass in
    # this process (tests/distill's loss tests) marks every later forked world 'unable to handle autograd's threading'
    assert run_world(1, _deferred_helper_compiles) == [True]
