//! CUDA C for a [`Program`], from the same kernel IR the CPU backend runs.
//!
//! The source depends on the program alone (shapes, dtypes, instructions),
//! never on where its inputs lie: each load takes its offset and one stride
//! per iteration dim as a kernel argument ([`LoadArg`]), resolved at launch
//! from the input's run-time layout. So one compiled kernel serves every
//! layout, and the source is a function of the kernel-cache key.
//!
//! Two schedules:
//! - **pointwise** (nothing reduced): a grid-stride loop, one thread per
//!   element of the iteration space; and, for programs without masks or
//!   cats, a second entry point ([`ENTRY_DENSE`]) that the launch picks when
//!   every load reads its input densely in iteration order and every
//!   pointer is aligned: each thread loads [`LANES`] elements of each input
//!   with one vector load (16 bytes for f32), computes them, and stores
//!   them with one vector store, so the kernel streams at copy speed;
//! - **row** (reductions): one block per row of the kept dims, its threads
//!   striding over the reduced dims, in the [`Passes`] the CPU's streamed
//!   rows use: each pass re-evaluates what its reductions read, the partials
//!   combine through shared memory, the row instructions run, and a last
//!   pass stores the full outputs.

use std::fmt::Write;

use switchyard_core::DType;
use switchyard_core::ir::{BinaryOp, ReduceOp, UnaryOp};
use switchyard_core::meta::contiguous_strides;

use crate::lower::MAX_RANK;
use crate::program::{Action, Axis, Instr, Program, Space};

/// The kernel's entry point.
pub const ENTRY: &str = "sy_fused";

/// The entry point of the dense, vectorised pointwise schedule, in the
/// source of a program [`has_dense_entry`].
pub const ENTRY_DENSE: &str = "sy_fused_dense";

/// Elements a thread of the dense schedule loads and stores at once.
pub const LANES: usize = 4;

/// Threads per block; the block reduction assumes a power of two.
pub const BLOCK: u32 = 256;

/// A load's resolved layout, passed by value: element `off + Σ s[d]·i[d]` of
/// its input is read at iteration index `i`. Mirrors `SyLoad` in the source.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadArg {
    /// Offset of iteration index 0, in elements.
    pub off: i64,
    /// Stride of each iteration dim, in elements.
    pub s: [i64; MAX_RANK],
}

/// Definitions every kernel starts with: the load argument, conversions of
/// the 16-bit float types ([`switchyard_cuda::source::HALF_CONVERSIONS`]),
/// NaN-propagating extremes (as the fallback computes them) and vector types.
fn prelude() -> String {
    format!("{LOAD_ARG}{}{HELPERS}", switchyard_cuda::source::HALF_CONVERSIONS)
}

/// The load argument's declaration.
const LOAD_ARG: &str = "struct SyLoad { long long off; long long s[8]; };\n\n";

/// NaN-propagating extremes, a remainder with the divisor's sign, and the
/// vector types of the dense schedule.
const HELPERS: &str = r#"template <typename T> __device__ __forceinline__ T sy_max(T a, T b) {
  return (a != a || b != b) ? a + b : (a > b ? a : b);
}
template <typename T> __device__ __forceinline__ T sy_min(T a, T b) {
  return (a != a || b != b) ? a + b : (a < b ? a : b);
}
struct alignas(16) SyV16 { unsigned int w[4]; };
struct alignas(8) SyV8 { unsigned int w[2]; };
struct alignas(4) SyV4 { unsigned int w[1]; };
template <typename T> __device__ __forceinline__ T sy_remainder(T a, T b) {
  T r = fmod(a, b);
  return (r != (T)0 && ((r < (T)0) != (b < (T)0))) ? r + b : r;
}
"#;

/// The C type an input or output of `dtype` is stored as.
pub(crate) fn stored(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 | DType::BF16 => "unsigned short",
        DType::Bool => "unsigned char",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::I8 => "signed char",
        DType::U8 => "unsigned char",
        DType::I16 => "short",
        DType::U16 => "unsigned short",
        DType::U32 => "unsigned int",
        DType::U64 => "unsigned long long",
    }
}

/// The compute type.
fn compute(p: &Program) -> &'static str {
    if p.compute == DType::F64 {
        "double"
    } else {
        "float"
    }
}

/// A C literal of `v` in the compute type (non-finite values by their bits,
/// as no header defines `INFINITY` under NVRTC).
fn literal(v: f64, c: &str) -> String {
    match (c, v.is_finite()) {
        ("float", true) => format!("{v:?}f"),
        ("float", false) => format!("__int_as_float(0x{:08x})", (v as f32).to_bits()),
        (_, true) => format!("{v:?}"),
        (_, false) => format!("__longlong_as_double(0x{:016x}LL)", v.to_bits()),
    }
}

/// `x`, stored as `dtype`, read into the compute type `c`.
fn widen(x: &str, dtype: DType, c: &str) -> String {
    match dtype {
        DType::F16 => format!("({c})sy_from_f16({x})"),
        DType::BF16 => format!("({c})sy_from_bf16({x})"),
        _ => format!("({c}){x}"),
    }
}

/// `x`, in the compute type, converted for storing as `dtype`.
fn narrow(x: &str, dtype: DType) -> String {
    match dtype {
        DType::F16 => format!("sy_to_f16((float){x})"),
        DType::BF16 => format!("sy_to_bf16((float){x})"),
        DType::Bool => format!("(unsigned char)({x} != 0)"),
        d => format!("({}){x}", stored(d)),
    }
}

fn unary(op: UnaryOp, a: &str, c: &str) -> String {
    let f = if c == "float" { "f" } else { "" };
    match op {
        UnaryOp::Neg => format!("-{a}"),
        UnaryOp::Abs => format!("fabs{f}({a})"),
        UnaryOp::Exp => format!("exp{f}({a})"),
        UnaryOp::Log => format!("log{f}({a})"),
        UnaryOp::Sqrt => format!("sqrt{f}({a})"),
        UnaryOp::Rsqrt => format!("(({c})1 / sqrt{f}({a}))"),
        UnaryOp::Reciprocal => format!("(({c})1 / {a})"),
        UnaryOp::Tanh => format!("tanh{f}({a})"),
        UnaryOp::Sigmoid => format!("(({c})1 / (({c})1 + exp{f}(-{a})))"),
        UnaryOp::Relu => format!("({a} < ({c})0 ? ({c})0 : {a})"),
        UnaryOp::Sin => format!("sin{f}({a})"),
        UnaryOp::Cos => format!("cos{f}({a})"),
        UnaryOp::Erf => format!("erf{f}({a})"),
        UnaryOp::LogicalNot => format!("({c})({a} == ({c})0)"),
        UnaryOp::Floor => format!("floor{f}({a})"),
        UnaryOp::Ceil => format!("ceil{f}({a})"),
        // rint rounds halves to even in the default rounding mode.
        UnaryOp::Round => format!("rint{f}({a})"),
        UnaryOp::Asin => format!("asin{f}({a})"),
        UnaryOp::Acos => format!("acos{f}({a})"),
        UnaryOp::Atan => format!("atan{f}({a})"),
        UnaryOp::Asinh => format!("asinh{f}({a})"),
        UnaryOp::Acosh => format!("acosh{f}({a})"),
        UnaryOp::Atanh => format!("atanh{f}({a})"),
        UnaryOp::BitNot => unreachable!("integer ops are refused by lower::unsupported"),
    }
}

fn binary(op: BinaryOp, a: &str, b: &str, c: &str) -> String {
    let f = if c == "float" { "f" } else { "" };
    let truth = |e: String| format!("({c})({e})");
    match op {
        BinaryOp::Add => format!("{a} + {b}"),
        BinaryOp::Sub => format!("{a} - {b}"),
        BinaryOp::Mul => format!("{a} * {b}"),
        BinaryOp::Div => format!("{a} / {b}"),
        BinaryOp::Pow => format!("pow{f}({a}, {b})"),
        BinaryOp::Maximum => format!("sy_max({a}, {b})"),
        BinaryOp::Minimum => format!("sy_min({a}, {b})"),
        BinaryOp::Eq => truth(format!("{a} == {b}")),
        BinaryOp::Ne => truth(format!("{a} != {b}")),
        BinaryOp::Lt => truth(format!("{a} < {b}")),
        BinaryOp::Le => truth(format!("{a} <= {b}")),
        BinaryOp::Gt => truth(format!("{a} > {b}")),
        BinaryOp::Ge => truth(format!("{a} >= {b}")),
        BinaryOp::LogicalAnd => truth(format!("{a} != ({c})0 && {b} != ({c})0")),
        BinaryOp::LogicalOr | BinaryOp::BitOr => truth(format!("{a} != ({c})0 || {b} != ({c})0")),
        // Only bools reach here (0 or 1): the bitwise ops are the logical ones.
        BinaryOp::BitAnd => truth(format!("{a} != ({c})0 && {b} != ({c})0")),
        BinaryOp::BitXor => truth(format!("({a} != ({c})0) != ({b} != ({c})0)")),
        BinaryOp::ShiftLeft | BinaryOp::ShiftRight => {
            unreachable!("integer ops are refused by lower::unsupported")
        }
        BinaryOp::Fmod => format!("fmod{f}({a}, {b})"),
        BinaryOp::Remainder => format!("sy_remainder({a}, {b})"),
    }
}

/// `a` rounded through `to`, kept in the compute type.
fn cast(to: DType, a: &str, c: &str) -> String {
    match to {
        DType::F16 => format!("({c})sy_from_f16(sy_to_f16((float){a}))"),
        DType::BF16 => format!("({c})sy_from_bf16(sy_to_bf16((float){a}))"),
        DType::F32 => format!("({c})(float){a}"),
        DType::Bool => format!("({c})({a} != ({c})0)"),
        _ => a.to_string(),
    }
}

/// A reduction's identity and how it combines two partials.
fn reduction(op: ReduceOp, c: &str) -> (String, fn(&str, &str) -> String) {
    fn add(a: &str, b: &str) -> String {
        format!("{a} + {b}")
    }
    fn mul(a: &str, b: &str) -> String {
        format!("{a} * {b}")
    }
    fn max(a: &str, b: &str) -> String {
        format!("sy_max({a}, {b})")
    }
    fn min(a: &str, b: &str) -> String {
        format!("sy_min({a}, {b})")
    }
    match op {
        ReduceOp::Sum | ReduceOp::Mean => (format!("({c})0"), add),
        ReduceOp::Prod => (format!("({c})1"), mul),
        ReduceOp::Amax => (literal(f64::NEG_INFINITY, c), max),
        ReduceOp::Amin => (literal(f64::INFINITY, c), min),
    }
}

/// Where the loads of the instructions being written read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reads {
    /// Through the load's offset and strides, at `i0, i1, ...`.
    Strided,
    /// Densely: element `off + t` (the dense schedule's tail).
    Dense,
    /// Lane `j` of the elements loaded into `a{k}` (the dense schedule).
    Lanes,
}

/// Writes the instructions of a program as C statements.
struct Emitter<'a> {
    p: &'a Program,
    c: &'static str,
    out: String,
    /// The load argument of each load instruction.
    load_of: Vec<Option<usize>>,
    reads: Reads,
}

impl Emitter<'_> {
    fn line(&mut self, indent: usize, text: &str) {
        let _ = writeln!(self.out, "{:indent$}{text}", "", indent = indent * 2);
    }

    /// Emits instruction `i` (not a reduction) as a `const` definition.
    fn instr(&mut self, indent: usize, i: usize) {
        let c = self.c;
        let ins = &self.p.instrs[i];
        let dst = ins.dst();
        let e = match ins {
            Instr::Load { load, .. } if self.reads != Reads::Strided => {
                let k = self.load_of[i].expect("every load has an argument");
                let dtype = self.p.inputs[load.input];
                match self.reads {
                    Reads::Lanes => widen(&format!("a{k}[j]"), dtype, c),
                    _ => widen(&format!("in{k}[l{k}.off + t]"), dtype, c),
                }
            }
            Instr::Load { load, .. } => {
                let k = self.load_of[i].expect("every load has an argument");
                let dtype = self.p.inputs[load.input];
                let mut index = format!("l{k}.off");
                let mut dims: Vec<usize> = load
                    .map
                    .axes
                    .iter()
                    .filter_map(|a| match a {
                        Axis::Iter { dim, .. } => Some(*dim),
                        Axis::Fixed(_) => None,
                    })
                    .collect();
                dims.sort_unstable();
                dims.dedup();
                for d in dims {
                    let _ = write!(index, " + i{d} * l{k}.s[{d}]");
                }
                let read = widen(&format!("in{k}[{index}]"), dtype, c);
                if load.map.masks.is_empty() {
                    read
                } else {
                    let inside: Vec<String> = load
                        .map
                        .masks
                        .iter()
                        .map(|m| format!("i{d} >= {lo} && i{d} < {hi}", d = m.dim, lo = m.lo, hi = m.hi))
                        .collect();
                    format!("({}) ? {read} : ({c})0", inside.join(" && "))
                }
            }
            Instr::Const { value, .. } => literal(*value, c),
            Instr::Unary { op, a, .. } => unary(*op, &format!("r{a}"), c),
            Instr::Binary { op, a, b, .. } => binary(*op, &format!("r{a}"), &format!("r{b}"), c),
            Instr::Where { cond, a, b, .. } => format!("r{cond} != ({c})0 ? r{a} : r{b}"),
            Instr::Cast { to, a, .. } => cast(*to, &format!("r{a}"), c),
            Instr::Expand { a, .. } => format!("r{a}"),
            Instr::Cat { dim, parts, .. } => {
                let mut e = format!("r{}", parts.last().map_or(0, |p| p.2));
                for &(_, hi, r) in parts.iter().rev().skip(1) {
                    e = format!("i{dim} < {hi} ? r{r} : ({e})");
                }
                e
            }
            Instr::Reduce { .. } => unreachable!("reductions are emitted by the row schedule"),
        };
        self.line(indent, &format!("const {c} r{dst} = {e};"));
    }

    /// Emits the last pass's instructions and stores each output `k` to
    /// `store(k)` (`out0[t]`, a lane `o0[j]`).
    fn element(&mut self, indent: usize, store: impl Fn(usize) -> String) {
        let p = self.p;
        for a in p.passes().last {
            if let Action::Exec(i) = a {
                self.instr(indent, i);
            }
        }
        for (k, s) in p.outputs.iter().enumerate() {
            let value = narrow(&format!("r{}", s.reg), s.dtype);
            self.line(indent, &format!("{} = {value};", store(k)));
        }
    }

    /// Defines `i{d}` for `dims` (row-major) from the linear index `from`.
    fn unravel(&mut self, indent: usize, from: &str, dims: &[usize], var: &str) {
        if dims.is_empty() {
            return;
        }
        self.line(indent, &format!("long long {var} = {from};"));
        for (k, &d) in dims.iter().enumerate().rev() {
            if k == 0 {
                self.line(indent, &format!("const long long i{d} = {var};"));
            } else {
                let n = self.p.shape[d];
                self.line(
                    indent,
                    &format!("const long long i{d} = {var} % {n}; {var} /= {n};"),
                );
            }
        }
    }

    /// The dense index of a full output from the iteration index.
    fn dense_index(&self) -> String {
        let strides = contiguous_strides(&self.p.shape);
        let terms: Vec<String> = (0..self.p.shape.len())
            .filter(|&d| self.p.shape[d] > 1)
            .map(|d| format!("i{d} * {}", strides[d]))
            .collect();
        if terms.is_empty() {
            "0".into()
        } else {
            terms.join(" + ")
        }
    }
}

/// The CUDA C source of `p`: [`ENTRY`] takes, per load instruction in
/// program order, a pointer to what it reads (`in0..`: its input's buffer,
/// or a dense copy of it when its layout needs one), then `out0..` (dense
/// outputs), then the loads' [`LoadArg`]s.
pub fn generate(p: &Program) -> String {
    let c = compute(p);
    let mut load_of = vec![None; p.instrs.len()];
    let mut loads = 0;
    for (i, ins) in p.instrs.iter().enumerate() {
        if matches!(ins, Instr::Load { .. }) {
            load_of[i] = Some(loads);
            loads += 1;
        }
    }
    let mut e = Emitter {
        p,
        c,
        out: String::new(),
        load_of,
        reads: Reads::Strided,
    };
    e.out.push_str(&prelude());
    let mut params: Vec<String> = p
        .load_dtypes()
        .enumerate()
        .map(|(k, d)| format!("const {} *__restrict__ in{k}", stored(d)))
        .collect();
    params.extend(
        p.outputs
            .iter()
            .enumerate()
            .map(|(k, s)| format!("{} *__restrict__ out{k}", stored(s.dtype))),
    );
    params.extend((0..loads).map(|k| format!("const SyLoad l{k}")));
    let _ = writeln!(
        e.out,
        "\nextern \"C\" __global__ void __launch_bounds__({BLOCK}) {ENTRY}({}) {{",
        params.join(", ")
    );
    if p.reduced.is_empty() {
        pointwise(&mut e);
    } else {
        rows(&mut e);
    }
    e.out.push_str("}\n");
    if has_dense_entry(p) {
        let _ = writeln!(
            e.out,
            "\nextern \"C\" __global__ void __launch_bounds__({BLOCK}) {ENTRY_DENSE}({}) {{",
            params.join(", ")
        );
        dense(&mut e);
        e.out.push_str("}\n");
    }
    e.out
}

/// Whether `p`'s source has the dense entry point: a pointwise program
/// whose loads and instructions never look at the iteration index (no
/// masks, no cats), so that element `t` of every input makes element `t`
/// of every output when the inputs are dense.
pub fn has_dense_entry(p: &Program) -> bool {
    p.reduced.is_empty()
        && p.instrs.iter().all(|ins| match ins {
            Instr::Load { load, .. } => load.map.masks.is_empty(),
            Instr::Cat { .. } => false,
            _ => true,
        })
}

/// Whether a launch of `p` may take the dense entry point: every load, with
/// its resolved offset and strides (`off`, `it`), reads its input densely
/// in iteration order, and every address (`ptrs`: the loads' element 0
/// then the outputs', with their element sizes) is aligned for the vector
/// loads and stores.
pub fn dense_launch(p: &Program, loads: &[(i64, &[i64])], ptrs: &[(u64, usize)]) -> bool {
    let dense = contiguous_strides(&p.shape);
    has_dense_entry(p)
        && loads.iter().all(|(_, it)| {
            (0..p.shape.len()).all(|d| p.shape[d] <= 1 || it.get(d).copied() == Some(dense[d] as i64))
        })
        && ptrs
            .iter()
            .all(|&(ptr, size)| ptr.is_multiple_of((LANES * size).min(16) as u64))
}

/// The C statement copying `LANES` elements of `size` bytes from `src` to
/// `dst` with the widest aligned vector type.
fn vector_copy(dst: &str, src: &str, size: usize) -> String {
    match LANES * size {
        4 => format!("*(SyV4 *)({dst}) = *(const SyV4 *)({src});"),
        8 => format!("*(SyV8 *)({dst}) = *(const SyV8 *)({src});"),
        16 => format!("*(SyV16 *)({dst}) = *(const SyV16 *)({src});"),
        _ => format!(
            "((SyV16 *)({dst}))[0] = ((const SyV16 *)({src}))[0]; ((SyV16 *)({dst}))[1] = ((const SyV16 *)({src}))[1];"
        ),
    }
}

/// The dense schedule: each thread takes [`LANES`] consecutive elements
/// with vector loads and stores; the last `numel % LANES` elements, one per
/// thread.
fn dense(e: &mut Emitter) {
    let p = e.p;
    let n = p.numel();
    let vectors = n / LANES;
    let stride = "(long long)gridDim.x * blockDim.x";
    e.line(
        1,
        &format!(
            "for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < {vectors}LL; v += {stride}) {{"
        ),
    );
    e.line(2, &format!("const long long base = v * {LANES};"));
    for (k, dtype) in p.load_dtypes().enumerate() {
        e.line(2, &format!("alignas(16) {} a{k}[{LANES}];", stored(dtype)));
        let copy = vector_copy(
            &format!("a{k}"),
            &format!("in{k} + l{k}.off + base"),
            dtype.size(),
        );
        e.line(2, &copy);
    }
    for (k, s) in p.outputs.iter().enumerate() {
        e.line(2, &format!("alignas(16) {} o{k}[{LANES}];", stored(s.dtype)));
    }
    e.line(2, "#pragma unroll");
    e.line(2, &format!("for (int j = 0; j < {LANES}; j++) {{"));
    e.reads = Reads::Lanes;
    e.element(3, |k| format!("o{k}[j]"));
    e.line(2, "}");
    for (k, s) in p.outputs.iter().enumerate() {
        let copy = vector_copy(&format!("out{k} + base"), &format!("o{k}"), s.dtype.size());
        e.line(2, &copy);
    }
    e.line(1, "}");
    let tail = vectors * LANES;
    e.line(
        1,
        &format!(
            "for (long long t = {tail}LL + (long long)blockIdx.x * blockDim.x + threadIdx.x; t < {n}LL; t += {stride}) {{"
        ),
    );
    e.reads = Reads::Dense;
    e.element(2, |k| format!("out{k}[t]"));
    e.line(1, "}");
    e.reads = Reads::Strided;
}

fn pointwise(e: &mut Emitter) {
    let p = e.p;
    let n = p.numel();
    e.line(
        1,
        &format!(
            "for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < {n}LL; t += (long long)gridDim.x * blockDim.x) {{"
        ),
    );
    let dims: Vec<usize> = (0..p.shape.len()).collect();
    e.unravel(2, "t", &dims, "q");
    e.element(2, |k| format!("out{k}[t]"));
    e.line(1, "}");
}

fn rows(e: &mut Emitter) {
    let p = e.p;
    let c = e.c;
    let kept: Vec<usize> = (0..p.shape.len()).filter(|d| !p.reduced.contains(d)).collect();
    let rows: usize = kept.iter().map(|&d| p.shape[d]).product();
    let row_len = p.row_len();
    let passes = p.passes();
    e.line(1, &format!("__shared__ {c} sy_part[{BLOCK}];"));
    e.line(
        1,
        &format!("for (long long row = blockIdx.x; row < {rows}LL; row += gridDim.x) {{"),
    );
    e.unravel(2, "row", &kept, "q");
    let row_instrs = |e: &mut Emitter, list: &[usize]| {
        for &i in list {
            e.instr(2, i);
        }
    };
    let walk = |e: &mut Emitter| {
        e.line(
            2,
            &format!("for (long long j = threadIdx.x; j < {row_len}LL; j += blockDim.x) {{"),
        );
        e.unravel(3, "j", &p.reduced, "u");
    };
    for (ph, (actions, reduces)) in passes.phases.iter().enumerate() {
        row_instrs(e, &passes.row_instrs[ph]);
        let combine: Vec<_> = reduces
            .iter()
            .map(|&i| match &p.instrs[i] {
                Instr::Reduce { op, a, dst } => (*op, *a, *dst, reduction(*op, c)),
                _ => unreachable!("a pass's reductions are reduce instructions"),
            })
            .collect();
        for (_, _, dst, (identity, _)) in &combine {
            e.line(2, &format!("{c} acc{dst} = {identity};"));
        }
        walk(e);
        for a in actions {
            if let Action::Exec(i) = *a
                && !reduces.contains(&i)
            {
                e.instr(3, i);
            }
        }
        for (_, a, dst, (_, f)) in &combine {
            e.line(
                3,
                &format!("acc{dst} = {};", f(&format!("acc{dst}"), &format!("r{a}"))),
            );
        }
        e.line(2, "}");
        for (op, _, dst, (_, f)) in &combine {
            // A tree over the block's partials; every thread reads the total.
            e.line(2, &format!("sy_part[threadIdx.x] = acc{dst};"));
            e.line(2, "__syncthreads();");
            e.line(2, "for (unsigned int h = blockDim.x / 2; h > 0; h >>= 1) {");
            e.line(
                3,
                &format!(
                    "if (threadIdx.x < h) sy_part[threadIdx.x] = {};",
                    f("sy_part[threadIdx.x]", "sy_part[threadIdx.x + h]")
                ),
            );
            e.line(3, "__syncthreads();");
            e.line(2, "}");
            let total = if *op == ReduceOp::Mean {
                format!("sy_part[0] * (({c})1 / ({c}){row_len})")
            } else {
                "sy_part[0]".into()
            };
            e.line(2, &format!("const {c} r{dst} = {total};"));
            e.line(2, "__syncthreads();");
        }
    }
    row_instrs(e, &passes.row_instrs[passes.phases.len()]);
    let full: Vec<(usize, &crate::program::Store)> = p
        .outputs
        .iter()
        .enumerate()
        .filter(|(_, s)| p.spaces[s.reg] == Space::Full)
        .collect();
    if !full.is_empty() {
        walk(e);
        for a in &passes.last {
            if let Action::Exec(i) = *a {
                e.instr(3, i);
            }
        }
        let index = e.dense_index();
        for (k, s) in full {
            e.line(
                3,
                &format!("out{k}[{index}] = {};", narrow(&format!("r{}", s.reg), s.dtype)),
            );
        }
        e.line(2, "}");
    }
    for (k, s) in p.outputs.iter().enumerate() {
        if p.spaces[s.reg] == Space::Row {
            e.line(
                2,
                &format!(
                    "if (threadIdx.x == 0) out{k}[row] = {};",
                    narrow(&format!("r{}", s.reg), s.dtype)
                ),
            );
        }
    }
    e.line(1, "}");
}

#[cfg(test)]
mod tests {
    //! Golden tests: each `tests/cuda/NAME.trace` is fused whole, and its
    //! CUDA C must equal `NAME.cu` beside it. After an intended change:
    //! `SWITCHYARD_BLESS=1 cargo test -p switchyard-exec-fuser golden`.

    use std::path::PathBuf;

    use switchyard_core::ir::OpId;

    use super::*;

    fn program_of(text: &str) -> Program {
        let trace = switchyard_core::text::parse(text).unwrap();
        let ops: Vec<OpId> = trace.ops_with_ids().map(|(id, _)| id).collect();
        let (inputs, outputs) = trace.region_boundary(&ops, &trace.uses());
        crate::lower::lower(&trace, &ops, &inputs, &outputs)
            .map_err(|f| format!("{}: {}", trace.describe_op(f[0].op), f[0].reason))
            .unwrap()
    }

    #[test]
    fn golden_sources_of_representative_regions() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cuda");
        let bless = std::env::var_os("SWITCHYARD_BLESS").is_some();
        let mut traces: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "trace"))
            .collect();
        traces.sort();
        assert!(traces.len() >= 4, "the golden traces are in {}", dir.display());
        let mut differ = Vec::new();
        for path in traces {
            // Every source starts with the same prelude; the golden file
            // holds what differs: the kernel.
            let source = generate(&program_of(&std::fs::read_to_string(&path).unwrap()));
            let source = source
                .strip_prefix(prelude().as_str())
                .expect("every source starts with the prelude")
                .to_string();
            let golden = path.with_extension("cu");
            if bless {
                std::fs::write(&golden, &source).unwrap();
            } else if std::fs::read_to_string(&golden).ok().as_deref() != Some(source.as_str()) {
                differ.push(golden.display().to_string());
            }
        }
        assert!(
            differ.is_empty(),
            "generated CUDA differs from {differ:?} (bless with SWITCHYARD_BLESS=1 if intended)"
        );
    }

    #[test]
    fn every_register_is_defined_before_it_is_read() {
        for text in [
            include_str!("../../tests/cuda/softmax.trace"),
            include_str!("../../tests/cuda/rms_norm_transposed.trace"),
            include_str!("../../tests/cuda/rope_cat.trace"),
            include_str!("../../tests/cuda/pointwise_mixed.trace"),
        ] {
            let src = generate(&program_of(text));
            let mut defined = std::collections::HashSet::new();
            for line in src.lines() {
                let code = line.trim();
                let (def, rest) = match code.split_once(" = ") {
                    Some((lhs, rhs)) if lhs.starts_with("const ") => (lhs.rsplit(' ').next(), rhs),
                    _ => (None, code),
                };
                for word in rest.split(|c: char| !c.is_ascii_alphanumeric() && c != '_') {
                    if word.len() > 1
                        && word.starts_with('r')
                        && word[1..].bytes().all(|b| b.is_ascii_digit())
                    {
                        assert!(defined.contains(word), "{word} read before defined in:\n{src}");
                    }
                }
                if let Some(d) = def {
                    defined.insert(d.to_string());
                }
            }
            assert_eq!(src.matches('{').count(), src.matches('}').count(), "{src}");
        }
    }

    #[test]
    fn the_dense_entry_is_taken_only_by_dense_aligned_launches() {
        let p = program_of("input x: f32[4, 8]\ninput y: f32[4, 8]\nz = add(x, y)\noutput z\n");
        assert!(has_dense_entry(&p) && generate(&p).contains(ENTRY_DENSE));
        let (rows, cols, bcast) = ([8i64, 1], [1i64, 4], [0i64, 1]);
        let aligned = [(0x1000, 4), (0x2000, 4), (0x3000, 4)];
        assert!(dense_launch(&p, &[(0, &rows[..]), (0, &rows[..])], &aligned));
        // A transposed or broadcast input reads out of iteration order.
        assert!(!dense_launch(&p, &[(0, &rows[..]), (0, &cols[..])], &aligned));
        assert!(!dense_launch(&p, &[(0, &bcast[..]), (0, &rows[..])], &aligned));
        // An address off the 16 bytes of a vector of four f32.
        assert!(!dense_launch(
            &p,
            &[(0, &rows[..]), (0, &rows[..])],
            &[(0x1004, 4), (0x2000, 4), (0x3000, 4)]
        ));
        assert!(!dense_launch(
            &p,
            &[(0, &rows[..]), (0, &rows[..])],
            &[(0x1000, 4), (0x2000, 4), (0x3008, 4)]
        ));
        // Two-byte elements: vectors of 8 bytes.
        let h = program_of("input x: f16[4, 8]\ny = neg(x)\noutput y\n");
        assert!(dense_launch(&h, &[(0, &rows[..])], &[(0x1008, 2), (0x2008, 2)]));
        assert!(!dense_launch(&h, &[(0, &rows[..])], &[(0x1004, 2), (0x2008, 2)]));
        // A dim of extent 1 may have any stride.
        let one = program_of("input x: f32[1, 8]\ny = neg(x)\noutput y\n");
        assert!(dense_launch(&one, &[(0, &[99i64, 1][..])], &[(0, 4), (0, 4)]));
        // Masked loads and cats look at the iteration index: no dense entry.
        let cat = program_of("input a: f32[4, 4]\ninput b: f32[4, 4]\nc = cat(a, b, dim=1)\noutput c\n");
        assert!(!has_dense_entry(&cat) && !generate(&cat).contains(ENTRY_DENSE));
        let rows_program = program_of("input x: f32[4, 8]\ny = sum(x, dims=[1])\noutput y\n");
        assert!(!has_dense_entry(&rows_program));
    }

    #[test]
    fn the_load_argument_matches_the_source() {
        assert_eq!(std::mem::size_of::<LoadArg>(), 8 * (1 + MAX_RANK));
        assert!(prelude().contains(&format!("long long s[{MAX_RANK}]")));
    }
}
