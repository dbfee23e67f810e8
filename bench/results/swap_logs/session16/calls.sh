# ab.py: bench/results/swap_logs/session15/ab.py, copying the captures of the labels in KEEP to $OUT
# call 1 (26a8e1c)
nvidia-smi --query-gpu=name,memory.used --format=csv
KEEP=n40,n50 python3 dev/ab.py $OUT 16 base:0:-: n40:40:-: n50:50:-: 2>&1 | tee $OUT/ab.txt
# call 2 (9e0fea5: early prefetches + the hold after a sync; arms turn them off by env)
E0=PYOBMEM_EARLY_PREFETCH_MIB=0; HS=PYOBMEM_SYNC_HOLD=sync
KEEP=n50 python3 dev/ab.py $OUT 16 base:0:-: n50:50:-: o50:50:-:$E0,$HS e50:50:-:$HS t50:50:-:$E0 \
  n60:60:-: o60:60:-:$E0,$HS n75:75:-: o75:75:-:$E0,$HS 2>&1 | tee $OUT/ab.txt
# call 3 (8fb7f2e: early prefetches may trim idle cache)
E0=PYOBMEM_EARLY_PREFETCH_MIB=0; HS=PYOBMEM_SYNC_HOLD=sync
KEEP=x50 python3 dev/ab.py $OUT 16 base:0:-: x50:50:-:$HS o50:50:-:$E0,$HS x50b:50:-:$HS 2>&1 | tee $OUT/ab.txt
# call 4 (e7799ab = 26a8e1c's code)
python3 scripts/bench_swap.py --parts gpt --fractions 0.75,0.6,0.5,0.9,0.4 --steps 25 --ref-steps 8 --out-dir $OUT --time-budget 505 2>&1 | tee $OUT/gpt_log.txt
# call 5 (e7799ab, the machine still warm)
python3 scripts/bench_swap.py --parts frameworks --steps 25 --out-dir $OUT --time-budget 230
