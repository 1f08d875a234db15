"""Seconds per 720² decode by a rehearsal's 1-channel VAE, with oneDNN's convolutions
and without (``torch.backends.mkldnn.enabled``), one thread, alternating twice. Behind
docs/rehearsals.md, "Where a rehearsal's time goes":

    .venv/bin/python docs/rehearsals/vae_decode_onednn.py REHEARSAL_OUT/shared/models/pipeline/vae

(REHEARSAL_OUT: a `g2rpo rehearse --out` folder)."""

from __future__ import annotations

import sys
import time

import torch
from diffusers import AutoencoderKL

torch.set_num_threads(1)
vae = AutoencoderKL.from_pretrained(sys.argv[1]).eval()
latent = torch.randn(1, vae.config.latent_channels, 90, 90)  # a 720² image's
for onednn in (True, False, True, False):
    torch.backends.mkldnn.enabled = onednn
    with torch.inference_mode():
        vae.decode(latent)  # warm-up
        t0 = time.perf_counter()
        for _ in range(10):
            vae.decode(latent)
    print(f"oneDNN {'on ' if onednn else 'off'}: {(time.perf_counter() - t0) / 10:.3f} s a decode")
