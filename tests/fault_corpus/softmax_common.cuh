// Shared helpers for the raw-CUDA fault-corpus kernels (self-contained: NVRTC has no CUDA headers
// here). bf16 tensors are unsigned short bit patterns. Row softmax over 4096 columns, 256 threads.
#define ROW_N 4096
#define THREADS 256
#define PER_THREAD (ROW_N / THREADS)

__device__ __forceinline__ float bf2f(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ unsigned short f2bf(float f) {
  unsigned u = __float_as_uint(f);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}

__device__ float block_reduce(float v, bool is_max) {
  __shared__ float part[THREADS / 32];
  for (int o = 16; o; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = part[0];
  for (int i = 1; i < THREADS / 32; ++i) r = is_max ? fmaxf(r, part[i]) : r + part[i];
  __syncthreads();
  return r;
}

// Correct softmax of one row; also copies the result to `copy` when it is not null.
__device__ void softmax_row(const unsigned short* X, unsigned short* Y, unsigned short* copy, int row) {
  const long long base = (long long)row * ROW_N;
  float v[PER_THREAD];
  float m = __int_as_float(0xff800000);  // -inf
  for (int i = 0; i < PER_THREAD; ++i) {
    v[i] = bf2f(X[base + threadIdx.x + i * THREADS]);
    m = fmaxf(m, v[i]);
  }
  m = block_reduce(m, true);
  float s = 0.f;
  for (int i = 0; i < PER_THREAD; ++i) {
    v[i] = __expf(v[i] - m);
    s += v[i];
  }
  s = block_reduce(s, false);
  const float inv = 1.0f / s;
  for (int i = 0; i < PER_THREAD; ++i) {
    const unsigned short y = f2bf(v[i] * inv);
    Y[base + threadIdx.x + i * THREADS] = y;
    if (copy) copy[base + threadIdx.x + i * THREADS] = y;
  }
}

// Called by every CTA at its end: true in the one CTA that finishes the launch last.
__device__ bool last_block_done(unsigned int* finished) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(finished, 1u) + 1u == gridDim.x;
    if (last) *finished = 0u;
  }
  __syncthreads();
  return last;
}
