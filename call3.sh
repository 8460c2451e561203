source scripts/gpu/device_setup.sh; export PYTHONPATH=.:$PYTHONPATH
echo "== decode gpu tests"; timeout -s KILL 240 python3 -m pytest -q -m gpu -n 6 tests/test_gluon_decode_gpu.py -p no:cacheprovider 2>&1 | tail -4
rows() { grep -E "^\| " $1 | cut -d"|" -f2,3,6,9,10,12; grep -E "geo-mean" $1 | head -8; }
V="--backend-file scripts/dev/triton_variants.py -q --format markdown --compact --warmup-ms 10 --measure-ms 60"
S=attnbench/scenarios/gpu/fp8-decode-16k.yaml
B="-b triton -b triton-gd-cp -b triton-gd-cp-s3 -b triton-gd-cp-s4"
for pg in 16 32; do echo "== page $pg"; timeout -s KILL 100 python3 -m attnbench run $S --set kv_cache.page_size=$pg --set kv_cache.dtype=fp8_e4m3 $B $V --out $OUT/p$pg > $OUT/p$pg.md 2>&1; rows $OUT/p$pg.md; done
echo "== d64 page 16"; timeout -s KILL 100 python3 -m attnbench run $S --set kv_cache.dtype=fp8_e4m3 --set model.head_dim=64 $B $V --out $OUT/d64 > $OUT/d64.md 2>&1; rows $OUT/d64.md
echo "== ragged e4m3 page 16"; timeout -s KILL 100 python3 -m attnbench run attnbench/scenarios/gpu/ragged-decode.yaml --set kv_cache.dtype=fp8_e4m3 --set kv_cache.page_size=16 $B $V --out $OUT/rg > $OUT/rg.md 2>&1; rows $OUT/rg.md
echo "== sinks+softcap page 16"; timeout -s KILL 100 python3 -m attnbench run $S --set kv_cache.dtype=fp8_e4m3 --set model.sinks=true --set model.softcap=30 $B $V --out $OUT/sc > $OUT/sc.md 2>&1; rows $OUT/sc.md
