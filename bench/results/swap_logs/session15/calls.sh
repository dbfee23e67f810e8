set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >$OUT/build.txt 2>&1 || { cat $OUT/build.txt; exit 1; }
gcc -O2 -g -std=gnu11 -fPIC -shared -fvisibility=hidden -Idev/old/pyobmem/include -Idev/old/native -I/usr/local/cuda/include \
  -o /tmp/old.so dev/old/native/*.c -ldl -lpthread >>$OUT/build.txt 2>&1 || { cat $OUT/build.txt; exit 1; }
nvidia-smi --query-gpu=name,memory.used --format=csv
python3 dev/ab.py $OUT 16 base:0:-: r60:60:-: f60:60:-:PYOBMEM_OUT_ORDER=fifo o60:60:/tmp/old.so: \
  r50:50:-: f50:50:-:PYOBMEM_OUT_ORDER=fifo o50:50:/tmp/old.so: r75:75:-: o75:75:/tmp/old.so: 2>&1 | tee $OUT/ab.txt
# call 2
  -o /tmp/old.so dev/old/native/*.c -ldl -lpthread >>$OUT/build.txt 2>&1 || { cat $OUT/build.txt; exit 1; }
python3 dev/ab.py $OUT 16 base:0:-: n75:75:-: o75:75:/tmp/old.so: n75b:75:-: o75b:75:/tmp/old.so: \
  n60:60:-: o60:60:/tmp/old.so: n50:50:-: o50:50:/tmp/old.so: 2>&1 | tee $OUT/ab.txt
# call 3 (the bench)
python3 scripts/bench_swap.py --parts gpt --fractions 0.75,0.6,0.5,0.9,0.4 --steps 25 --ref-steps 8 --out-dir $OUT --time-budget 505
# call 4
python3 dev/ab.py $OUT 16 n40:40:-: o40:40:/tmp/old.so:
