#!/usr/bin/env bash
set -uo pipefail
o="$OUT/r"; mkdir -p "$o"; log="$o/log.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$log" 2>&1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
st() { local n="$1" l="$2"; shift 2; local t0=$SECONDS; echo "=== $n: $*" >>"$log"
  timeout --kill-after=5 "$l" "$@" >"$o/$n.json" 2>>"$log"; echo "=== $n: exit $? after $((SECONDS-t0))s" | tee -a "$log"; }
for i in 1 2; do for k in fused foreach; do
  st learner_${k}_$i 60 g2rpo bench learner --device cuda --repeats 3 --adamw $k --json
done; done
cd "$OUT" && tar czf r.tgz r && rm -rf r
