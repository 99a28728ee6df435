#!/usr/bin/env bash
# GPU check of the batched path (issue #24), one GPU, under 8 minutes:
#   1. the device subset of the nn tests on cuda (tests/nn/test_nn_device.py, test_nn_sync.py);
#   2. benchmarks/bench_layers.py on cuda: sv_attention and SVAttention fwd+bwd against
#      scaled_dot_product_attention at T = 256 ... 4096, fp32 and bf16, with peak memory;
#   3. benchmarks/bench_lm_throughput.py on cuda: the paper's 3.22M CharLM, hybrid_sv vs
#      matched sliding vs softmax tokens/s and peak memory (the paper: 9,125 tokens/s, MPS);
#   4. SUMMARY.md beside the JSON files.
# Writes $OUT (default results/gpu): nn_tests.json, bench_layers.json, lm_throughput.json,
# SUMMARY.md. `--dry-run` runs every step on tiny sizes on cpu (a default-suite test does,
# so the script cannot rot); it writes to a new temporary folder unless --out is given.
#
#   scripts/gpu_check.sh [--dry-run] [--out DIR]      (PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
DRY=0
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT="$2"; shift ;;
    *) echo "usage: $0 [--dry-run] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$DRY" = 1 ]; then
  DEV=cpu; OUT=${OUT:-$(mktemp -d -t svattn-gpu-dry-run.XXXXXX)}
  LAYER_ARGS=(--T 32 64 --B 1 --H 2 --D 8 --C 0.1 --reps 1)
  LM_ARGS=(--batch 2 --block 32 --rounds 1 --steps 1 --threads 1)
else
  DEV=cuda; OUT=${OUT:-results/gpu}
  LAYER_ARGS=(--T 256 1024 4096 --B 2 --H 4 --D 32 --C 0.05 --reps 5)
  LM_ARGS=(--batch 16 --block 256 --rounds 3 --steps 3 --threads 1)
fi
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
echo "== 1/4 nn tests on $DEV"
set +e
SVATTN_TEST_DEVICE=$DEV "$PY" -m pytest -q -p no:cacheprovider \
  tests/nn/test_nn_device.py tests/nn/test_nn_sync.py --junitxml="$OUT/nn_tests.xml"
TESTS_RC=$?
set -e
"$PY" - "$OUT" "$DEV" "$TESTS_RC" <<'PYEOF'
import json, sys, xml.etree.ElementTree as ET
out, dev, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
suite = ET.parse(f"{out}/nn_tests.xml").getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
keys = ("tests", "failures", "errors", "skipped")
rec = {"device": dev, "exit_code": rc, **{k: int(suite.get(k, 0)) for k in keys},
       "command": f"SVATTN_TEST_DEVICE={dev} pytest tests/nn/test_nn_device.py tests/nn/test_nn_sync.py"}
open(f"{out}/nn_tests.json", "w").write(json.dumps(rec, indent=2) + "\n")
PYEOF
echo "== 2/4 bench_layers on $DEV"
"$PY" benchmarks/bench_layers.py --device "$DEV" --dtype fp32 bf16 "${LAYER_ARGS[@]}" \
  --json "$OUT/bench_layers.json"
echo "== 3/4 bench_lm_throughput (paper-3m) on $DEV"
rm -f "$OUT/lm_throughput.json"
"$PY" benchmarks/bench_lm_throughput.py --device "$DEV" --out "$OUT/lm_throughput.json" \
  "${LM_ARGS[@]}"
echo "== 4/4 summary"
"$PY" - "$OUT" "$DRY" <<'PYEOF'
import json, sys
out, dry = sys.argv[1], sys.argv[2] == "1"
tests = json.load(open(f"{out}/nn_tests.json"))
layers = json.load(open(f"{out}/bench_layers.json"))
lm = json.load(open(f"{out}/lm_throughput.json"))
lines = ["# GPU check" + (" (dry run: tiny sizes on cpu)" if dry else ""), "",
         f"nn tests on {tests['device']}: {tests['tests']} run, {tests['failures']} failed, "
         f"{tests['errors']} errors, {tests['skipped']} skipped.", "",
         f"## Layers ({layers['command']})", "",
         "| dtype | what | T | SV tok/s | softmax tok/s | SV / softmax time | SV peak MiB |",
         "|---|---|---|---|---|---|---|"]
for r in layers["rows"]:
    if "error" in r:
        lines.append(f"| {r['dtype']} | {r['what']} | {r['T']} | failed: {r['error']} | | | |")
        continue
    peak = "" if r.get("sv_peak_mib") is None else f"{r['sv_peak_mib']:.0f}"
    lines.append(f"| {r['dtype']} | {r['what']} | {r['T']} | {r['sv_tok_s']:.0f} | "
                 f"{r['softmax_tok_s']:.0f} | {r['slowdown']:.2f}x | {peak} |")
lines += ["", f"## 3.22M CharLM training throughput ({lm[0]['command']})", "",
          "| model | tokens/s | slowdown vs softmax | peak MiB |", "|---|---|---|---|"]
for r in lm:
    peak = "" if r.get("peak_mib") is None else f"{r['peak_mib']:.0f}"
    lines.append(f"| {r['mixer']} | {r['train_tokens_per_s']:.0f} | "
                 f"{r['slowdown_vs_softmax']:.2f}x | {peak} |")
lines.append("| paper, hybrid (Apple MPS) | 9125 | | |")
open(f"{out}/SUMMARY.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
echo "wrote $OUT"
exit "$TESTS_RC"
