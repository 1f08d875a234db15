#!/usr/bin/env bash
set -uo pipefail
o="$OUT/r"; mkdir -p "$o"; log="$o/log.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$log" 2>&1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
st() { local n="$1" l="$2"; shift 2; local t0=$SECONDS; echo "=== $n: $*" >>"$log"
  timeout --kill-after=5 "$l" "$@" >"$o/$n.json" 2>>"$log"; echo "=== $n: exit $? after $((SECONDS-t0))s" | tee -a "$log"; }
for b in flash efficient math; do
  st learner_attn_$b 50 g2rpo bench learner --device cuda --repeats 2 --attention-backend $b --json
done
cd "$OUT" && tar czf r.tgz r && rm -rf r
