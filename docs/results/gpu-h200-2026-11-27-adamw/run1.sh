#!/usr/bin/env bash
# third GPU run: AdamW kernels (fused vs foreach) at the learner's peak, big sampler calls
set -uo pipefail
o="$OUT/r"; mkdir -p "$o"; log="$o/log.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$log" 2>&1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
shapes=(--scorers jpeg_compressibility --set train.prompts=shapes:train --set train.eval.prompts=shapes:held_out)
st() { local n="$1" l="$2"; shift 2; local t0=$SECONDS; echo "=== $n: $*" >>"$log"
  timeout --kill-after=5 "$l" "$@" >"$o/$n.json" 2>>"$log"; echo "=== $n: exit $? after $((SECONDS-t0))s" | tee -a "$log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$log"
st doctor_flux_2x4_fused 150 g2rpo doctor configs/flux_hps.yaml --device cuda --random-weights flux1-dev --blocks 2,4 "${shapes[@]}" --json
st doctor_flux_2x4_foreach 150 g2rpo doctor configs/flux_hps.yaml --device cuda --random-weights flux1-dev --blocks 2,4 "${shapes[@]}" --set optim.implementation=foreach --json
st learner_fused 60 g2rpo bench learner --device cuda --repeats 2 --adamw fused --json
st learner_foreach 60 g2rpo bench learner --device cuda --repeats 2 --adamw foreach --json
st plan_memory_big 60 g2rpo bench plan-memory --device cuda --sizes 720 --batches 1,16,48 --json
st doctor_tree_2x4_fused 90 g2rpo doctor configs/treegrpo_flux.yaml --device cuda --random-weights flux1-dev --blocks 2,4 "${shapes[@]}" --set sampling.prompts_per_worker=1 --json
cd "$OUT" && tar czf r.tgz r && rm -rf r
