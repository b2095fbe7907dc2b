//! # switchyard-cuda
//!
//! The device layer the CUDA executors share. This part answers, before
//! anything binds a CUDA symbol, what this machine offers: the driver (and
//! how many devices it sees), NVRTC, cuBLAS and cuDNN. Each is opened with
//! `libloading` and its entry points looked up one by one, so that a missing
//! driver, a library too old for a symbol or a machine without a device is a
//! reason an executor can report, never a panic or an abort.
//!
//! Probing runs once per process ([`probe`]). The `cuda:N` device layer
//! ([`layer`]) builds on it; [`gemm`] says which GEMM an op is and how its
//! products are computed, and [`lt`] queues GEMMs through cuBLASLt, for
//! every executor that multiplies matrices.

pub mod copy;
pub mod executor;
pub mod gemm;
pub mod host;
pub mod layer;
pub mod lt;
pub mod source;

pub use layer::{
    Raw, alloc, alloc_zeros, buffer_len, copy_device, device_ptr, memory, output_ptr, stream, synchronize,
    zero,
};

use std::ffi::c_int;
use std::sync::OnceLock;

use libloading::Library;

/// What the driver reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Driver {
    /// The library that was opened.
    pub library: String,
    /// `cuDriverGetVersion`: 1000 × major + 10 × minor.
    pub version: i32,
    /// Devices it sees.
    pub devices: i32,
}

/// A CUDA library found, with the file that was opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The library that was opened.
    pub library: String,
}

/// What this machine offers, each part with the reason when it is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// The driver, with at least one device.
    pub driver: Result<Driver, String>,
    /// NVRTC (runtime compilation), for the fuser's CUDA backend.
    pub nvrtc: Result<Found, String>,
    /// cuBLAS with cuBLASLt.
    pub cublas: Result<Found, String>,
    /// cuDNN.
    pub cudnn: Result<Found, String>,
}

/// The libraries an executor needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// NVRTC.
    Nvrtc,
    /// cuBLAS and cuBLASLt.
    Cublas,
    /// cuDNN.
    Cudnn,
}

impl Probe {
    /// Why an executor that needs the driver and `needs` cannot run here,
    /// or `None` when it can.
    pub fn unavailable(&self, needs: &[Needs]) -> Option<String> {
        if let Err(why) = &self.driver {
            return Some(why.clone());
        }
        needs.iter().find_map(|n| {
            let found = match n {
                Needs::Nvrtc => &self.nvrtc,
                Needs::Cublas => &self.cublas,
                Needs::Cudnn => &self.cudnn,
            };
            found.as_ref().err().cloned()
        })
    }

    /// One line per part, for `switchyard executors`.
    pub fn summary(&self) -> Vec<String> {
        let show = |name: &str, r: &Result<Found, String>| match r {
            Ok(f) => format!("{name}: {}", f.library),
            Err(why) => format!("{name}: unavailable: {why}"),
        };
        vec![
            match &self.driver {
                Ok(d) => format!(
                    "driver: {} (CUDA {}.{}, {} device(s))",
                    d.library,
                    d.version / 1000,
                    (d.version % 1000) / 10,
                    d.devices
                ),
                Err(why) => format!("driver: unavailable: {why}"),
            },
            show("nvrtc", &self.nvrtc),
            show("cublas", &self.cublas),
            show("cudnn", &self.cudnn),
        ]
    }
}

/// What this machine offers (probed once).
pub fn probe() -> &'static Probe {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    PROBE.get_or_init(|| Probe {
        driver: driver(),
        nvrtc: find("NVRTC", NVRTC, b"nvrtcVersion\0"),
        cublas: find("cuBLAS", CUBLAS, b"cublasCreate_v2\0").and_then(|blas| {
            let lt = find("cuBLASLt", CUBLASLT, b"cublasLtMatmul\0")?;
            Ok(Found {
                library: format!("{} and {}", blas.library, lt.library),
            })
        }),
        cudnn: find("cuDNN", CUDNN, b"cudnnCreate\0"),
    })
}

#[cfg(windows)]
const DRIVER: &[&str] = &["nvcuda.dll"];
#[cfg(not(windows))]
const DRIVER: &[&str] = &["libcuda.so.1", "libcuda.so"];

#[cfg(windows)]
const NVRTC: &[&str] = &["nvrtc64_130_0.dll", "nvrtc64_120_0.dll", "nvrtc64_112_0.dll"];
#[cfg(not(windows))]
const NVRTC: &[&str] = &[
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so.11.2",
    "libnvrtc.so",
];

#[cfg(windows)]
const CUBLAS: &[&str] = &["cublas64_13.dll", "cublas64_12.dll", "cublas64_11.dll"];
#[cfg(not(windows))]
const CUBLAS: &[&str] = &[
    "libcublas.so.13",
    "libcublas.so.12",
    "libcublas.so.11",
    "libcublas.so",
];

#[cfg(windows)]
const CUBLASLT: &[&str] = &["cublasLt64_13.dll", "cublasLt64_12.dll", "cublasLt64_11.dll"];
#[cfg(not(windows))]
const CUBLASLT: &[&str] = &[
    "libcublasLt.so.13",
    "libcublasLt.so.12",
    "libcublasLt.so.11",
    "libcublasLt.so",
];

#[cfg(windows)]
const CUDNN: &[&str] = &["cudnn64_9.dll", "cudnn64_8.dll"];
#[cfg(not(windows))]
const CUDNN: &[&str] = &["libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"];

/// Opens the first of `names` that loads.
fn open(what: &str, names: &[&str]) -> Result<(Library, String), String> {
    let mut last = String::new();
    for name in names {
        // SAFETY: loading a vendor library runs its initialisers, which is
        // what using CUDA at all requires.
        match unsafe { Library::new(name) } {
            Ok(lib) => return Ok((lib, name.to_string())),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!(
        "{what} not found (tried {}; last error: {last})",
        names.join(", ")
    ))
}

/// A library that loads and has `symbol`.
fn find(what: &str, names: &[&str], symbol: &[u8]) -> Result<Found, String> {
    let (lib, library) = open(what, names)?;
    // SAFETY: only the symbol's presence is checked; it is never called.
    unsafe { lib.get::<unsafe extern "C" fn()>(symbol) }.map_err(|e| {
        format!(
            "{library} lacks `{}` (too old?): {e}",
            String::from_utf8_lossy(&symbol[..symbol.len() - 1])
        )
    })?;
    Ok(Found { library })
}

/// NVRTC's version (major, minor), part of the key of every kernel it
/// compiles; `None` when NVRTC is unavailable.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    static VERSION: OnceLock<Option<(i32, i32)>> = OnceLock::new();
    *VERSION.get_or_init(|| {
        probe().nvrtc.as_ref().ok()?;
        let (lib, _) = open("NVRTC", NVRTC).ok()?;
        type Version = unsafe extern "C" fn(major: *mut c_int, minor: *mut c_int) -> c_int;
        // SAFETY: `nvrtcVersion`'s documented signature; outputs are valid pointers.
        let version = unsafe { lib.get::<Version>(b"nvrtcVersion\0") }.ok()?;
        let (mut major, mut minor) = (0, 0);
        (unsafe { version(&mut major, &mut minor) } == 0).then_some((major, minor))
    })
}

type CuInit = unsafe extern "C" fn(flags: u32) -> c_int;
type CuGetInt = unsafe extern "C" fn(out: *mut c_int) -> c_int;

/// The driver: loads, initialises, and sees at least one device.
fn driver() -> Result<Driver, String> {
    let (lib, library) = open("the CUDA driver", DRIVER).map_err(|e| format!("no NVIDIA driver: {e}"))?;
    let symbol = |name: &[u8]| {
        let shown = String::from_utf8_lossy(&name[..name.len() - 1]).into_owned();
        // SAFETY: these are the driver API's documented signatures.
        unsafe { lib.get::<CuGetInt>(name) }
            .map(|s| *s)
            .map_err(|e| format!("{library} lacks `{shown}`: {e}"))
    };
    // SAFETY: `cuInit`'s documented signature.
    let init: CuInit = unsafe { lib.get::<CuInit>(b"cuInit\0") }
        .map(|s| *s)
        .map_err(|e| format!("{library} lacks `cuInit`: {e}"))?;
    let get_version = symbol(b"cuDriverGetVersion\0")?;
    let get_count = symbol(b"cuDeviceGetCount\0")?;
    // SAFETY: calling the driver as documented; outputs are valid pointers.
    let code = unsafe { init(0) };
    if code != 0 {
        return Err(match code {
            100 => "the CUDA driver finds no device (CUDA_ERROR_NO_DEVICE)".to_string(),
            35 => {
                "the CUDA driver is older than this build needs (CUDA_ERROR_INSUFFICIENT_DRIVER)".to_string()
            }
            c => format!("cuInit failed with CUDA error {c}"),
        });
    }
    let (mut version, mut devices) = (0, 0);
    // SAFETY: as above.
    let (a, b) = unsafe { (get_version(&mut version), get_count(&mut devices)) };
    if a != 0 || b != 0 {
        return Err(format!("the CUDA driver answered with errors {a} and {b}"));
    }
    if devices < 1 {
        return Err("the CUDA driver sees no device".into());
    }
    // The library stays loaded for the process: the driver is not made to
    // be unloaded once initialised.
    std::mem::forget(lib);
    Ok(Driver {
        library,
        version,
        devices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probing_never_panics_and_explains_what_is_missing() {
        let p = probe();
        // Whatever this machine has, every part is a library or a reason.
        for line in p.summary() {
            assert!(line.contains(": "), "{line}");
        }
        match &p.driver {
            Ok(d) => assert!(d.devices >= 1 && d.version >= 11000, "{d:?}"),
            Err(why) => {
                assert!(!why.is_empty());
                assert_eq!(p.unavailable(&[]), Some(why.clone()), "the driver comes first");
            }
        }
        for (needs, found) in [
            (Needs::Nvrtc, &p.nvrtc),
            (Needs::Cublas, &p.cublas),
            (Needs::Cudnn, &p.cudnn),
        ] {
            if let (Ok(_), Err(why)) = (&p.driver, found) {
                assert_eq!(p.unavailable(&[needs]).as_ref(), Some(why));
            }
        }
        assert!(std::ptr::eq(p, probe()), "probed once");
    }

    #[test]
    fn a_missing_library_is_a_reason_naming_what_was_tried() {
        let e = find("cuWhatever", &["libswitchyard-no-such-lib.so.1"], b"x\0").unwrap_err();
        assert!(
            e.contains("cuWhatever not found (tried libswitchyard-no-such-lib.so.1; last error:"),
            "{e}"
        );
        // A library without the symbol is too old, and says which symbol.
        #[cfg(target_os = "linux")]
        {
            let e = find("libc", &["libc.so.6"], b"cublasCreate_v2\0").unwrap_err();
            assert!(e.contains("libc.so.6 lacks `cublasCreate_v2` (too old?)"), "{e}");
        }
    }
}
