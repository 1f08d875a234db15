"""``g2rpo convert-reward``: published reward checkpoints → from_pretrained directories."""

from __future__ import annotations

import argparse
import json


def _cmd_convert_reward(args: argparse.Namespace) -> int:
    from g2rpo.reward_server.convert import convert_reward

    record = convert_reward(
        args.kind,
        args.src,
        args.out,
        tokenizer=args.tokenizer,
        openclip_config=args.openclip_config,
        head_width=args.vision_head_width,
    )
    if args.json:
        print(json.dumps(record))
    else:
        print(
            f"wrote {args.out}: {args.kind} from {record['source']} "
            f"({record['source_tensors']} tensors, sha256 {record['source_sha256'][:12]}); "
            f"serve it with `g2rpo reward-server --scorers "
            f"{'clip_score' if args.kind in ('dfn5b_clip', 'openclip') else args.kind}={args.out}`"
        )
    return 0


def add_reward_parsers(sub) -> None:
    from g2rpo.reward_server.convert import KINDS

    cv = sub.add_parser(
        "convert-reward",
        help="convert a published reward checkpoint (HPS-v2.1, DFN5B-CLIP, ImageReward) once",
        description=(
            "Map an original checkpoint's tensors into transformers modules and write a "
            "directory the reward server loads with from_pretrained. Every tensor is "
            "accounted for: a missing or mis-shaped one refuses the checkpoint."
        ),
    )
    cv.add_argument("kind", choices=KINDS)
    cv.add_argument(
        "src", help="HPS_v2.1_compressed.pt, open_clip_pytorch_model.bin, ImageReward.pt"
    )
    cv.add_argument("out", help="directory to write")
    cv.add_argument(
        "--tokenizer",
        required=True,
        help="CLIP kinds: a CLIP tokenizer directory or open_clip's bpe_simple_vocab_16e6.txt.gz; "
        "image_reward: a bert-base-uncased tokenizer directory",
    )
    cv.add_argument(
        "--openclip-config",
        default=None,
        help="the model's open_clip_config.json (heads, QuickGELU, mean/std); needed for openclip",
    )
    cv.add_argument(
        "--vision-head-width", type=int, default=None, help="override the preset's head width"
    )
    cv.add_argument("--json", action="store_true", help="print conversion.json's record")
    cv.set_defaults(func=_cmd_convert_reward)
