"""The model families (FLUX, SD3, Qwen-Image): which one a pipeline directory is, each
family's components and velocity adapter, how transformers are called, compiled
and given LoRA.

May import ``common/health``, ``common/config`` and those below them."""
