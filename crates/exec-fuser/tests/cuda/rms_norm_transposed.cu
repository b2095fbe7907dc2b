
extern "C" __global__ void __launch_bounds__(256) sy_fused(const float *__restrict__ in0, float *__restrict__ out0, float *__restrict__ out1, const SyLoad l0) {
  __shared__ float sy_part[256];
  for (long long row = blockIdx.x; row < 16LL; row += gridDim.x) {
    long long q = row;
    const long long i0 = q;
    const float r3 = 1e-6f;
    float acc2 = (float)0;
    for (long long j = threadIdx.x; j < 64LL; j += blockDim.x) {
      long long u = j;
      const long long i1 = u;
      const float r0 = (float)in0[l0.off + i0 * l0.s[0] + i1 * l0.s[1]];
      const float r1 = r0 * r0;
      acc2 = acc2 + r1;
    }
    sy_part[threadIdx.x] = acc2;
    __syncthreads();
    for (unsigned int h = blockDim.x / 2; h > 0; h >>= 1) {
      if (threadIdx.x < h) sy_part[threadIdx.x] = sy_part[threadIdx.x] + sy_part[threadIdx.x + h];
      __syncthreads();
    }
    const float r2 = sy_part[0] * ((float)1 / (float)64);
    __syncthreads();
    const float r4 = r2 + r3;
    const float r5 = ((float)1 / sqrtf(r4));
    for (long long j = threadIdx.x; j < 64LL; j += blockDim.x) {
      long long u = j;
      const long long i1 = u;
      const float r0 = (float)in0[l0.off + i0 * l0.s[0] + i1 * l0.s[1]];
      const float r6 = r5;
      const float r7 = r0 * r6;
      out1[i0 * 64 + i1 * 1] = (float)r7;
    }
    if (threadIdx.x == 0) out0[row] = (float)r5;
  }
}
