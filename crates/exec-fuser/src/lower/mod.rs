//! Lowering a region of trace ops into a [`Program`].
//!
//! Views of region inputs become part of the loads. Every other value is
//! evaluated under an [`IndexMap`] from the iteration index to its own index:
//! the map starts as the identity at the outputs and the reductions, and is
//! pushed through each op towards the inputs (a transpose permutes it, a slice
//! scales and shifts it, a broadcast pins dims, a cat shifts and masks it per
//! part). A value needed under two maps is evaluated twice, never copied.
//! The walk backwards collects the maps each value is needed under; the walk
//! forwards emits one instruction per (value, map).

// Hashed often (a map per value, per read): a fast hasher, not SipHash.
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use switchyard_core::ir::{OpId, OpKind, Operand, Trace, ValueId, reduce_dims};
use switchyard_core::meta::{broadcast_strides, reshape_strides};
use switchyard_core::{DType, Device};

mod maps;

use crate::program::{Axis, IndexMap, Instr, Load, Program, Reg, Space, Store, View};
use maps::{Shape, cat_parts, identity, normalise, op_shape, operand_maps};

/// Dims a program can iterate over.
pub(crate) const MAX_RANK: usize = 8;

/// Why an op of the region cannot be part of the program.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Failure {
    /// The op to leave out.
    pub op: OpId,
    /// Why.
    pub reason: String,
    /// Whether the op's result is not the region's iteration space: the op
    /// may begin a region of its own, in its result's space.
    pub space: bool,
}

/// Why the fuser cannot take `op` at all, or `None` when its kernel IR can
/// express it.
pub(crate) fn unsupported(trace: &Trace, op: OpId) -> Option<String> {
    let o = trace.op(op);
    match o.kind {
        OpKind::Unary(_)
        | OpKind::Binary(_)
        | OpKind::Where
        | OpKind::Cast
        | OpKind::Reduce(_)
        | OpKind::Cat
        | OpKind::Full => {}
        k if k.is_view() => {}
        other => return Some(format!("`{other}` is not in the fuser's kernel IR")),
    }
    for v in o.input_values().chain(o.outputs.iter().copied()) {
        let m = trace.meta(v);
        if !(m.dtype.is_float() || m.dtype == DType::Bool) {
            return Some(format!(
                "computes floats and bools only, and `{}` is {}",
                trace.value(v).name,
                m.dtype
            ));
        }
        if m.rank() > MAX_RANK {
            return Some(format!("iterates over at most {MAX_RANK} dims"));
        }
    }
    if let OpKind::Reduce(_) = o.kind
        && !trace.meta(o.outputs[0]).dtype.is_float()
    {
        return Some("reduces floats only".into());
    }
    None
}

/// How the lowering sees a value.
#[derive(Clone, Debug)]
enum Kind {
    /// A region input seen through views: read by loads.
    Input { input: usize, views: Vec<View> },
    /// Evaluated per point of the iteration space, under index maps.
    Full,
    /// Evaluated per row; the map gives how the value's dims follow the kept dims.
    Row(IndexMap),
}

/// Whether reshape `id`, whose operand is a region input seen through views,
/// can be a view of the input's buffer: the input's layout is what the
/// views before the region left it (op results are dense), then this
/// region's views apply.
fn reshape_is_view(trace: &Trace, kinds: &HashMap<ValueId, Kind>, inputs: &[ValueId], id: OpId) -> bool {
    let op = trace.op(id);
    let Some(x) = op.input_values().next() else {
        return false;
    };
    let Some(Kind::Input { input, views }) = kinds.get(&x) else {
        return false;
    };
    let v = inputs[*input];
    let mut shape = trace.meta(v).shape.clone();
    let mut strides = switchyard_core::cost::layout(trace, v);
    for view in views {
        match view {
            View::Reshape(to) => match reshape_strides(&shape, &strides, to) {
                Some(s) => {
                    strides = s;
                    shape = to.clone();
                }
                None => return false,
            },
            View::Transpose(perm) => {
                shape = perm.iter().map(|&q| shape[q]).collect();
                strides = perm.iter().map(|&q| strides[q]).collect();
            }
            View::Slice(params) => {
                for (d, &(_, len, step)) in params.iter().enumerate() {
                    shape[d] = len;
                    strides[d] *= step as isize;
                }
            }
            View::Broadcast(to) => {
                strides = broadcast_strides(&shape, &strides, to);
                shape = to.clone();
            }
        }
    }
    reshape_strides(&shape, &strides, &trace.meta(op.outputs[0]).shape).is_some()
}

struct Lowering<'a> {
    trace: &'a Trace,
    shape: Vec<usize>,
    reduced: Vec<usize>,
    kinds: HashMap<ValueId, Kind>,
    instrs: Vec<Instr>,
    spaces: Vec<Space>,
    full: HashMap<(ValueId, IndexMap), Reg>,
    row: HashMap<ValueId, Reg>,
    expanded: HashMap<Reg, Reg>,
    consts: HashMap<(u64, Space), Reg>,
    loads: HashMap<(usize, Vec<View>, IndexMap, Space), Reg>,
}

impl Lowering<'_> {
    fn emit(&mut self, space: Space, f: impl FnOnce(Reg) -> Instr) -> Reg {
        let dst = self.spaces.len();
        self.spaces.push(space);
        self.instrs.push(f(dst));
        dst
    }

    fn constant(&mut self, value: f64, space: Space) -> Reg {
        if let Some(&r) = self.consts.get(&(value.to_bits(), space)) {
            return r;
        }
        let r = self.emit(space, |dst| Instr::Const { value, dst });
        self.consts.insert((value.to_bits(), space), r);
        r
    }

    fn load(&mut self, input: usize, views: &[View], map: IndexMap, space: Space) -> Reg {
        let key = (input, views.to_vec(), map, space);
        if let Some(&r) = self.loads.get(&key) {
            return r;
        }
        let load = Load {
            input,
            views: key.1.clone(),
            map: key.2.clone(),
        };
        let r = self.emit(space, |dst| Instr::Load { load, dst });
        self.loads.insert(key, r);
        r
    }

    /// The row map of the kept dims, for a value of shape `shape` laid out as
    /// the iteration space with reduced dims kept as 1s or dropped.
    fn row_map(&self, shape: &[usize], keepdim: bool) -> IndexMap {
        let kept: Vec<usize> = (0..self.shape.len())
            .filter(|d| !self.reduced.contains(d))
            .collect();
        let axes = if keepdim {
            (0..self.shape.len())
                .map(|d| {
                    if self.reduced.contains(&d) {
                        Axis::Fixed(0)
                    } else {
                        Axis::Iter {
                            dim: d,
                            scale: 1,
                            offset: 0,
                        }
                    }
                })
                .collect()
        } else {
            kept.iter()
                .map(|&dim| Axis::Iter {
                    dim,
                    scale: 1,
                    offset: 0,
                })
                .collect()
        };
        normalise(IndexMap { axes, masks: vec![] }, shape)
    }

    /// The register holding operand `o` of an op evaluated in `space` under
    /// `map` (the operand's own map, already derived).
    fn operand(&mut self, o: &Operand, map: Option<IndexMap>, space: Space) -> Result<Reg, String> {
        let v = match o {
            Operand::Scalar(s) => return Ok(self.constant(s.as_f64(), space)),
            Operand::Value(v) => *v,
        };
        match (self.kinds[&v].clone(), space) {
            (Kind::Input { input, views }, Space::Full) => {
                let map = map.expect("full operands have a map");
                Ok(self.load(input, &views, map, Space::Full))
            }
            (Kind::Input { .. } | Kind::Full, Space::Row) => Err(format!(
                "`{}` is read per row but varies along the reduced dims",
                self.trace.value(v).name
            )),
            (Kind::Full, Space::Full) => {
                let map = map.expect("full operands have a map");
                self.full.get(&(v, map)).copied().ok_or_else(|| {
                    format!("`{}` is not evaluated where it is read", self.trace.value(v).name)
                })
            }
            (Kind::Row(rmap), Space::Full) => {
                let map = map.expect("full operands have a map");
                if map.axes != rmap.axes {
                    return Err(format!(
                        "`{}`, a reduction's result, is read at other indices than its rows",
                        self.trace.value(v).name
                    ));
                }
                let r = self.row[&v];
                if let Some(&e) = self.expanded.get(&r) {
                    return Ok(e);
                }
                let e = self.emit(Space::Full, |dst| Instr::Expand { a: r, dst });
                self.expanded.insert(r, e);
                Ok(e)
            }
            (Kind::Row(_), Space::Row) => Ok(self.row[&v]),
        }
    }
}

/// Lowers `ops` (in program order) with the region's `inputs` and `outputs`.
/// On failure, returns every op found to be in the way (at least one).
/// The shortest stretch of the walk, in elements, that a fused cat reads
/// from one part on average: below it (a part switch at every element)
/// the parts' loads and the cat's selection cost more per element than
/// the fallback's copy of each part (a stack of four parts along a reduced
/// dim of 4, 2 x 8 x 4 x 32: 55 us fused, where the fallback's cat takes
/// about 1).
const CAT_RUN_MIN: usize = 2;

/// How many elements of the walk (kept dims, then `reduced`, each in
/// order) a part of a cat along `dim` covers at a time, on average: the
/// parts' mean extent along `dim` times the dims walked inside it
/// (`usize::MAX` when every part is empty). One narrow part beside a wide
/// one (a column appended to rows) costs little; parts that are all
/// narrow cost at every element.
fn cat_run(shape: &[usize], reduced: &[usize], dim: usize, parts: &[(usize, usize, Reg)]) -> usize {
    let walk: Vec<usize> = (0..shape.len())
        .filter(|d| !reduced.contains(d))
        .chain(reduced.iter().copied())
        .collect();
    let at = walk.iter().position(|&d| d == dim).unwrap_or(0);
    let inner: usize = walk[at + 1..].iter().map(|&d| shape[d]).product();
    // An empty part (a cache with no past yet) is never read.
    let widths: Vec<usize> = parts
        .iter()
        .map(|&(lo, hi, _)| hi - lo)
        .filter(|&w| w > 0)
        .collect();
    match widths.len() {
        0 => usize::MAX,
        n => widths.iter().sum::<usize>() / n * inner,
    }
}

pub(crate) fn lower(
    trace: &Trace,
    ops: &[OpId],
    inputs: &[ValueId],
    outputs: &[ValueId],
) -> Result<Program, Vec<Failure>> {
    switchyard_core::work::add(ops.len());
    let fail = |op: OpId, reason: String| {
        vec![Failure {
            op,
            reason,
            space: false,
        }]
    };
    for &id in ops {
        if let Some(reason) = unsupported(trace, id) {
            return Err(fail(id, reason));
        }
    }
    // The iteration space: what the reductions reduce, or else the most common output shape.
    let mut space: Option<(Vec<usize>, Vec<usize>)> = None;
    let mut failures = Vec::new();
    for &id in ops {
        let op = trace.op(id);
        if let OpKind::Reduce(_) = op.kind {
            let x = op
                .input_values()
                .next()
                .ok_or_else(|| fail(id, "no operand".into()))?;
            let shape = trace.meta(x).shape.clone();
            let dims = reduce_dims(&op.attrs, shape.len()).map_err(|e| fail(id, e))?;
            match &space {
                None => space = Some((shape, dims)),
                Some(s) if *s == (shape.clone(), dims.clone()) => {}
                Some((s, d)) => failures.push(Failure {
                    op: id,
                    reason: format!(
                        "reduces dims {dims:?} of {shape:?}, and the region reduces dims {d:?} of {s:?}"
                    ),
                    space: false,
                }),
            }
        }
    }
    if !failures.is_empty() {
        return Err(failures);
    }
    // Only the region's own producers: the whole trace's would make lowering
    // every region of a large trace quadratic.
    let producers: HashMap<ValueId, OpId> = ops
        .iter()
        .flat_map(|&id| trace.op(id).outputs.iter().map(move |&v| (v, id)))
        .collect();
    let (shape, reduced) = match space {
        Some(s) => s,
        None => {
            let mut counts: Vec<(&Vec<usize>, usize)> = Vec::new();
            for v in outputs {
                let s = &trace.meta(*v).shape;
                match counts.iter_mut().find(|(c, _)| *c == s) {
                    Some(e) => e.1 += 1,
                    None => counts.push((s, 1)),
                }
            }
            let best = counts.iter().max_by_key(|(_, n)| *n).map(|(s, _)| (*s).clone());
            (best.unwrap_or_default(), vec![])
        }
    };
    let mut l = Lowering {
        trace,
        shape: shape.clone(),
        reduced,
        kinds: HashMap::with_capacity(inputs.len() + ops.len()),
        instrs: Vec::with_capacity(ops.len()),
        spaces: Vec::with_capacity(ops.len()),
        full: HashMap::with_capacity(ops.len()),
        row: HashMap::new(),
        expanded: HashMap::new(),
        consts: HashMap::new(),
        loads: HashMap::new(),
    };
    for (i, &v) in inputs.iter().enumerate() {
        l.kinds.insert(
            v,
            Kind::Input {
                input: i,
                views: vec![],
            },
        );
    }
    // Kinds, forwards.
    for &id in ops {
        let op = trace.op(id);
        let out = op.outputs[0];
        let out_shape = trace.meta(out).shape.clone();
        let kind_of = |v: &ValueId| l.kinds.get(v).cloned();
        let first = op.input_values().next();
        let kind = match op.kind {
            k if k.is_view() => match first.and_then(|v| kind_of(&v)) {
                // A reshape the input's layout does not allow as a view would
                // need a copy. On the CPU the value is then evaluated (and the
                // reshape fails below, to be handed back: the fallback copies
                // as fast); on a GPU the kernel reads a device copy instead,
                // as the alternative is a round trip through the host.
                Some(Kind::Input { input, .. })
                    if k == OpKind::Reshape
                        && trace.meta(inputs[input]).device == Device::Cpu
                        && !reshape_is_view(trace, &l.kinds, inputs, id) =>
                {
                    Kind::Full
                }
                Some(Kind::Input { input, mut views }) => {
                    views.push(match op_shape(trace, id).map_err(|e| fail(id, e))? {
                        Some(Shape::Transpose(p)) => View::Transpose(p),
                        Some(Shape::Slice(p)) => View::Slice(p),
                        _ if k == OpKind::Reshape => View::Reshape(out_shape.clone()),
                        _ => View::Broadcast(out_shape.clone()),
                    });
                    Kind::Input { input, views }
                }
                Some(_) => Kind::Full,
                None => return Err(fail(id, "its operand is outside the region's dataflow".into())),
            },
            OpKind::Reduce(_) => {
                let keepdim = op.attrs.bool_or("keepdim", false).map_err(|e| fail(id, e))?;
                Kind::Row(l.row_map(&out_shape, keepdim))
            }
            OpKind::Full | OpKind::Cat => Kind::Full,
            _ => {
                let rows: Vec<Option<IndexMap>> = op
                    .input_values()
                    .map(|v| match kind_of(&v) {
                        Some(Kind::Row(m)) if trace.meta(v).shape == out_shape => Some(m),
                        _ => None,
                    })
                    .collect();
                match rows.first() {
                    Some(Some(m)) if rows.iter().all(|r| r.as_ref() == Some(m)) => Kind::Row(m.clone()),
                    _ => Kind::Full,
                }
            }
        };
        l.kinds.insert(out, kind);
    }
    // Outputs must fit the iteration space (full) or its rows.
    let mut failures = Vec::new();
    for v in outputs {
        let ok = match &l.kinds[v] {
            Kind::Row(_) => true,
            _ => trace.meta(*v).shape == shape,
        };
        if !ok {
            let op = producers[v];
            failures.push(Failure {
                op,
                reason: format!(
                    "its result {:?} is not the region's iteration space {:?}",
                    trace.meta(*v).shape,
                    shape
                ),
                space: true,
            });
        }
    }
    if !failures.is_empty() {
        return Err(failures);
    }
    // Backwards: the maps each value is needed under.
    let mut need: HashMap<ValueId, Vec<IndexMap>> = HashMap::with_capacity(inputs.len() + ops.len());
    let mut rows_needed: HashSet<ValueId> = HashSet::new();
    // The maps already in `need`, hashed: a value read under many maps (one
    // operand of a cat of 100 000 parts) is checked in constant time, not
    // against every map so far.
    let mut needed: HashSet<(ValueId, IndexMap)> = HashSet::new();
    let mut add = |need: &mut HashMap<ValueId, Vec<IndexMap>>, v: ValueId, m: IndexMap| {
        switchyard_core::work::add(1);
        if needed.insert((v, m.clone())) {
            need.entry(v).or_default().push(m);
        }
    };
    let ident = identity(&shape);
    for v in outputs {
        match l.kinds[v] {
            Kind::Row(_) => {
                rows_needed.insert(*v);
            }
            _ => add(&mut need, *v, ident.clone()),
        }
    }
    for &id in ops.iter().rev() {
        let op = trace.op(id);
        let out = op.outputs[0];
        match &l.kinds[&out] {
            Kind::Input { .. } => {}
            Kind::Row(_) => {
                if !rows_needed.contains(&out) {
                    continue;
                }
                for v in op.input_values() {
                    match l.kinds[&v] {
                        _ if matches!(op.kind, OpKind::Reduce(_)) => add(&mut need, v, ident.clone()),
                        Kind::Row(_) => {
                            rows_needed.insert(v);
                        }
                        _ => {}
                    }
                }
            }
            Kind::Full => {
                // Every op in the way is reported at once, so that refinement
                // takes one round, not one per op.
                // Taken out while its operands' needs are added (no op
                // reads its own result), put back for the walk forwards.
                let maps = need.remove(&out).unwrap_or_default();
                'maps: for map in &maps {
                    let operands = match operand_maps(trace, id, map, &shape) {
                        Ok(m) => m,
                        Err(reason) => {
                            failures.push(Failure {
                                op: id,
                                reason,
                                space: false,
                            });
                            break 'maps;
                        }
                    };
                    for (o, m) in op.operands.iter().zip(operands) {
                        let (Operand::Value(v), Some(m)) = (o, m) else {
                            continue;
                        };
                        match &l.kinds[v] {
                            Kind::Row(rmap) => {
                                if m.axes != rmap.axes {
                                    failures.push(Failure {
                                        op: id,
                                        reason: format!(
                                            "reads `{}`, a reduction's result, at other indices than its rows",
                                            trace.value(*v).name
                                        ),
                                        space: false,
                                    });
                                    break 'maps;
                                }
                                rows_needed.insert(*v);
                            }
                            _ => add(&mut need, *v, m),
                        }
                    }
                }
                if !maps.is_empty() {
                    need.insert(out, maps);
                }
            }
        }
    }
    if !failures.is_empty() {
        return Err(failures);
    }
    // Forwards: one instruction per (value, map).
    for &id in ops {
        let op = trace.op(id);
        let out = op.outputs[0];
        let emit_err = |e: String| fail(id, e);
        match l.kinds[&out].clone() {
            Kind::Input { .. } => {}
            Kind::Row(_) => {
                if !rows_needed.contains(&out) {
                    continue;
                }
                let r = match op.kind {
                    OpKind::Reduce(r) => {
                        let a = l
                            .operand(&op.operands[0], Some(ident.clone()), Space::Full)
                            .map_err(emit_err)?;
                        l.emit(Space::Row, |dst| Instr::Reduce { op: r, a, dst })
                    }
                    _ => {
                        let args = op
                            .operands
                            .iter()
                            .map(|o| l.operand(o, None, Space::Row))
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(emit_err)?;
                        elementwise(&mut l, trace, id, &args, Space::Row).map_err(emit_err)?
                    }
                };
                l.row.insert(out, r);
            }
            Kind::Full => {
                for map in need.get(&out).into_iter().flatten() {
                    let maps = operand_maps(trace, id, map, &shape).map_err(emit_err)?;
                    let r = match (op.kind, op_shape(trace, id).map_err(emit_err)?) {
                        (OpKind::Cat, Some(Shape::Cat(dim))) => {
                            let sizes: Vec<usize> = op
                                .input_values()
                                .map(|v| trace.meta(v).shape.get(dim).copied().unwrap_or(0))
                                .collect();
                            let (iter_dim, parts) = cat_parts(map, &sizes, dim, &shape).map_err(emit_err)?;
                            let mut regs = Vec::new();
                            for (k, m, lo, hi) in parts {
                                let r = l
                                    .operand(&op.operands[k], Some(m), Space::Full)
                                    .map_err(emit_err)?;
                                regs.push((lo, hi, r));
                            }
                            if let Some(dim) = iter_dim {
                                let run = cat_run(&shape, &l.reduced, dim, &regs);
                                if run < CAT_RUN_MIN {
                                    return Err(emit_err(format!(
                                        "its parts would be read {run} element{} at a time along the region's walk (dim {dim} of {shape:?}{})",
                                        if run == 1 { "" } else { "s" },
                                        if l.reduced.contains(&dim) {
                                            ", a reduced dim"
                                        } else {
                                            ""
                                        }
                                    )));
                                }
                            }
                            match iter_dim {
                                Some(dim) => l.emit(Space::Full, |dst| Instr::Cat {
                                    dim,
                                    parts: regs,
                                    dst,
                                }),
                                None => regs
                                    .first()
                                    .map(|p| p.2)
                                    .ok_or_else(|| emit_err("cat index out of range".into()))?,
                            }
                        }
                        (k, _) if k.is_view() => {
                            let m = maps.into_iter().next().flatten();
                            l.operand(&op.operands[0], m, Space::Full).map_err(emit_err)?
                        }
                        _ => {
                            let args = op
                                .operands
                                .iter()
                                .zip(maps)
                                .map(|(o, m)| l.operand(o, m, Space::Full))
                                .collect::<Result<Vec<_>, _>>()
                                .map_err(emit_err)?;
                            elementwise(&mut l, trace, id, &args, Space::Full).map_err(emit_err)?
                        }
                    };
                    l.full.insert((out, map.clone()), r);
                }
            }
        }
    }
    let mut stores = Vec::with_capacity(outputs.len());
    for v in outputs {
        let m = trace.meta(*v);
        let reg = match l.kinds[v].clone() {
            Kind::Row(_) => l.row[v],
            Kind::Input { input, views } => l.load(input, &views, ident.clone(), Space::Full),
            Kind::Full => l.full[&(*v, ident.clone())],
        };
        stores.push(Store {
            reg,
            dtype: m.dtype,
            shape: m.shape.clone(),
        });
    }
    let touches_f64 = inputs
        .iter()
        .chain(ops.iter().flat_map(|&id| trace.op(id).outputs.iter()))
        .any(|&v| trace.meta(v).dtype == DType::F64);
    Ok(Program {
        shape,
        reduced: l.reduced,
        compute: if touches_f64 { DType::F64 } else { DType::F32 },
        inputs: inputs.iter().map(|&v| trace.meta(v).dtype).collect(),
        instrs: l.instrs,
        spaces: l.spaces,
        outputs: stores,
    })
}

/// Emits the instruction of an elementwise op (or a `full`) on registers `args`.
fn elementwise(l: &mut Lowering, trace: &Trace, id: OpId, args: &[Reg], space: Space) -> Result<Reg, String> {
    let op = trace.op(id);
    Ok(match op.kind {
        OpKind::Unary(u) => l.emit(space, |dst| Instr::Unary {
            op: u,
            a: args[0],
            dst,
        }),
        OpKind::Binary(b) => l.emit(space, |dst| Instr::Binary {
            op: b,
            a: args[0],
            b: args[1],
            dst,
        }),
        OpKind::Where => l.emit(space, |dst| Instr::Where {
            cond: args[0],
            a: args[1],
            b: args[2],
            dst,
        }),
        OpKind::Cast => {
            let to = trace.meta(op.outputs[0]).dtype;
            l.emit(space, |dst| Instr::Cast { to, a: args[0], dst })
        }
        OpKind::Full => {
            let v = op
                .attrs
                .scalar_opt("value")?
                .ok_or("`full` has no `value`")?
                .as_f64();
            l.constant(v, space)
        }
        other => return Err(format!("`{other}` is not elementwise")),
    })
}
