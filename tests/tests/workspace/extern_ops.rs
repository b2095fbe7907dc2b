//! `extern` ops: the ops a program embedding switchyard computes itself
//! (the torch.compile backend's ATen ops that switchyard lacks), run by an
//! executor the program provides (`SessionOptions::provided`): parsing and
//! its errors, the built-in executors refusing them, and the plan cutting
//! around one by cost.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use switchyard::core::executor::{Claim, Context, Executor, ExecutorInfo, Kernel, Region};
use switchyard::core::ir::{OpId, OpKind};
use switchyard::core::text::parse;
use switchyard::{Provided, Session, SessionOptions, Tensor};
use switchyard_core::Error;

/// `extern(x, fn="cumprod")` over the last dim of an f32 matrix, counting
/// its runs: what a program would compute for an op switchyard lacks.
struct Cumprod {
    runs: Arc<AtomicUsize>,
}

struct CumprodKernel {
    runs: Arc<AtomicUsize>,
}

impl Kernel for CumprodKernel {
    fn run(&self, inputs: &[&Tensor]) -> switchyard_core::Result<Vec<Tensor>> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        let x = inputs[0].to_vec::<f32>().unwrap();
        let cols = *inputs[0].shape().last().unwrap();
        let mut out = x.clone();
        for row in out.chunks_mut(cols) {
            for i in 1..row.len() {
                row[i] *= row[i - 1];
            }
        }
        Ok(vec![Tensor::from_vec(out, inputs[0].shape()).unwrap()])
    }
}

impl Executor for Cumprod {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::operator("host", "1", &["cpu"])
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        let o = cx.trace.op(op);
        match o.kind == OpKind::Extern && o.attrs.str_or("fn", "").unwrap_or("") == "cumprod" {
            true => Claim::Accept(cx.device.op_ns(cx.trace, op)),
            false => Claim::Reject("runs extern fn=cumprod only".into()),
        }
    }

    fn compile(&self, _region: &Region, _cx: &Context) -> switchyard_core::Result<Box<dyn Kernel>> {
        Ok(Box::new(CumprodKernel {
            runs: Arc::clone(&self.runs),
        }))
    }
}

const TRACE: &str = "\
input x: f32[2, 4]
a = mul(x, 0.5)
b = extern(a, fn=\"cumprod\", dtypes=[f32], shapes=[[2, 4]])
y = add(b, 1.0)
output y
";

fn session(provided: Vec<Provided>) -> switchyard::Result<Session> {
    let options = SessionOptions {
        provided,
        ..SessionOptions::default()
    };
    Session::from_trace_with(parse(TRACE).unwrap(), Vec::new(), &options)
}

#[test]
fn an_extern_op_runs_on_the_provided_executor_and_the_rest_around_it() {
    let runs = Arc::new(AtomicUsize::new(0));
    let s = session(vec![Provided(Arc::new(Cumprod {
        runs: Arc::clone(&runs),
    }))])
    .unwrap();
    let x: Vec<f32> = vec![1., 2., 3., 4., -1., 0.5, 2., 4.];
    let out = s
        .run(&[("x", Tensor::from_vec(x.clone(), &[2, 4]).unwrap())])
        .unwrap();
    let y = out[0].1.to_vec::<f32>().unwrap();
    let mut want = Vec::new();
    for row in x.chunks(4) {
        let mut p = 1.0f32;
        for v in row {
            p *= v * 0.5;
            want.push(p + 1.0);
        }
    }
    assert_eq!(y, want);
    assert_eq!(runs.load(Ordering::Relaxed), 1);
    let plan = s.plan(&[]).unwrap();
    let explain = plan.explain();
    assert!(explain.contains("host"), "{explain}");
    // The ops around it stay with switchyard's executors.
    let summary = plan.summary();
    assert!(
        summary.lines().filter(|l| l.contains("host")).count() == 1,
        "{summary}"
    );
    assert!(
        summary.contains("fuser") || summary.contains("fallback"),
        "{summary}"
    );
}

#[test]
fn without_a_provided_executor_the_plan_says_who_refused_it() {
    let e = session(Vec::new())
        .unwrap()
        .run(&[("x", Tensor::from_vec(vec![0f32; 8], &[2, 4]).unwrap())]);
    let message = e.unwrap_err().to_string();
    assert!(message.contains("extern"), "{message}");
    assert!(
        message.contains("runs in the program that declared it"),
        "{message}"
    );
}

#[test]
fn a_provided_executor_may_not_take_a_known_name() {
    struct Named;
    impl Executor for Named {
        fn info(&self) -> ExecutorInfo {
            ExecutorInfo::operator("fallback", "1", &["cpu"])
        }
        fn claim(&self, _op: OpId, _cx: &Context) -> Claim {
            Claim::Reject("nothing".into())
        }
        fn compile(&self, _r: &Region, _cx: &Context) -> switchyard_core::Result<Box<dyn Kernel>> {
            unreachable!("claims nothing")
        }
    }
    let e = session(vec![Provided(Arc::new(Named))]).err().expect("a clash");
    assert!(e.to_string().contains("named `fallback`"), "{e}");
}

fn parse_error(src: &str) -> String {
    match parse(src) {
        Err(Error::Parse { message, .. }) => message,
        other => panic!("expected a parse error for:\n{src}\ngot {other:?}"),
    }
}

#[test]
fn extern_declarations_are_checked() {
    let cases = [
        ("b = extern(x, dtypes=[f32], shapes=[[2]])", "attribute `fn`"),
        (
            "b = extern(x, fn=\"f\", shapes=[[2]])",
            "missing attribute `dtypes`",
        ),
        (
            "b = extern(x, fn=\"f\", dtypes=[f32])",
            "missing attribute `shapes`",
        ),
        (
            "b = extern(x, fn=\"f\", dtypes=[f32, i64], shapes=[[2]])",
            "declares 2 dtype(s) and 1 shape(s)",
        ),
        (
            "b = extern(x, fn=\"f\", dtypes=[f32], shapes=[2])",
            "must list shapes",
        ),
        (
            "b = extern(x, fn=\"f\", dtypes=[f32], shapes=[[-2]])",
            "where a size belongs",
        ),
        (
            "b = extern(x, fn=\"f\", dtypes=[3], shapes=[[2]])",
            "must list dtypes",
        ),
        ("b = extern(x, fn=\"f\", dtypes=[], shapes=[])", "at least one"),
        (
            "b = extern(x, fn=\"f\", dtypes=[f32], shapes=[[2]], extra=1)",
            "unknown attribute `extra`",
        ),
    ];
    for (line, needle) in cases {
        let src = format!("input x: f32[2]\n{line}\noutput b\n");
        let m = parse_error(&src);
        assert!(m.contains(needle), "{line}: {m:?} lacks {needle:?}");
    }
    // Several outputs, of the declared metadata.
    let t = parse(
        "input x: f32[2]\nb, c = extern(x, fn=\"f\", dtypes=[f32, i64], shapes=[[2], [3, 1]])\noutput b, c\n",
    )
    .unwrap();
    assert_eq!(t.meta(t.outputs[1]).shape, vec![3, 1]);
    assert_eq!(t.meta(t.outputs[1]).dtype, switchyard_core::DType::I64);
}
