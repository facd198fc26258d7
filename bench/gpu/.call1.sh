set -u
source bench/gpu/env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "bundle: $DH_COMMIT"; date -u
timeout 100 drafthead-bench-cuda --no-epilogue --variants=801,830,835,836,837 --ms=1,17,64 > $OUT/gemv.txt 2>&1; echo "bench rc=$?"
cat $OUT/gemv.txt | tail -30
date -u
timeout 90 cuda_kernels_test --gtest_filter='CudaGemv.OneTile*:CudaGemv.WgmmaRows*' > $OUT/kernels_new.txt 2>&1; echo "kernels rc=$?"
grep -E '^\[  (PASSED|FAILED) |worst|OK \]|FAILED|Failure' $OUT/kernels_new.txt | head -30
date -u
