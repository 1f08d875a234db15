#!/usr/bin/env bash
# The third GPU run's three device calls: `bash device_calls.sh 1|2|3` from the repository
# root on the device, with the wheels (diffusers, pydantic and its deps, the project's own)
# in .whl/; writes $OUT/r.tgz. Call 1 at dcd583e, 2 at 0a7d0bd, 3 at 99327ad.
set -uo pipefail
o="$OUT/r"; mkdir -p "$o"; log="$o/log.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >>"$log" 2>&1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONUNBUFFERED=1
shapes=(--scorers jpeg_compressibility --set train.prompts=shapes:train
        --set train.eval.prompts=shapes:held_out)
flux=(doctor configs/flux_hps.yaml --device cuda --random-weights flux1-dev --blocks 2,4)
st() {  # st NAME LIMIT_S COMMAND...
    local n="$1" l="$2"; shift 2; local t0=$SECONDS
    echo "=== $n: $*" >>"$log"
    timeout --kill-after=5 "$l" "$@" >"$o/$n.json" 2>>"$log"
    echo "=== $n: exit $? after $((SECONDS - t0))s" | tee -a "$log"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$log"
case "${1:?call 1, 2 or 3}" in
1)
    st doctor_flux_2x4_fused 150 g2rpo "${flux[@]}" "${shapes[@]}" --json
    st doctor_flux_2x4_foreach 150 g2rpo "${flux[@]}" "${shapes[@]}" \
        --set optim.implementation=foreach --json
    # (this call's bench learner pair ran fused both times: --adamw did not reach it)
    st plan_memory_big 60 g2rpo bench plan-memory --device cuda --sizes 720 --batches 1,16,48 --json
    st doctor_tree_2x4_fused 90 g2rpo doctor configs/treegrpo_flux.yaml --device cuda \
        --random-weights flux1-dev --blocks 2,4 "${shapes[@]}" \
        --set sampling.prompts_per_worker=1 --json ;;
2)
    for i in 1 2; do for k in fused foreach; do
        st "learner_${k}_$i" 60 g2rpo bench learner --device cuda --repeats 3 --adamw "$k" --json
    done; done ;;
3)
    for b in flash efficient math; do
        st "learner_attn_$b" 50 g2rpo bench learner --device cuda --repeats 2 \
            --attention-backend "$b" --json
    done ;;
esac
cd "$OUT" && tar czf r.tgz r && rm -rf r
