//! Fused attention: one kernel that never materialises the scores.
//!
//! Each block takes [`ROWS`] queries of one batch entry, one thread per
//! query, and walks the keys in tiles of [`TILE`] staged in shared memory:
//! a thread scores its query against the tile, keeps the running maximum
//! and sum of the online softmax, rescales its accumulated values when the
//! maximum grows, and adds the tile's values weighted by their
//! probabilities; at the end it divides by the sum. Memory is the inputs
//! and the output: linear in the sequence, where the unfused path holds
//! `batch·l·s` scores twice. Arithmetic is f32 on CUDA cores, whatever the
//! dtype (no tensor cores), so for short sequences the unfused path, whose
//! GEMMs run on tensor cores, is usually cheaper; the claim compares both.
//!
//! The source is generated per dtype, head dim, value dim and mask, and
//! compiled with NVRTC; operands are read where they lie, through one
//! stride per batch, row and column, and the output is dense.

use std::fmt::Write;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use switchyard_core::DType;

use crate::Attention;

/// Queries per block, one per thread.
pub const ROWS: usize = 64;

/// Keys (and values) staged in shared memory at a time.
pub const TILE: usize = 32;

/// The largest head and value dims the kernel takes: its tiles of keys and
/// values must fit in 48 KiB of shared memory, and a query and its
/// accumulator live in registers.
pub const MAX_DIM: usize = 128;

/// The kernel's entry point.
pub const ENTRY: &str = "sy_flash";

/// Why the fused kernel cannot run `a`, if it cannot.
pub fn unsupported(a: &Attention) -> Option<String> {
    let (e, ev) = (a.scores.k, a.values.n);
    if e > MAX_DIM || ev > MAX_DIM {
        return Some(format!(
            "the fused kernel takes head and value dims up to {MAX_DIM}, not {e} and {ev}"
        ));
    }
    None
}

/// The C type of an element, and how it is read as f32 and written back.
fn element(dtype: DType) -> (&'static str, &'static str, &'static str) {
    match dtype {
        DType::F16 => ("unsigned short", "sy_from_f16", "sy_to_f16"),
        DType::BF16 => ("unsigned short", "sy_from_bf16", "sy_to_bf16"),
        _ => ("float", "", ""),
    }
}

/// The CUDA C of the fused attention for `a`.
pub fn source(a: &Attention) -> String {
    let (t, from, to) = element(a.dtype);
    let (e, ev) = (a.scores.k, a.values.n);
    let causal = u8::from(a.causal);
    let mut s = String::from(switchyard_cuda::source::HALF_CONVERSIONS);
    let _ = write!(
        s,
        r#"
extern "C" __global__ void __launch_bounds__({ROWS}) {ENTRY}(
    const {t} *__restrict__ q, const {t} *__restrict__ k, const {t} *__restrict__ v, {t} *__restrict__ out,
    const long long L, const long long S, const float scale,
    const long long qb, const long long qr, const long long qc,
    const long long kb, const long long kr, const long long kc,
    const long long vb, const long long vr, const long long vc) {{
  __shared__ float ks[{TILE}][{e_tile}];
  __shared__ float vs[{TILE}][{ev_tile}];
  const float neg_inf = __int_as_float(0xff800000);
  const long long b = blockIdx.y;
  const long long row = (long long)blockIdx.x * {ROWS} + threadIdx.x;
  const bool live = row < L;
  float qv[{e_tile}];
  float acc[{ev_tile}];
  float m = neg_inf, l = 0.0f;
  for (int e = 0; e < {e}; e++) qv[e] = live ? {from}(q[b * qb + row * qr + e * qc]) * scale : 0.0f;
  for (int e = 0; e < {ev}; e++) acc[e] = 0.0f;
  // With the mask, keys past the block's last query are never needed.
  const long long last = (long long)blockIdx.x * {ROWS} + {ROWS};
  const long long end = {causal} ? (last < S ? last : S) : S;
  for (long long j0 = 0; j0 < end; j0 += {TILE}) {{
    for (int x = threadIdx.x; x < {TILE} * {e}; x += {ROWS}) {{
      const long long j = j0 + x / {e};
      ks[x / {e}][x % {e}] = j < S ? {from}(k[b * kb + j * kr + (x % {e}) * kc]) : 0.0f;
    }}
    for (int x = threadIdx.x; x < {TILE} * {ev}; x += {ROWS}) {{
      const long long j = j0 + x / {ev};
      vs[x / {ev}][x % {ev}] = j < S ? {from}(v[b * vb + j * vr + (x % {ev}) * vc]) : 0.0f;
    }}
    __syncthreads();
    if (live) {{
      float sc[{TILE}];
      float top = neg_inf;
      for (int jj = 0; jj < {TILE}; jj++) {{
        const long long j = j0 + jj;
        float d = 0.0f;
        for (int e = 0; e < {e}; e++) d += qv[e] * ks[jj][e];
        sc[jj] = (j < S && (!{causal} || j <= row)) ? d : neg_inf;
        top = fmaxf(top, sc[jj]);
      }}
      if (top != neg_inf) {{
        const float mnew = fmaxf(m, top);
        const float keep = expf(m - mnew);
        l *= keep;
        for (int e = 0; e < {ev}; e++) acc[e] *= keep;
        for (int jj = 0; jj < {TILE}; jj++) {{
          const float p = sc[jj] == neg_inf ? 0.0f : expf(sc[jj] - mnew);
          l += p;
          for (int e = 0; e < {ev}; e++) acc[e] += p * vs[jj][e];
        }}
        m = mnew;
      }}
    }}
    __syncthreads();
  }}
  if (live) {{
    for (int e = 0; e < {ev}; e++) {{
      const float y = l > 0.0f ? acc[e] / l : 0.0f;
      out[(b * L + row) * {ev} + e] = {to}(y);
    }}
  }}
}}
"#,
        // Arrays of at least one element, for empty dims.
        e_tile = e.max(1),
        ev_tile = ev.max(1),
    );
    s
}

/// The operands' strides as the kernel takes them, in elements: per
/// operand (batch, row, column), for q, k and v.
pub fn strides(a: &Attention) -> [i64; 9] {
    // Q is the scores' first operand; Kᵀ its second, so K's rows are Kᵀ's
    // columns; V is the values' second operand.
    let (q, kt, v) = (&a.scores.a, &a.scores.b, &a.values.b);
    let (qr, qc) = q.strides();
    let (ktr, ktc) = kt.strides();
    let (vr, vc) = v.strides();
    [
        q.batch_stride,
        qr,
        qc,
        kt.batch_stride,
        ktc,
        ktr,
        v.batch_stride,
        vr,
        vc,
    ]
    .map(|x| x as i64)
}

/// Estimated time of the fused kernel: f32 arithmetic on CUDA cores, at a
/// quarter of the device's f32 peak (a kernel without tensor cores, its
/// query and accumulator partly spilled), reading q once and k and v once
/// per block of queries.
pub fn cost_ns(a: &Attention, d: &switchyard_core::cost::DeviceModel) -> f64 {
    let (batch, l, s) = (a.scores.batch as f64, a.scores.m as f64, a.scores.n as f64);
    let (e, ev) = (a.scores.k as f64, a.values.n as f64);
    let size = a.dtype.size() as f64;
    let blocks = (l / ROWS as f64).ceil();
    let bytes = batch * size * (l * e + l * ev + blocks * s * (e + ev));
    let flops = batch * l * s * (2.0 * e + 2.0 * ev + 5.0);
    d.kernel_ns(bytes, 4.0 * flops, DType::F32)
}

/// The fused attention compiled for one device.
pub struct FlashKernel {
    function: CudaFunction,
    stream: Arc<CudaStream>,
}

impl FlashKernel {
    /// Compiles the kernel for `a` on `cuda:device` with NVRTC.
    pub fn new(a: &Attention, device: u32) -> Result<FlashKernel, String> {
        let stream = switchyard_cuda::stream(device).map_err(|e| e.to_string())?;
        let module = switchyard_cuda::source::compile(&stream, &source(a), "the attention kernel")?;
        let function = module
            .load_function(ENTRY)
            .map_err(|e| format!("finding {ENTRY}: {e}"))?;
        Ok(FlashKernel { function, stream })
    }

    /// Queues the attention `a` of `q`, `k` and `v` (at their addresses,
    /// with `len` elements each from there) into the dense `out`, after
    /// checking that everything read lies in its buffer.
    pub fn launch(
        &self,
        a: &Attention,
        q: (u64, usize),
        k: (u64, usize),
        v: (u64, usize),
        out: (u64, usize),
    ) -> Result<(), String> {
        let (batch, l, s) = (a.scores.batch, a.scores.m, a.scores.n);
        let (e, ev) = (a.scores.k, a.values.n);
        for (name, op, rows, cols, have) in [
            ("q", &a.scores.a, l, e, q.1),
            ("k", &a.scores.b, e, s, k.1),
            ("v", &a.values.b, s, ev, v.1),
        ] {
            let need = op.extent(rows, cols, batch);
            if need > have {
                return Err(format!("{name} would be read up to element {need} of {have}"));
            }
        }
        if out.1 < batch * l * ev {
            return Err(format!("the output holds fewer than {} elements", batch * l * ev));
        }
        if batch == 0 || l == 0 || ev == 0 {
            return Ok(());
        }
        let st = strides(a);
        let (ll, ss, scale) = (l as i64, s as i64, a.scale as f32);
        let cfg = LaunchConfig {
            grid_dim: (l.div_ceil(ROWS) as u32, batch as u32, 1),
            block_dim: (ROWS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        if l.div_ceil(ROWS) > u32::MAX as usize || batch > 65_535 {
            return Err(format!("{batch} batches of {l} queries exceed the grid"));
        }
        let mut launch = self.stream.launch_builder(&self.function);
        launch.arg(&q.0).arg(&k.0).arg(&v.0).arg(&out.0);
        launch.arg(&ll).arg(&ss).arg(&scale);
        for x in &st {
            launch.arg(x);
        }
        // SAFETY: the arguments match the kernel's signature; every element
        // it reads (through the strides, within the dims) was checked to lie
        // in its buffer, and the output holds batch·l·ev elements.
        unsafe { launch.launch(cfg) }.map_err(|e| format!("launching the attention kernel: {e}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention_of;
    use switchyard_core::Tensor;
    use switchyard_core::io::random_tensor;

    fn dense(shape: &[usize]) -> Vec<isize> {
        switchyard_core::meta::contiguous_strides(shape)
    }

    /// A C array of a host tensor's whole buffer as floats (the host harness
    /// runs the f32 kernel).
    fn floats(t: &Tensor) -> String {
        let v: Vec<String> = t
            .to_f64_vec()
            .unwrap()
            .iter()
            .map(|x| format!("{x:e}f"))
            .collect();
        format!("{{{}}}", v.join(", "))
    }

    #[test]
    fn the_fused_kernel_computes_attention_as_sdpa_is_defined() {
        let cxx = match switchyard_cuda::host::cxx() {
            Ok(cxx) => cxx,
            Err(why) => {
                println!("skipped: {why}; the attention kernel is not run on the host");
                return;
            }
        };
        // Batches of heads; keys over two tiles and a partial one; rows over
        // two blocks; a key longer than the queries; transposed k.
        for (causal, l, s, e, ev, k_transposed) in [
            (false, 70, 75, 8, 5, false),
            (true, 70, 75, 8, 5, true),
            (true, 3, 1, 4, 4, false),
        ] {
            let (qs, ks, vs) = ([2, 3, l, e], [2, 3, s, e], [2, 3, s, ev]);
            let q = random_tensor(&switchyard_core::TensorMeta::new(DType::F32, qs), 1, 0);
            let v = random_tensor(&switchyard_core::TensorMeta::new(DType::F32, vs), 1, 2);
            // k stored as [2, 3, e, s] and viewed as [2, 3, s, e], or dense.
            let (kbuf, k) = match k_transposed {
                true => {
                    let stored =
                        random_tensor(&switchyard_core::TensorMeta::new(DType::F32, [2, 3, e, s]), 1, 1);
                    let (se, s_) = ((s * e) as isize, s as isize);
                    let k = stored.view(ks.to_vec(), vec![3 * se, se, 1, s_], 0).unwrap();
                    (stored, k)
                }
                false => {
                    let k = random_tensor(&switchyard_core::TensorMeta::new(DType::F32, ks), 1, 1);
                    (k.clone(), k)
                }
            };
            let a = attention_of(
                (&qs, &dense(&qs)),
                (k.shape(), k.strides()),
                (&vs, &dense(&vs)),
                DType::F32,
                None,
                causal,
            )
            .unwrap();
            // The reference: sdpa as its decomposition defines it, in f64.
            let want = reference(&q, &k, &v, causal);
            let st = strides(&a);
            let main = format!(
                "\nint main() {{\n  static float q[] = {};\n  static float k[] = {};\n  static float v[] = {};\n  \
                 alignas(16) static float out[{n}];\n  memset(out, 0xff, sizeof out);\n  \
                 blockDim.x = {ROWS}; gridDim.x = {gx}; gridDim.y = 6;\n  std::barrier<> bar({ROWS}); sy_barrier = &bar;\n  \
                 for (unsigned by = 0; by < 6; by++) for (unsigned bx = 0; bx < {gx}; bx++) {{\n    \
                 std::vector<std::thread> ts;\n    for (unsigned i = 0; i < {ROWS}; i++) ts.emplace_back([&, bx, by, i] {{ \
                 blockIdx.x = bx; blockIdx.y = by; threadIdx.x = i; \
                 {ENTRY}(q, k, v, out, {l}, {s}, {scale:e}f, {}); }});\n    for (auto &t : ts) t.join();\n  }}\n  \
                 for (unsigned i = 0; i < {n}; i++) printf(\"%.9g \", out[i]);\n  return 0;\n}}\n",
                floats(&q),
                floats(&kbuf),
                floats(&v),
                st.map(|x| format!("{x}")).join(", "),
                n = (6 * l * ev).max(1),
                gx = l.div_ceil(ROWS),
                scale = a.scale,
            );
            let dir =
                std::env::temp_dir().join(format!("switchyard-flash-{}-{causal}-{s}", std::process::id()));
            let src = switchyard_cuda::host::for_host(&source(&a)).unwrap() + &main;
            let exe = switchyard_cuda::host::build(&cxx, &src, &dir).unwrap();
            let run = std::process::Command::new(&exe).output().unwrap();
            let _ = std::fs::remove_dir_all(&dir);
            assert!(run.status.success(), "the kernel failed: {}", run.status);
            let got: Vec<f64> = String::from_utf8_lossy(&run.stdout)
                .split_whitespace()
                .map(|w| w.parse().unwrap())
                .collect();
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "causal {causal}, s {s}, element {i}: kernel {g}, reference {w}"
                );
            }
        }
    }

    /// Attention in f64 as the sdpa decomposition defines it: per batch and
    /// head, softmax over the keys of q·kᵀ/√e, with the keys past a query's
    /// row masked when `causal` (top-left), times v.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Vec<f64> {
        let dims = |t: &Tensor| (t.shape()[2], t.shape()[3]);
        let ((l, e), (s, ev)) = (dims(q), dims(v));
        let (q, k, v) = (
            q.to_f64_vec().unwrap(),
            k.contiguous().unwrap().to_f64_vec().unwrap(),
            v.to_f64_vec().unwrap(),
        );
        let scale = 1.0 / (e as f64).sqrt();
        let mut out = Vec::with_capacity(6 * l * ev);
        for bh in 0..6 {
            let (q, k, v) = (&q[bh * l * e..], &k[bh * s * e..], &v[bh * s * ev..]);
            for i in 0..l {
                let scores: Vec<f64> = (0..s)
                    .map(|j| match causal && j > i {
                        true => f64::NEG_INFINITY,
                        false => (0..e).map(|d| q[i * e + d] * k[j * e + d]).sum::<f64>() * scale,
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                out.extend((0..ev).map(|c| (0..s).map(|j| weights[j] * v[j * ev + c]).sum::<f64>() / total));
            }
        }
        out
    }
}
