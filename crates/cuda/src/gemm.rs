//! GEMMs through cuBLASLt, for the executors that multiply matrices (the
//! cuBLAS executor, the cuDNN executor's attention).
//!
//! [`gemm_of`] says which GEMM an op is and how cuBLAS reads each operand
//! where it lies: pure shape-and-stride arithmetic, the same for a claim (on
//! the layouts the trace's views will give) and for a run (on the tensors'
//! real layouts), so that what is claimed is what runs. [`Math`] says how
//! its products are computed; [`crate::lt`] queues it.

use switchyard_core::DType;
use switchyard_core::executor::Numerics;
use switchyard_core::meta::broadcast_shapes;

/// How cuBLAS reads one operand's matrices (of `rows × cols`, row-major in
/// switchyard's terms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Operand {
    /// Stored by columns (a transposed view): cuBLAS's transpose flag.
    pub trans: bool,
    /// The leading dimension: the stride between rows (by rows) or
    /// columns (by columns).
    pub ld: usize,
    /// Elements between consecutive matrices of the batch (0: one matrix
    /// broadcast to all).
    pub batch_stride: usize,
    /// Stride of a row and of a column, for the extent.
    strides: (usize, usize),
}

impl Operand {
    /// The strides of a row and of a column, in elements.
    pub fn strides(&self) -> (usize, usize) {
        self.strides
    }

    /// One past the last element read, from the operand's offset.
    pub fn extent(&self, rows: usize, cols: usize, batch: usize) -> usize {
        if rows == 0 || cols == 0 || batch == 0 {
            return 0;
        }
        1 + (rows - 1) * self.strides.0 + (cols - 1) * self.strides.1 + (batch - 1) * self.batch_stride
    }
}

/// A (batched) GEMM `C = A·B (+ bias)`: `batch` products of `m × k` by `k × n`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Gemm {
    /// Products in the batch.
    pub batch: usize,
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// The contracted dim.
    pub k: usize,
    /// How A is read.
    pub a: Operand,
    /// How B is read.
    pub b: Operand,
    /// Whether a bias of `n` is added to every row.
    pub bias: bool,
    /// The result's shape (dense).
    pub out_shape: Vec<usize>,
}

impl Gemm {
    /// Whether there is nothing to compute.
    pub fn is_empty(&self) -> bool {
        self.batch == 0 || self.m == 0 || self.n == 0
    }

    /// Bytes read and written, each operand once.
    pub fn bytes(&self, dtype: DType) -> usize {
        let a_batches = if self.a.batch_stride == 0 { 1 } else { self.batch };
        let b_batches = if self.b.batch_stride == 0 { 1 } else { self.batch };
        let elems = a_batches * self.m * self.k
            + b_batches * self.k * self.n
            + self.batch * self.m * self.n
            + if self.bias { self.n } else { 0 };
        elems * dtype.size()
    }

    /// Arithmetic: 2·m·n·k per product, plus the bias.
    pub fn flops(&self) -> f64 {
        let mn = (self.batch * self.m * self.n) as f64;
        2.0 * mn * self.k as f64 + if self.bias { mn } else { 0.0 }
    }
}

/// How a `rows × cols` matrix with strides `(rs, cs)` is read, if by rows or
/// by columns.
fn matrix(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<(bool, usize)> {
    if rs < 0 || cs < 0 {
        return None;
    }
    let (rs, cs) = (rs as usize, cs as usize);
    // By rows: unit column stride, rows at least a row apart.
    if (cols <= 1 || cs == 1) && (rows <= 1 || rs >= cols) {
        return Some((
            false,
            if rows <= 1 {
                cols.max(1)
            } else {
                rs.max(cols).max(1)
            },
        ));
    }
    // By columns: a transposed view.
    if (rows <= 1 || rs == 1) && (cols <= 1 || cs >= rows) {
        return Some((
            true,
            if cols <= 1 {
                rows.max(1)
            } else {
                cs.max(rows).max(1)
            },
        ));
    }
    None
}

/// The one stride that steps through the batch dims `shape` (laid out by
/// `strides`) in row-major order, if there is one.
fn batch_stride(shape: &[usize], strides: &[isize]) -> Option<usize> {
    let dims: Vec<(usize, isize)> = shape
        .iter()
        .copied()
        .zip(strides.iter().copied())
        .filter(|&(n, _)| n > 1)
        .collect();
    let Some(&(_, inner)) = dims.last() else {
        return Some(0);
    };
    let mut expect = inner;
    for &(n, s) in dims.iter().rev() {
        if s != expect || s < 0 {
            return None;
        }
        expect = s * n as isize;
    }
    Some(inner as usize)
}

/// How one operand of a batched product is read: its matrix, and its batch
/// dims against the result's `batch` dims.
fn operand(name: &str, shape: &[usize], strides: &[isize], batch: &[usize]) -> Result<Operand, String> {
    let r = shape.len();
    let (rows, cols) = (shape[r - 2], shape[r - 1]);
    let (rs, cs) = (strides[r - 2], strides[r - 1]);
    let (trans, ld) = matrix(rows, cols, rs, cs).ok_or_else(|| {
        format!(
            "{name}'s matrices are strided in both dims (strides {strides:?}): cuBLAS reads them by rows or by \
             columns only, so this would need a copy first"
        )
    })?;
    let own = &shape[..r - 2];
    let numel: usize = own.iter().product();
    let batch_stride = if numel == 1 {
        0
    } else {
        // Left-padded with 1s, the operand's batch dims must be the result's.
        let pad = batch.len() - own.len();
        if own.iter().zip(&batch[pad..]).any(|(a, b)| a != b) || batch[..pad].iter().any(|&n| n > 1) {
            return Err(format!(
                "{name}'s batch dims {own:?} are broadcast in part against {batch:?}: one batch stride cannot \
                 express that"
            ));
        }
        batch_stride(own, &strides[..r - 2]).ok_or_else(|| {
            format!("{name}'s batch dims are not evenly strided (strides {strides:?}): one batch stride cannot step through them")
        })?
    };
    Ok(Operand {
        trans,
        ld,
        batch_stride,
        strides: (rs.max(0) as usize, cs.max(0) as usize),
    })
}

/// The GEMM of `matmul(a, b)`, or with `linear`, of `linear(a, b, bias)`
/// (`b` is then the `[n, k]` weight, read transposed, and `a`'s leading
/// dims are rows). Each operand is `(shape, strides)`.
pub fn gemm_of(
    a: (&[usize], &[isize]),
    b: (&[usize], &[isize]),
    bias: Option<(&[usize], &[isize])>,
    linear: bool,
) -> Result<Gemm, String> {
    if a.0.len() < 2 || b.0.len() != 2 && linear || b.0.len() < 2 {
        return Err(format!("needs matrices, got shapes {:?} and {:?}", a.0, b.0));
    }
    if linear {
        // x [..., k] by rows, its leading dims flattened into m; w [n, k] read as wᵀ.
        let r = a.0.len();
        let k = a.0[r - 1];
        let lead = &a.0[..r - 1];
        let rows: usize = lead.iter().product();
        let row_stride = batch_stride(lead, &a.1[..r - 1])
            .ok_or_else(|| format!("x's leading dims are not evenly strided (strides {:?})", a.1))?;
        let flat_shape = [rows, k];
        let flat_strides = [
            if rows <= 1 {
                k as isize
            } else {
                row_stride as isize
            },
            a.1[r - 1],
        ];
        let wt_shape = [b.0[1], b.0[0]];
        let wt_strides = [b.1[1], b.1[0]];
        let mut g = gemm_of(
            (&flat_shape, &flat_strides),
            (&wt_shape, &wt_strides),
            None,
            false,
        )?;
        if let Some((shape, strides)) = bias {
            if shape != [g.n] || (g.n > 1 && strides[0] != 1) {
                return Err(format!(
                    "the bias must be a dense vector of {} (out features) for cuBLASLt's epilogue, got {shape:?} \
                     with strides {strides:?}",
                    g.n
                ));
            }
            g.bias = true;
        }
        let mut out_shape = lead.to_vec();
        out_shape.push(g.n);
        g.out_shape = out_shape;
        return Ok(g);
    }
    let (ra, rb) = (a.0.len(), b.0.len());
    let (m, k) = (a.0[ra - 2], a.0[ra - 1]);
    let (k2, n) = (b.0[rb - 2], b.0[rb - 1]);
    if k != k2 {
        return Err(format!("contraction dims differ: {k} and {k2}"));
    }
    let batch = broadcast_shapes(&a.0[..ra - 2], &b.0[..rb - 2]).ok_or_else(|| {
        format!(
            "batch dims {:?} and {:?} do not broadcast",
            &a.0[..ra - 2],
            &b.0[..rb - 2]
        )
    })?;
    let oa = operand("the first operand", a.0, a.1, &batch)?;
    let ob = operand("the second operand", b.0, b.1, &batch)?;
    let count: usize = batch.iter().product();
    if count > i32::MAX as usize || [m, n, k].iter().any(|&d| d > i32::MAX as usize) {
        return Err("a dim or the batch exceeds what cuBLAS indexes (2³¹)".into());
    }
    let mut out_shape = batch;
    out_shape.extend([m, n]);
    Ok(Gemm {
        batch: count,
        m,
        n,
        k,
        a: oa,
        b: ob,
        bias: false,
        out_shape,
    })
}

/// How a GEMM computes its products: for f32, IEEE f32 or TF32 tensor
/// cores; f16 and bf16 always multiply on tensor cores and accumulate in
/// f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Math {
    /// f32 as f32 (`CUBLAS_COMPUTE_32F`): what the fallback computes, to
    /// rounding.
    Ieee,
    /// f32 products on TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`):
    /// operands rounded to a 10-bit mantissa, f32 accumulation; about 7×
    /// the f32 peak on an H100, with relative errors near 1e-3.
    Tf32,
}

/// The executor option that sets the math mode.
pub const TF32_OPTION: &str = "tf32";

impl Math {
    /// The math mode under `numerics` of an executor whose `tf32` option is
    /// `option` (`None` where unset): the option where set, else the
    /// config-wide `allow_tf32`.
    pub fn with(option: Option<bool>, numerics: Numerics) -> Math {
        match option {
            Some(true) => Math::Tf32,
            Some(false) => Math::Ieee,
            None if numerics.allow_tf32 => Math::Tf32,
            None => Math::Ieee,
        }
    }

    /// The `tf32` option of an executor whose only option it is, checked:
    /// `None` where unset.
    pub fn option_of(options: &toml::Table) -> Result<Option<bool>, String> {
        for (k, v) in options {
            Math::check_option(k, v)
                .unwrap_or_else(|| Err(format!("unknown option `{k}` (known: `{TF32_OPTION}`)")))?;
        }
        Ok(options.get(TF32_OPTION).and_then(toml::Value::as_bool))
    }

    /// Checks option `key` if it is the math mode's (`tf32`); `None` for any
    /// other key.
    pub fn check_option(key: &str, value: &toml::Value) -> Option<Result<(), String>> {
        (key == TF32_OPTION).then(|| match value {
            toml::Value::Boolean(_) => Ok(()),
            v => Err(format!("`{TF32_OPTION}` must be true or false, got {v}")),
        })
    }

    /// Whether products in `dtype` run on TF32 tensor cores.
    pub fn tf32_for(self, dtype: DType) -> bool {
        self == Math::Tf32 && dtype == DType::F32
    }

    /// How products in `dtype` are computed, for plans and reports; `by_option`
    /// is whether the executor's `tf32` option set the mode.
    pub fn describe(self, dtype: DType, by_option: bool) -> String {
        let why = if by_option {
            "option tf32"
        } else {
            "config allow_tf32"
        };
        match dtype {
            DType::F32 if self == Math::Tf32 => {
                format!("math: f32 on TF32 tensor cores, f32 accumulation ({why} = true)")
            }
            DType::F32 => format!("math: IEEE f32 ({why} = false)"),
            d => format!("math: {d} products, f32 accumulation"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(shape: &[usize]) -> Vec<isize> {
        switchyard_core::meta::contiguous_strides(shape)
    }

    #[test]
    fn a_transposed_operand_is_read_with_the_flag_not_copied() {
        // b = transpose(w) of a dense w [n=32, k=64]: strides (1, 64).
        let g = gemm_of((&[16, 64], &dense(&[16, 64])), (&[64, 32], &[1, 64]), None, false).unwrap();
        assert_eq!((g.m, g.n, g.k, g.batch), (16, 32, 64, 1));
        assert!(!g.a.trans && g.a.ld == 64);
        assert!(g.b.trans && g.b.ld == 64);
        assert_eq!(g.out_shape, vec![16, 32]);
        // Both transposed.
        let g = gemm_of((&[16, 64], &[1, 16]), (&[64, 32], &[1, 64]), None, false).unwrap();
        assert!(g.a.trans && g.a.ld == 16 && g.b.trans);
    }

    #[test]
    fn batches_are_dense_or_broadcast_whole() {
        // [8, 4, 16, 16] @ [16, 16]: b broadcast with stride 0.
        let g = gemm_of(
            (&[8, 4, 16, 32], &dense(&[8, 4, 16, 32])),
            (&[32, 16], &dense(&[32, 16])),
            None,
            false,
        )
        .unwrap();
        assert_eq!((g.batch, g.a.batch_stride, g.b.batch_stride), (32, 512, 0));
        assert_eq!(g.out_shape, vec![8, 4, 16, 16]);
        // Heads transposed in front of the sequence ([s, h, d] viewed as [h, s, d]): one stride still steps.
        let g = gemm_of(
            (&[4, 16, 16], &[16, 64, 1]),
            (&[4, 16, 16], &[256, 1, 16]),
            None,
            false,
        )
        .unwrap();
        assert_eq!((g.a.batch_stride, g.a.ld, g.b.batch_stride), (16, 64, 256));
        assert!(g.b.trans);
        // Broadcast in part: [2, 1] against [2, 8].
        let e = gemm_of(
            (&[2, 1, 4, 4], &dense(&[2, 1, 4, 4])),
            (&[2, 8, 4, 4], &dense(&[2, 8, 4, 4])),
            None,
            false,
        )
        .unwrap_err();
        assert!(e.contains("broadcast in part"), "{e}");
        // Batch dims permuted so that no single stride steps through them.
        let e = gemm_of(
            (&[2, 3, 4, 4], &[16, 32, 4, 1]),
            (&[2, 3, 4, 4], &dense(&[2, 3, 4, 4])),
            None,
            false,
        )
        .unwrap_err();
        assert!(e.contains("not evenly strided"), "{e}");
    }

    #[test]
    fn a_matrix_strided_in_both_dims_is_rejected_with_the_reason() {
        // Every other column of a [16, 128] matrix.
        let e = gemm_of((&[16, 64], &[128, 2]), (&[64, 8], &dense(&[64, 8])), None, false).unwrap_err();
        assert!(e.contains("strided in both dims") && e.contains("copy"), "{e}");
    }

    #[test]
    fn linear_flattens_rows_reads_the_weight_transposed_and_fuses_the_bias() {
        let x = [2, 16, 64];
        let g = gemm_of(
            (&x, &dense(&x)),
            (&[128, 64], &dense(&[128, 64])),
            Some((&[128], &[1])),
            true,
        )
        .unwrap();
        assert_eq!((g.batch, g.m, g.n, g.k), (1, 32, 128, 64));
        assert!(g.b.trans && g.b.ld == 64 && g.bias);
        assert_eq!(g.out_shape, vec![2, 16, 128]);
        assert_eq!(g.flops(), 2.0 * 32.0 * 128.0 * 64.0 + 32.0 * 128.0);
        let e = gemm_of(
            (&x, &dense(&x)),
            (&[128, 64], &dense(&[128, 64])),
            Some((&[2, 128], &[128, 1])),
            true,
        )
        .unwrap_err();
        assert!(e.contains("bias must be a dense vector of 128"), "{e}");
    }

    #[test]
    fn the_extent_covers_exactly_what_is_read() {
        let g = gemm_of((&[3, 4, 5], &dense(&[3, 4, 5])), (&[5, 2], &[1, 5]), None, false).unwrap();
        assert_eq!(g.a.extent(g.m, g.k, g.batch), 60);
        assert_eq!(g.b.extent(g.k, g.n, g.batch), 10);
    }
}
