#!/usr/bin/env bash
# One call on a GPU machine: kernels nobody wrote for accy (CUDA C++ with CUDA's headers,
# Triton-lang, nvcc cubins) through a real daemon, the launch-path suites after the
# parameter-layout change, the one-process C ceiling of waited launches (bench/ceiling.c),
# and the Triton matmul through accy against in-process.
# Needs carried: .whl/ (bench/device_env.sh). Logs under $OUT; a short table last.
set -u
source bench/device_env.sh || exit 1
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $PY -c "import triton, cuda.bindings; print('triton', triton.__version__, 'cuda-bindings', cuda.bindings.__version__)"
  $PY -c "from accyd.backends.cuda.compile_cache import cuda_include_dirs as d; print('CUDA headers:', d())"
  $PY -c "import accyd.ring.engine._native" 2>&1 | tail -1 && echo "native engine: built"
} > "$OUT/env.txt" 2>&1
step user_kernels 240 $PY -m pytest -q -p no:cacheprovider -x tests/backends/test_user_kernels.py
step launch_path 300 $PY -m pytest -q -p no:cacheprovider ${SUITES:-tests/backends/test_cuda.py tests/backends/test_cuda_kernels.py tests/backends/test_cuda_prepared.py tests/engine tests/ring tests/core}
step ceiling 120 bash -c 'nvcc -cubin -arch=sm_90 -o /tmp/fma.cubin bench/catalog/fma.cu &&
  cc -O2 -pthread -o /tmp/ceiling bench/ceiling.c -ldl &&
  /tmp/ceiling /tmp/fma.cubin 6.5 2 1 4 8 16 32 && /tmp/ceiling /tmp/fma.cubin 46.7 2 1 8 32'
step matmul 180 $PY bench/triton_matmul.py --size ${MATMUL_SIZE:-4096} --launches ${MATMUL_LAUNCHES:-200}
echo "==== env"; cat "$OUT/env.txt"
echo "==== steps"; cat "$STEPS/steps.txt"
for name in user_kernels launch_path; do
  echo "==== $name"; grep -E "passed|failed|error" "$STEPS/$name.log" | tail -2
  grep -E "^(FAILED|ERROR)|Error:" "$STEPS/$name.log" | head -12
done
echo "==== one-process ceiling (C, launch + synchronize per thread)"; cat "$STEPS/ceiling.log"
echo "==== matmul"; tail -3 "$STEPS/matmul.log"
