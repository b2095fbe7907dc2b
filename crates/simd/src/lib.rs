//! # switchyard-simd
//!
//! The CPU kernels' instruction sets, chosen at run time, and the vector
//! math they compute with.
//!
//! One switchyard binary runs on every x86-64: it is built for the baseline
//! (SSE2), and a kernel's hot loops are compiled again for AVX2+FMA and for
//! AVX-512 inside [`Simd::run`], which calls them through a function built
//! for the instruction set the machine has. Everything such a loop calls must
//! be `#[inline(always)]` to be compiled with it (a call leaves the
//! instruction set). On aarch64 NEON is part of the baseline, so the one
//! build already uses it.
//!
//! The level is detected once per process. `SWITCHYARD_SIMD=scalar|avx2|
//! avx512` caps it (a level the machine lacks falls back to the best one it
//! has, with a warning), and [`Simd::forced`] runs a closure at a given
//! level on the calling thread, so tests compare every level in one process.
//!
//! [`math`] holds exp, log, tanh, sigmoid, erf, sin, cos and rsqrt for f32
//! in straight-line arithmetic that vectorises, with their maximum errors in
//! ulp documented and tested. They use no fused multiply-add, so a kernel
//! gives the same bits at every level.

pub mod math;
pub mod peak;

/// The explicit vector types [`Simd::vectorize`] hands its kernels.
pub use pulp;

use std::cell::Cell;
use std::sync::OnceLock;

/// `out[i] = f(a[i])`: the elementwise loop the kernels compile at every
/// level (it inlines, so it vectorises at the level of its caller).
#[inline(always)]
pub fn map<T: Copy, U>(a: &[T], out: &mut [U], f: impl Fn(T) -> U) {
    for (o, &x) in out.iter_mut().zip(a) {
        *o = f(x);
    }
}

/// An instruction-set level a kernel can be compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// The build's baseline: SSE2 on x86-64.
    Scalar,
    /// x86-64 with AVX2, FMA, F16C, BMI1/2 (x86-64-v3).
    Avx2,
    /// x86-64-v3 plus AVX-512 F, BW, DQ and VL (x86-64-v4).
    Avx512,
    /// aarch64's baseline NEON.
    Neon,
}

impl Level {
    /// Every level, lowest first.
    pub const ALL: [Level; 4] = [Level::Scalar, Level::Avx2, Level::Avx512, Level::Neon];

    /// The name `SWITCHYARD_SIMD` takes.
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
            Level::Neon => "neon",
        }
    }

    /// The level named `name`, if there is one.
    pub fn parse(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.name() == name.trim())
    }

    /// Whether this machine runs code built for this level.
    pub fn supported(self) -> bool {
        match self {
            Level::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
                    && is_x86_feature_detected!("bmi1")
                    && is_x86_feature_detected!("bmi2")
                    && is_x86_feature_detected!("lzcnt")
                    && is_x86_feature_detected!("popcnt")
            }
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => {
                Level::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "aarch64")]
            Level::Neon => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The levels this machine supports, lowest first.
pub fn supported() -> Vec<Level> {
    Level::ALL.into_iter().filter(|l| l.supported()).collect()
}

/// A level this machine supports: the proof [`Simd::run`] needs to call
/// code built for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Simd {
    level: Level,
}

thread_local! {
    static FORCED: Cell<Option<Simd>> = const { Cell::new(None) };
}

impl Simd {
    /// `level`, if this machine supports it.
    pub fn new(level: Level) -> Option<Simd> {
        level.supported().then_some(Simd { level })
    }

    /// The process's level: the best this machine supports, capped by
    /// `SWITCHYARD_SIMD`; chosen once.
    pub fn best() -> Simd {
        static CHOSEN: OnceLock<Simd> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let best = supported().into_iter().max().unwrap_or(Level::Scalar);
            let level = match std::env::var("SWITCHYARD_SIMD") {
                Err(_) => best,
                Ok(name) => choose(&name, best),
            };
            tracing::debug!(%level, "SIMD level");
            Simd { level }
        })
    }

    /// The level kernels started on this thread run at: the one
    /// [`Simd::forced`] set, else [`Simd::best`]. Kernels read it on the
    /// calling thread and hand it to their worker threads.
    pub fn current() -> Simd {
        FORCED.with(Cell::get).unwrap_or_else(Simd::best)
    }

    /// Runs `f` with [`Simd::current`] returning `self` on this thread.
    pub fn forced<R>(self, f: impl FnOnce() -> R) -> R {
        struct Restore(Option<Simd>);
        impl Drop for Restore {
            fn drop(&mut self) {
                FORCED.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(FORCED.with(|c| c.replace(Some(self))));
        f()
    }

    /// The level.
    pub fn level(self) -> Level {
        self.level
    }

    /// Calls `f` from a function compiled for this level, so that `f` and
    /// what it inlines are compiled for it too.
    #[inline(always)]
    pub fn run<R>(self, f: impl FnOnce() -> R) -> R {
        match self.level {
            // SAFETY: a `Simd` holds a level only once `supported` said the
            // machine has its features.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { x86::avx512(f) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { x86::avx2(f) },
            _ => f(),
        }
    }

    /// Runs `op` with `pulp`'s explicit vector types for this level
    /// (AVX-512: `V4`, AVX2: `V3`, scalar: one lane), for kernels that keep
    /// values in vector registers, which autovectorised loops over memory
    /// do not. `op` and what it inlines are compiled for the level as with
    /// [`Simd::run`].
    #[inline(always)]
    pub fn vectorize<Op: pulp::WithSimd>(self, op: Op) -> Op::Output {
        match self.level {
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => match x86::v4() {
                Some(s) => pulp::Simd::vectorize(s, op),
                // AVX-512 without the CD extension pulp's V4 wants.
                None => Simd { level: Level::Avx2 }.vectorize(op),
            },
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => match x86::v3() {
                Some(s) => pulp::Simd::vectorize(s, op),
                None => pulp::Simd::vectorize(pulp::Scalar, op),
            },
            #[cfg(target_arch = "aarch64")]
            Level::Neon => pulp::Arch::new().dispatch(op),
            _ => pulp::Simd::vectorize(pulp::Scalar, op),
        }
    }
}

/// The level `SWITCHYARD_SIMD=name` asks for, at most `best`.
fn choose(name: &str, best: Level) -> Level {
    match Level::parse(name) {
        None => {
            tracing::warn!("SWITCHYARD_SIMD={name:?} is not one of scalar, avx2, avx512, neon; using {best}");
            best
        }
        Some(l) if l.supported() => l,
        Some(l) => {
            // The best supported level below the one asked for.
            let below = supported()
                .into_iter()
                .filter(|s| *s < l)
                .max()
                .unwrap_or(Level::Scalar);
            tracing::warn!("SWITCHYARD_SIMD={l}: this machine lacks it; using {below}");
            below
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx2,fma,f16c,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
        f()
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
        f()
    }

    /// pulp's AVX-512 token, detected once: detecting it checks some twenty
    /// features, too slow for every tile.
    pub(super) fn v4() -> Option<pulp::x86::V4> {
        static V4: std::sync::OnceLock<Option<pulp::x86::V4>> = std::sync::OnceLock::new();
        *V4.get_or_init(pulp::x86::V4::try_new)
    }

    /// pulp's AVX2 token, detected once.
    pub(super) fn v3() -> Option<pulp::x86::V3> {
        static V3: std::sync::OnceLock<Option<pulp::x86::V3>> = std::sync::OnceLock::new();
        *V3.get_or_init(pulp::x86::V3::try_new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_by_name_and_scalar_is_always_there() {
        for l in Level::ALL {
            assert_eq!(Level::parse(l.name()), Some(l));
        }
        assert_eq!(Level::parse("sse9"), None);
        assert!(supported().contains(&Level::Scalar));
        assert!(Simd::best().level().supported());
    }

    #[test]
    fn a_level_asked_for_is_capped_by_what_the_machine_has() {
        assert_eq!(choose("scalar", Level::Avx512), Level::Scalar);
        assert_eq!(choose("nonsense", Level::Avx2), Level::Avx2);
        let lacking = Level::ALL.into_iter().find(|l| !l.supported());
        if let Some(l) = lacking {
            let got = choose(l.name(), Level::Scalar);
            assert!(got < l && got.supported(), "{l} gave {got}");
        }
    }

    #[test]
    fn forcing_a_level_holds_on_this_thread_only_while_it_runs() {
        let scalar = Simd::new(Level::Scalar).unwrap();
        let before = Simd::current();
        scalar.forced(|| {
            assert_eq!(Simd::current(), scalar);
            std::thread::spawn(|| assert_eq!(Simd::current(), Simd::best()))
                .join()
                .unwrap();
        });
        assert_eq!(Simd::current(), before);
    }

    #[test]
    fn every_level_runs_the_same_code_to_the_same_bits() {
        let xs: Vec<f32> = (0..1000).map(|i| i as f32 * 0.37 - 150.0).collect();
        let at = |l: Level| {
            let mut out = vec![0f32; xs.len()];
            Simd::new(l).unwrap().run(|| math::tanh(&xs, &mut out));
            out
        };
        let want = at(Level::Scalar);
        for l in supported() {
            assert_eq!(at(l), want, "{l}");
        }
    }
}
