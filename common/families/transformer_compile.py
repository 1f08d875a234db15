"""Regional compilation of a rollout transformer (``model.compile``): each repeated block
compiled with ``torch.compile``, as diffusers' ``compile_repeated_blocks`` does, so one
compile per block class serves every block of it (FLUX.1-dev's 19 double and 38 single
blocks: two compiles, whatever the depth).

How a compiled block lives with the rest of the worker (each checked on CPU by
tests/test_rollout_compile.py):

- **Shapes.** Blocks are compiled with ``dynamic=True``: the wavefront's batch changes
  from tick to tick, and one symbolic-batch graph per class serves every batch of 2 or
  more (torch specialises sizes 0 and 1, so a batch of one is one more compile). A
  graph break is an error (``fullgraph=True``), never a silent slow path.
- **Weights.** A published version is copied into the same parameters
  (``load_state_dict``): dynamo guards a parameter's metadata (dtype, device, shape,
  strides, requires_grad), not its values, so a new version never recompiles.
- **Offload.** The colocated worker moves its transformer to the host and back keeping
  each Parameter object (torch's swap_tensors conversion). ``swap_tensors`` refuses a
  tensor that has a weakref, and torch (2.13) keeps the last trace's fake-tensor state
  alive from a class attribute (``PhiloxStateTracker``), whose describer holds weakrefs to
  the real parameters (pytorch#186796): ``release_trace_references`` drops that state
  after a call that compiled. Back on the same device the guards pass: no recompile.
- **Dispatch modes.** Under a TorchDispatchMode (torch's FLOP counter) a call runs the
  blocks eagerly (``call_stance``): dynamo does not trace there.
- **Attention kernels.** The SDPA kernel is chosen when a block is traced; a later
  ``sdpa_kernel`` context does not recompile it. The rollout's kernel is therefore
  fixed before its first call (``attention_choice``).
- **Rounding.** Inductor emulates eager's bf16/fp16 roundings (``compile_options``), so
  the rollout's means are the ones the learner's eager recompute finds.
- **CUDA graphs** (``blocks_cuda_graphs``, CUDA only): torch.compile's reduce-overhead
  mode records each block per batch size and replays it; each transformer call starts a
  new cudagraph generation (``cudagraph_mark_step_begin``). Parameters are static inputs:
  after a colocated offload their addresses change and every graph is recorded again.
"""

from __future__ import annotations

import gc
from contextlib import nullcontext

import torch

from ..errors import ConfigError

COMPILE_MODES = ("none", "blocks", "blocks_cuda_graphs")


def compile_options(mode: str) -> dict:
    """``torch.compile``'s arguments for a ``model.compile`` value (not ``none``).
    Inductor keeps eager's roundings (``emulate_precision_casts``): fused bf16 ops would
    otherwise skip the rounding eager makes between them, and the learner, which
    recomputes each log-prob eagerly, would see other means than the rollout sampled
    from (the tiny world in bf16: max |ratio - 1| before any update 4.2e-5, 42% of the
    clip range, against 0 eagerly). ``triton.cudagraphs`` is what mode reduce-overhead
    sets (torch.compile takes a mode or options, not both)."""
    if mode not in COMPILE_MODES or mode == "none":
        raise ValueError(f"model.compile: no compile options for {mode!r}")
    inductor: dict = {"emulate_precision_casts": True}
    if mode == "blocks_cuda_graphs":
        inductor["triton.cudagraphs"] = True
    return {"dynamic": True, "fullgraph": True, "options": inductor}


def repeated_block_classes(transformer: torch.nn.Module) -> list[str]:
    """The class names of a transformer's repeated blocks: diffusers' ``_repeated_blocks``
    where the model declares them (FLUX, Qwen-Image), else the classes that fill its
    top-level ModuleLists (SD3's ``transformer_blocks``: diffusers 0.42 declares none)."""
    declared = list(getattr(transformer, "_repeated_blocks", None) or [])
    if declared:
        return declared
    found: list[str] = []
    for child in transformer.children():
        if isinstance(child, torch.nn.ModuleList) and len(child) >= 2:
            for block in child:
                name = type(block).__name__
                if name not in found:
                    found.append(name)
    return found


def compile_blocks(transformer: torch.nn.Module, mode: str) -> int:
    """Compile ``transformer``'s repeated blocks in place for ``model.compile`` ``mode``;
    the number of blocks compiled (0 for ``none``). The compile itself happens at the
    first call. Refuses CUDA graphs off CUDA and a transformer without repeated blocks."""
    if mode not in COMPILE_MODES:
        raise ConfigError(f"model.compile must be one of {list(COMPILE_MODES)}, got {mode!r}")
    if mode == "none":
        return 0
    device = next(transformer.parameters()).device
    if mode == "blocks_cuda_graphs" and device.type != "cuda":
        raise ConfigError(
            f"model.compile blocks_cuda_graphs: CUDA graphs exist on CUDA devices only and "
            f"the transformer is on {device}: use model.compile blocks (or none) there"
        )
    classes = repeated_block_classes(transformer)
    if not classes:
        raise ConfigError(
            f"model.compile {mode}: {type(transformer).__name__} has no repeated blocks to "
            "compile (no _repeated_blocks, no ModuleList of blocks): use model.compile none"
        )
    options = compile_options(mode)
    if list(getattr(transformer, "_repeated_blocks", None) or []) == classes:
        transformer.compile_repeated_blocks(**options)  # diffusers' own selection
    else:
        for module in transformer.modules():
            if type(module).__name__ in classes:
                module.compile(**options)  # what compile_repeated_blocks does per block
    return compiled_blocks(transformer)


def check_placement(mode: str, placement: str) -> None:
    """Refuse CUDA graphs on a colocated worker: their memory pool (each recorded
    graph's outputs, per batch size) stays on the GPU while the learner has it, since an
    offload frees only the caching allocator's blocks, and each offload moves the
    parameters the graphs were recorded with, so every rollout records them again."""
    if mode == "blocks_cuda_graphs" and placement == "colocated":
        raise ConfigError(
            "model.compile blocks_cuda_graphs with train.placement colocated: the CUDA "
            "graphs' memory stays on the GPU through the learner's turn and is recorded "
            "again after every offload: use model.compile blocks"
        )


def compiled_blocks(module: torch.nn.Module) -> int:
    """How many submodules of ``module`` run compiled (``nn.Module.compile``)."""
    return sum(getattr(m, "_compiled_call_impl", None) is not None for m in module.modules())


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far (a recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def release_trace_references() -> None:
    """Drop the last trace's fake-tensor state that torch keeps alive after a compile
    (``PhiloxStateTracker``'s class attributes hold a fake seed of its FakeTensorMode,
    whose describer holds weakrefs to the real parameters): with those weakrefs on them
    the parameters cannot be moved by swap_tensors (pytorch#186796). A torch without that
    tracker has nothing to release here."""
    try:
        from torch._decomp.decompositions_for_rng import PhiloxStateTracker
    except ImportError:
        return
    reset = getattr(PhiloxStateTracker, "reset", None)
    if reset is not None:
        reset()
    gc.collect()  # the fake mode's reference cycles, and with them the weakrefs


def call_stance():
    """How one call of a compiled transformer runs: eagerly while a TorchDispatchMode is
    active (a FLOP counter such as the doctor's FLOPs per NFE, a memory tracker), under
    which dynamo does not trace and ``fullgraph=True`` would raise; compiled otherwise."""
    try:
        from torch.utils._python_dispatch import is_in_torch_dispatch_mode

        active = is_in_torch_dispatch_mode(include_infra_modes=False)
    except (ImportError, TypeError):  # a torch without it: no mode is seen
        active = False
    return torch.compiler.set_stance("force_eager") if active else nullcontext()


def mark_cuda_graph_step() -> None:
    """A new cudagraph generation: the previous transformer call's block outputs may be
    overwritten by this call's replays (none of them outlives its call)."""
    torch.compiler.cudagraph_mark_step_begin()
