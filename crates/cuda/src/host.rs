//! CUDA C compiled for the host, to check what a kernel computes on a
//! machine without a GPU (the fuser's generated kernels, the cuDNN
//! executor's attention kernel).
//!
//! A few definitions make the source plain C++ ([`for_host`]): a kernel
//! runs as one block at a time whose threads are host threads
//! (`threadIdx` and `blockIdx` per thread, shared memory a static shared by
//! them, `__syncthreads` a barrier), and the PTX conversions between f32 and
//! f16 become `_Float16` ones. [`cxx`] finds a C++ compiler that builds it
//! (`$CXX`, else `c++`); [`build`] compiles a source with a `main`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Definitions that make kernel source plain C++20.
pub const SHIM: &str = r#"#include <math.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <barrier>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(n)
struct SyDim { unsigned int x, y, z; };
static SyDim blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
static thread_local SyDim threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0};
static std::barrier<> *sy_barrier;
static inline void __syncthreads() { sy_barrier->arrive_and_wait(); }
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline double __longlong_as_double(long long u) { double f; memcpy(&f, &u, 8); return f; }
"#;

/// The source made host C++: the two PTX conversions replaced; an error
/// names any other inline PTX, which has no host stand-in.
pub fn for_host(source: &str) -> Result<String, String> {
    let source = source
        .replace(
            r#"asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));"#,
            "_Float16 x; memcpy(&x, &h, 2); f = (float)x;",
        )
        .replace(
            r#"asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));"#,
            "_Float16 x = (_Float16)f; memcpy(&h, &x, 2);",
        );
    if let Some(at) = source.find("asm(") {
        let line = source[at..].lines().next().unwrap_or_default();
        return Err(format!("no host stand-in for the PTX in `{line}`"));
    }
    Ok(format!("{SHIM}{source}"))
}

/// A C++ compiler that builds what the check needs (C++20 barriers and
/// `_Float16`), or why there is none.
pub fn cxx() -> Result<String, String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let dir = std::env::temp_dir().join(format!("switchyard-host-check-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("probe.cpp");
    std::fs::write(
        &src,
        "#include <barrier>\n#include <thread>\nint main() { std::barrier<> b(1); b.arrive_and_wait(); \
         _Float16 h = (_Float16)1.5f; return (float)h == 1.5f ? 0 : 1; }\n",
    )
    .map_err(|e| e.to_string())?;
    let built = Command::new(&cxx)
        .args(["-std=c++20", "-pthread", "-o"])
        .arg(dir.join("probe"))
        .arg(&src)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    match built {
        Ok(out) if out.status.success() => Ok(cxx),
        Ok(_) => Err(format!("{cxx} cannot build C++20 barriers and _Float16")),
        Err(e) => Err(format!("no C++ compiler ({cxx}: {e})")),
    }
}

/// Compiles `source` (CUDA C made host C++ with a `main`) with `cxx` into
/// an executable in `dir`, which it returns.
pub fn build(cxx: &str, source: &str, dir: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let src = dir.join("kernel.cpp");
    let exe = dir.join("kernel");
    std::fs::write(&src, source).map_err(|e| e.to_string())?;
    let out = Command::new(cxx)
        .args(["-std=c++20", "-pthread", "-O1", "-w", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{cxx} failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(exe)
}
