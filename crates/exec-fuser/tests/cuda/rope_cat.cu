
extern "C" __global__ void __launch_bounds__(256) sy_fused(const double *__restrict__ in0, const double *__restrict__ in1, double *__restrict__ out0, const SyLoad l0, const SyLoad l1) {
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < 32LL; t += (long long)gridDim.x * blockDim.x) {
    long long q = t;
    const long long i1 = q % 16; q /= 16;
    const long long i0 = q;
    const double r0 = (i1 >= 0 && i1 < 8) ? (double)in0[l0.off + i0 * l0.s[0] + i1 * l0.s[1]] : (double)0;
    const double r1 = -r0;
    const double r2 = (i1 >= 8 && i1 < 16) ? (double)in1[l1.off + i0 * l1.s[0] + i1 * l1.s[1]] : (double)0;
    const double r3 = i1 < 8 ? r1 : (r2);
    const double r4 = 0.25;
    const double r5 = r3 * r4;
    out0[t] = (double)r5;
  }
}
