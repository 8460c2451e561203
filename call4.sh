source scripts/gpu/device_setup.sh; export PYTHONPATH=.:$PYTHONPATH
echo "== decode gpu tests"; timeout -s KILL 200 python3 -m pytest -q -m gpu -n 6 tests/test_gluon_decode_gpu.py -p no:cacheprovider 2>&1 | tail -3
rows() { grep -E "^\| " $1 | cut -d"|" -f2,3,6,9,10,12; grep -E "geo-mean|ran as" $1 | head -8; }
V="--backend-file scripts/dev/triton_variants.py -q --format markdown --compact --warmup-ms 10 --measure-ms 60"
S=attnbench/scenarios/gpu/fp8-decode-16k.yaml
for pg in 16 32 64 256; do echo "== d64 page $pg"; timeout -s KILL 90 python3 -m attnbench run $S --set kv_cache.page_size=$pg --set kv_cache.dtype=fp8_e4m3 --set model.head_dim=64 -b triton -b triton-gd-tma -b triton-gd-cpall $V --out $OUT/d$pg > $OUT/d$pg.md 2>&1; rows $OUT/d$pg.md; done
echo "== d64 e5m2 G8 page 16"; timeout -s KILL 90 python3 -m attnbench run $S --set kv_cache.dtype=fp8_e5m2 --set model.head_dim=64 --set model.num_q_heads=64 -b triton -b triton-gd-tma $V --out $OUT/g8 > $OUT/g8.md 2>&1; rows $OUT/g8.md
echo "== gpt-oss sliding decode fp8"; timeout -s KILL 120 python3 -m attnbench run attnbench/scenarios/gpt-oss-sliding-layer.yaml --set kv_cache.dtype=fp8_e4m3 -k decode -b triton -b triton-gd-tma $V --out $OUT/oss > $OUT/oss.md 2>&1; rows $OUT/oss.md
echo "== held-out decode"; timeout -s KILL 170 python3 scripts/gpu/tree_held_out.py --route decode --seeds 992 993 --n 30 --budget-s 160 --out /tmp/held > $OUT/held.txt 2>&1; grep -c "ran as 'gluon" $OUT/held.txt; grep -v ": ok rel err" $OUT/held.txt | tail -8
