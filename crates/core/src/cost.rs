//! The cost model: estimated time in nanoseconds from a device model.
//!
//! A kernel costs host overhead + launch overhead + max(bytes moved / bandwidth,
//! FLOPs / peak). A view that needs no copy costs host overhead only. A fusion
//! region moves only its boundary tensors; its intermediates stay on chip. The
//! CPU model can be measured (`switchyard calibrate`) and saved; GPU models come
//! from published figures so a CUDA target can be planned without a GPU.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::{CompositeOp, OpId, OpKind, ReduceOp, Trace, Uses, ValueId};
use crate::meta::reshape_strides;

/// The figures that make up a device's cost model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceModel {
    /// Name of the device (or profile).
    pub name: String,
    /// Sustained memory bandwidth, GB/s.
    pub bandwidth_gb_s: f64,
    /// Peak arithmetic throughput per dtype name (`f32`, `f16`, ...), GFLOP/s.
    pub gflops: BTreeMap<String, f64>,
    /// Fixed cost of launching one kernel, ns.
    pub launch_overhead_ns: f64,
    /// Host-side cost of one call into an executor (dispatch, bookkeeping), ns.
    pub host_overhead_ns: f64,
    /// Bandwidth of copies between the host and this device (PCIe), GB/s:
    /// what an op run on the host costs in copies when its tensors live on
    /// the device. Profiles saved before it existed get the default, 25.
    #[serde(default = "default_host_link")]
    pub host_link_gb_s: f64,
    /// Peak of float32 matrix products on TF32 tensor cores, GFLOP/s, for
    /// devices that have them: what an f32 GEMM costs where TF32 is allowed
    /// (`allow_tf32`). Absent: such products run at the f32 peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tf32_gflops: Option<f64>,
    /// What launching one kernel costs when a plan is replayed as a device
    /// graph ([`crate::graph`]), ns: in place of the host and launch
    /// overheads of a kernel called by the runtime. Absent: not replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_launch_ns: Option<f64>,
    /// For a CPU: elements from which a kernel splits its work across
    /// threads; smaller work stays on one thread, where it is faster
    /// (measured by `switchyard calibrate`; see [`crate::threads`]).
    /// Absent: [`crate::threads::DEFAULT_PARALLEL_MIN`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_min_elements: Option<usize>,
}

fn default_host_link() -> f64 {
    25.0
}

/// A kernel launched from a replayed CUDA graph: about a microsecond each
/// on the GPUs modelled here, against the several microseconds of host
/// work and launch a kernel called by the runtime costs.
const GPU_GRAPH_LAUNCH_NS: f64 = 1_000.0;

/// The dtype whose peak a profile without one for `d` uses: the narrow
/// and unsigned integers run as fast as i32 (or i64, for u64), so a
/// profile need not list them.
fn peak_stand_in(d: DType) -> Option<DType> {
    match d {
        DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::U32 => Some(DType::I32),
        DType::U64 => Some(DType::I64),
        _ => None,
    }
}

fn gflops(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

impl DeviceModel {
    /// A 2-core CPU of the kind switchyard is developed on, from measurements
    /// (`gemm` f32 matmul ~158 GFLOP/s on two cores, STREAM copy ~25 GB/s).
    /// `switchyard calibrate` measures the machine at hand instead.
    pub fn cpu_default() -> DeviceModel {
        DeviceModel {
            name: "cpu".into(),
            bandwidth_gb_s: 20.0,
            gflops: gflops(&[
                ("f32", 150.0),
                ("f64", 75.0),
                ("f16", 60.0),
                ("bf16", 40.0),
                ("i32", 30.0),
                ("i64", 15.0),
                ("bool", 30.0),
            ]),
            launch_overhead_ns: 1_000.0,
            host_overhead_ns: 500.0,
            host_link_gb_s: default_host_link(),
            tf32_gflops: None,
            graph_launch_ns: None,
            parallel_min_elements: None,
        }
    }

    /// NVIDIA H100 SXM (published: 3.35 TB/s HBM3; dense tensor-core 989 TFLOP/s
    /// bf16/f16, 495 TFLOP/s TF32, 67 TFLOP/s f32 and f64; PCIe 5 x16, 64 GB/s
    /// a direction, of which about 50 are reached).
    pub fn h100() -> DeviceModel {
        DeviceModel {
            name: "h100".into(),
            bandwidth_gb_s: 3_350.0,
            gflops: gflops(&[
                ("f32", 67_000.0),
                ("f64", 67_000.0),
                ("f16", 989_000.0),
                ("bf16", 989_000.0),
                ("i32", 33_500.0),
                ("i64", 16_750.0),
                ("bool", 33_500.0),
            ]),
            launch_overhead_ns: 4_000.0,
            host_overhead_ns: 5_000.0,
            host_link_gb_s: 50.0,
            tf32_gflops: Some(494_700.0),
            graph_launch_ns: Some(GPU_GRAPH_LAUNCH_NS),
            parallel_min_elements: None,
        }
    }

    /// NVIDIA H200 (published: 4.8 TB/s HBM3e; the H100's compute figures).
    pub fn h200() -> DeviceModel {
        DeviceModel {
            name: "h200".into(),
            bandwidth_gb_s: 4_800.0,
            ..DeviceModel::h100()
        }
    }

    /// NVIDIA A100 SXM 80GB (published: 2.04 TB/s; 312 TFLOP/s bf16/f16, 156
    /// TFLOP/s TF32, 19.5 TFLOP/s f32, 19.5 TFLOP/s f64 on tensor cores; PCIe 4
    /// x16, 32 GB/s a direction, of which about 25 are reached).
    pub fn a100() -> DeviceModel {
        DeviceModel {
            name: "a100".into(),
            bandwidth_gb_s: 2_039.0,
            gflops: gflops(&[
                ("f32", 19_500.0),
                ("f64", 19_500.0),
                ("f16", 312_000.0),
                ("bf16", 312_000.0),
                ("i32", 19_500.0),
                ("i64", 9_750.0),
                ("bool", 19_500.0),
            ]),
            launch_overhead_ns: 4_000.0,
            host_overhead_ns: 5_000.0,
            host_link_gb_s: 25.0,
            tf32_gflops: Some(156_000.0),
            graph_launch_ns: Some(GPU_GRAPH_LAUNCH_NS),
            parallel_min_elements: None,
        }
    }

    /// The built-in models by name.
    pub fn builtin(name: &str) -> Option<DeviceModel> {
        match name {
            "cpu" => Some(DeviceModel::cpu_default()),
            "h100" => Some(DeviceModel::h100()),
            "h200" => Some(DeviceModel::h200()),
            "a100" => Some(DeviceModel::a100()),
            _ => None,
        }
    }

    /// Names of the built-in models.
    pub const BUILTIN: [&'static str; 4] = ["cpu", "h100", "h200", "a100"];

    /// A built-in model by name, or a profile file (TOML) by path.
    pub fn load(name_or_path: &str) -> Result<DeviceModel> {
        if let Some(m) = DeviceModel::builtin(name_or_path) {
            return Ok(m);
        }
        let path = Path::new(name_or_path);
        let text = crate::io::read_regular_text(path, crate::io::MAX_CONFIG_FILE_BYTES).map_err(|source| Error::Config {
            key: "cost.profile".into(),
            message: format!(
                "`{name_or_path}` is neither a built-in device model ({}) nor a readable profile file: {source}",
                DeviceModel::BUILTIN.join(", ")
            ),
        })?;
        let m: DeviceModel = toml::from_str(&text).map_err(|e| Error::Config {
            key: "cost.profile".into(),
            message: format!("{}: {e}", path.display()),
        })?;
        m.validate().map_err(|message| Error::Config {
            key: format!("cost.profile ({})", path.display()),
            message,
        })?;
        Ok(m)
    }

    /// Checks that every figure is positive and finite and every dtype present.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let ok = |v: f64| v.is_finite() && v > 0.0;
        if !ok(self.bandwidth_gb_s) {
            return Err(format!(
                "bandwidth_gb_s must be positive, got {}",
                self.bandwidth_gb_s
            ));
        }
        if !(self.launch_overhead_ns.is_finite() && self.launch_overhead_ns >= 0.0) {
            return Err("launch_overhead_ns must be non-negative".into());
        }
        if !(self.host_overhead_ns.is_finite() && self.host_overhead_ns >= 0.0) {
            return Err("host_overhead_ns must be non-negative".into());
        }
        if !ok(self.host_link_gb_s) {
            return Err(format!(
                "host_link_gb_s must be positive, got {}",
                self.host_link_gb_s
            ));
        }
        if let Some(v) = self.tf32_gflops
            && !ok(v)
        {
            return Err(format!("tf32_gflops must be positive, got {v}"));
        }
        if let Some(v) = self.graph_launch_ns
            && !(v.is_finite() && v >= 0.0)
        {
            return Err(format!("graph_launch_ns must be non-negative, got {v}"));
        }
        for d in DType::ALL {
            match self.gflops.get(d.name()) {
                Some(&v) if ok(v) => {}
                Some(v) => return Err(format!("gflops.{d} must be positive, got {v}")),
                None if peak_stand_in(d).is_some() => {}
                None => return Err(format!("gflops.{d} is missing")),
            }
        }
        if let Some(k) = self.gflops.keys().find(|k| DType::from_name(k).is_none()) {
            return Err(format!("gflops.{k}: unknown dtype"));
        }
        Ok(())
    }

    /// The model as TOML, for saving a profile.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a device model always serialises")
    }

    fn peak(&self, dtype: DType) -> f64 {
        let stand_in = || peak_stand_in(dtype).and_then(|d| self.gflops.get(d.name()));
        self.gflops
            .get(dtype.name())
            .or_else(stand_in)
            .copied()
            .unwrap_or(1.0)
    }

    /// Time of one kernel that moves `bytes` and does `flops` in `dtype`.
    pub fn kernel_ns(&self, bytes: f64, flops: f64, dtype: DType) -> f64 {
        self.kernel_at_peak_ns(bytes, flops, self.peak(dtype))
    }

    /// Time of one kernel that moves `bytes` and does `flops` at `gflops`.
    fn kernel_at_peak_ns(&self, bytes: f64, flops: f64, gflops: f64) -> f64 {
        let memory = bytes / self.bandwidth_gb_s; // bytes / (GB/s) = ns
        let compute = flops / gflops;
        self.host_overhead_ns + self.launch_overhead_ns + memory.max(compute)
    }

    /// Time of one matrix-product kernel that moves `bytes` and does `flops`
    /// in `dtype`; with `tf32`, an f32 product on TF32 tensor cores (at
    /// [`DeviceModel::tf32_gflops`] where the device has them).
    pub fn matmul_ns(&self, bytes: f64, flops: f64, dtype: DType, tf32: bool) -> f64 {
        match self.tf32_gflops {
            Some(peak) if tf32 && dtype == DType::F32 => self.kernel_at_peak_ns(bytes, flops, peak),
            _ => self.kernel_ns(bytes, flops, dtype),
        }
    }

    /// The time of a region estimated at `ns` when it is replayed from a
    /// device graph: the host and launch overheads of one kernel replaced by
    /// [`DeviceModel::graph_launch_ns`]; nothing for a region that launches
    /// nothing (views). `None` where the device replays no graph.
    pub fn replayed_ns(&self, ns: f64, launches: bool) -> Option<f64> {
        let launch = self.graph_launch_ns?;
        Some(match launches {
            true => (ns - self.host_overhead_ns - self.launch_overhead_ns).max(0.0) + launch,
            false => 0.0,
        })
    }

    /// Time of copying one tensor of `bytes` between the host and this
    /// device: a copy is queued and waited for like a kernel, then moves
    /// its bytes over the link.
    pub fn transfer_ns(&self, bytes: f64) -> f64 {
        self.host_overhead_ns + self.launch_overhead_ns + bytes / self.host_link_gb_s
    }

    /// Time of one op run alone as one kernel (a view that needs no copy: host
    /// overhead only).
    pub fn op_ns(&self, trace: &Trace, op: OpId) -> f64 {
        if is_free_view(trace, op) {
            return self.host_overhead_ns;
        }
        let o = trace.op(op);
        let bytes: usize = o
            .input_values()
            .chain(o.outputs.iter().copied())
            .map(|v| trace.meta(v).bytes())
            .sum();
        self.kernel_ns(bytes as f64, op_flops(trace, op), compute_dtype(trace, op))
    }

    /// Time of `ops` fused into one kernel: one launch, boundary tensors moved
    /// once, intermediates kept on chip.
    pub fn fused_ns(&self, trace: &Trace, ops: &[OpId], uses: &Uses) -> f64 {
        let set: HashSet<OpId> = ops.iter().copied().collect();
        let mut defined: HashSet<ValueId> = HashSet::new();
        let mut read: HashSet<ValueId> = HashSet::new();
        let mut bytes = 0usize;
        let mut flops = 0.0;
        let mut dtype = DType::F32;
        for &id in ops {
            let op = trace.op(id);
            defined.extend(op.outputs.iter().copied());
            flops += op_flops(trace, id);
            dtype = compute_dtype(trace, id);
        }
        for &id in ops {
            for v in trace.op(id).input_values() {
                if !defined.contains(&v) && read.insert(v) {
                    bytes += trace.meta(v).bytes();
                }
            }
        }
        for &v in &defined {
            if uses.escapes(v, |u| set.contains(&u)) {
                bytes += trace.meta(v).bytes();
            }
        }
        self.kernel_ns(bytes as f64, flops, dtype)
    }
}

/// Whether an op is a view that costs no copy (reshape of a contiguous value,
/// transpose, slice, broadcast).
pub fn is_free_view(trace: &Trace, op: OpId) -> bool {
    let o = trace.op(op);
    match o.kind {
        OpKind::Transpose | OpKind::Slice | OpKind::Broadcast => true,
        // A reshape is a view when the layout its operand really has (after
        // the views before it) allows one.
        OpKind::Reshape => o.input_values().next().is_some_and(|x| {
            let m = trace.meta(x);
            let out = &trace.meta(o.outputs[0]).shape;
            reshape_strides(&m.shape, &layout(trace, x), out).is_some()
        }),
        _ => false,
    }
}

/// The strides `v` has at run time when every free view before it is made
/// as a view: op results are dense, and views transform their operand's
/// layout.
pub fn layout(trace: &Trace, v: ValueId) -> Vec<isize> {
    // The chain of view ops back to a materialised value, newest first.
    let mut chain = Vec::new();
    let mut cur = v;
    let base = loop {
        let Some(op) = trace.producer(cur) else {
            break trace.meta(cur).strides.clone();
        };
        let o = trace.op(op);
        let view = o.kind.is_view();
        match (view, o.input_values().next()) {
            (true, Some(x)) => {
                chain.push(op);
                cur = x;
            }
            _ => break trace.meta(cur).strides.clone(),
        }
    };
    let mut strides = base;
    for &op in chain.iter().rev() {
        let o = trace.op(op);
        let x = o.input_values().next().expect("a view has an operand");
        let from = &trace.meta(x).shape;
        let to = &trace.meta(o.outputs[0]).shape;
        strides = match o.kind {
            OpKind::Transpose => match o.attrs.ints("perm") {
                Ok(perm) => perm
                    .iter()
                    .map(|&p| strides[crate::meta::normalize_dim(p, from.len()).unwrap_or(0)])
                    .collect(),
                Err(_) => crate::meta::contiguous_strides(to),
            },
            OpKind::Slice => match crate::ir::slice_params(&o.attrs, from) {
                Ok(params) => strides
                    .iter()
                    .zip(&params)
                    .map(|(s, &(_, _, step))| s * step as isize)
                    .collect(),
                Err(_) => crate::meta::contiguous_strides(to),
            },
            OpKind::Broadcast => crate::meta::broadcast_strides(from, &strides, to),
            // A reshape its operand's layout does not allow is a dense copy.
            _ => reshape_strides(from, &strides, to).unwrap_or_else(|| crate::meta::contiguous_strides(to)),
        };
    }
    strides
}

/// The dtype an op computes in (its first tensor operand's, or its output's).
fn compute_dtype(trace: &Trace, op: OpId) -> DType {
    let o = trace.op(op);
    o.input_values()
        .next()
        .or(o.outputs.first().copied())
        .map(|v| trace.meta(v).dtype)
        .unwrap_or(DType::F32)
}

/// Arithmetic of an op: 2·M·N·K per matmul (or linear), two per multiply-add of a
/// convolution, one per window tap of a pool, a few FLOPs per element for
/// transcendental functions, a heap's comparisons per element for `topk`,
/// one per element otherwise.
pub fn op_flops(trace: &Trace, op: OpId) -> f64 {
    let o = trace.op(op);
    let out = o
        .outputs
        .first()
        .map(|v| trace.meta(*v).numel() as f64)
        .unwrap_or(0.0);
    match o.kind {
        // `x @ w^T (+ bias)`: `k` is `x`'s last dim, as for a matmul.
        OpKind::Matmul | OpKind::Composite(CompositeOp::Linear) => {
            let k = o
                .operands
                .first()
                .and_then(|x| x.value())
                .map(|v| *trace.meta(v).shape.last().unwrap_or(&1))
                .unwrap_or(1);
            2.0 * out * k as f64
        }
        OpKind::Conv | OpKind::ConvTranspose => {
            let shape = |i: usize| {
                o.operands
                    .get(i)
                    .and_then(|x| x.value())
                    .map(|v| &trace.meta(v).shape[..])
            };
            match (shape(0), shape(1)) {
                (Some(x), Some(w)) => {
                    crate::ir::window::conv_geometry(&o.attrs, x, w, o.kind == OpKind::ConvTranspose)
                        .map_or(out, |g| 2.0 * g.macs() as f64)
                }
                _ => out,
            }
        }
        OpKind::Pool(_) => {
            let taps: usize = o
                .attrs
                .ints_opt("kernel")
                .ok()
                .flatten()
                .map_or(1, |k| k.iter().map(|&d| d.max(1) as usize).product());
            out * taps as f64
        }
        OpKind::Unary(u) if u.is_transcendental() => 8.0 * out,
        OpKind::Reduce(ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Prod | ReduceOp::Amax | ReduceOp::Amin) => {
            o.input_values()
                .next()
                .map(|v| trace.meta(v).numel() as f64)
                .unwrap_or(out)
        }
        // A selection compares each input element against the k kept, about
        // log2(k) times in a heap.
        OpKind::Topk => {
            let n = o
                .input_values()
                .next()
                .map(|v| trace.meta(v).numel() as f64)
                .unwrap_or(out);
            let k = o.attrs.int_or("k", 1).unwrap_or(1).max(1) as f64;
            n * (k + 1.0).log2().max(1.0)
        }
        OpKind::Lstm | OpKind::Gru | OpKind::Rnn => {
            let shapes: Vec<&[usize]> = o.input_values().map(|v| &trace.meta(v).shape[..]).collect();
            crate::ir::recurrent::recurrence(o.kind, &o.attrs, &shapes).map_or(out, |r| 2.0 * r.macs() as f64)
        }
        // A scatter copies its input, then writes one element per update.
        OpKind::Scatter => {
            let updates = o
                .input_values()
                .nth(2)
                .map(|v| trace.meta(v).numel() as f64)
                .unwrap_or(0.0);
            out + updates
        }
        OpKind::Reshape | OpKind::Transpose | OpKind::Slice | OpKind::Broadcast | OpKind::Cat => 0.0,
        _ => out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse;

    #[test]
    fn builtins_validate_and_round_trip() {
        for n in DeviceModel::BUILTIN {
            let m = DeviceModel::builtin(n).unwrap();
            m.validate().unwrap();
            let back: DeviceModel = toml::from_str(&m.to_toml()).unwrap();
            assert_eq!(back, m);
        }
    }

    #[test]
    fn tf32_prices_f32_products_only_where_the_device_has_it() {
        let (h100, cpu) = (DeviceModel::h100(), DeviceModel::cpu_default());
        let (bytes, flops) = (3.0 * 4096.0 * 4096.0 * 4.0, 2.0 * 4096f64.powi(3));
        let ieee = h100.matmul_ns(bytes, flops, DType::F32, false);
        let tf32 = h100.matmul_ns(bytes, flops, DType::F32, true);
        assert_eq!(ieee, h100.kernel_ns(bytes, flops, DType::F32));
        // 67 against 494.7 TFLOP/s, both compute-bound here.
        let ratio = (ieee - 9_000.0) / (tf32 - 9_000.0);
        assert!((ratio - 494.7 / 67.0).abs() < 1e-6, "{ratio}");
        // Other dtypes and devices without TF32 are unchanged by the flag.
        assert_eq!(
            h100.matmul_ns(bytes, flops, DType::F16, true),
            h100.kernel_ns(bytes, flops, DType::F16)
        );
        assert_eq!(
            cpu.matmul_ns(bytes, flops, DType::F32, true),
            cpu.matmul_ns(bytes, flops, DType::F32, false)
        );
        let mut bad = h100;
        bad.tf32_gflops = Some(0.0);
        assert_eq!(bad.validate().unwrap_err(), "tf32_gflops must be positive, got 0");
    }

    #[test]
    fn views_cost_host_overhead_and_fusion_saves_traffic() {
        let t = parse("input x: f32[1024, 1024]\na = transpose(x, perm=[1, 0])\nb = exp(a)\nc = mul(b, 2.0)\noutput c\n").unwrap();
        let m = DeviceModel::cpu_default();
        assert_eq!(m.op_ns(&t, OpId(0)), m.host_overhead_ns);
        let separate = m.op_ns(&t, OpId(1)) + m.op_ns(&t, OpId(2));
        let fused = m.fused_ns(&t, &[OpId(1), OpId(2)], &t.uses());
        // 4 MiB in + 4 MiB out once, against twice; and one launch instead of two.
        assert!(fused < separate * 0.6, "{fused} vs {separate}");
    }
}
