"""Arguments the one-node checks share (`g2rpo doctor`, `g2rpo bench handoff`): the run
config with its overrides on this node's device, and random weights of a known
architecture (shrunk to a few blocks) for a node that has no checkpoint yet."""

from __future__ import annotations

import argparse

from g2rpo.common.errors import UsageError


def add_one_node_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="run config (YAML)")
    p.add_argument("--set", action="append", default=[], metavar="a.b=c", help="override")
    p.add_argument("--device", default=None, help="model.device for this check (e.g. cuda)")
    p.add_argument(
        "--random-weights",
        default=None,
        metavar="ARCH",
        help="random weights instead of model.pretrained: flux1-dev, sd35-medium or "
        "qwen-image (the shipped FLUX.1-dev, SD3.5-Medium and Qwen-Image configs) or tiny (the "
        "committed world's), saved in model.dtype to a temporary dir",
    )
    p.add_argument(
        "--blocks",
        default=None,
        metavar="DOUBLE,SINGLE",
        help="with --random-weights: the transformer's width with this many blocks (e.g. 2,4; "
        "SD3 and Qwen-Image: LAYERS,0)",
    )


def one_node_config(args: argparse.Namespace):
    """(the config on this node's device, its overrides); a bad config says so here,
    before torch loads."""
    from g2rpo.common.cluster.one_node import device_overrides
    from g2rpo.common.config.loading import load_config

    overrides = device_overrides(args.config, list(args.set), args.device)
    return load_config(args.config, overrides), overrides


def parse_blocks(args: argparse.Namespace) -> tuple[int, int] | None:
    """``--blocks DOUBLE,SINGLE`` (only with ``--random-weights``)."""
    if args.blocks is None:
        return None
    if args.random_weights is None:
        raise UsageError("--blocks needs --random-weights")
    try:
        double, single = (int(x) for x in args.blocks.split(","))
    except ValueError:
        raise UsageError(
            f"--blocks: expected DOUBLE,SINGLE such as 2,4, got {args.blocks!r}"
        ) from None
    return double, single
