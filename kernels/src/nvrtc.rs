//! NVRTC, loaded at run time through cudarc: probe, compile (with in-memory headers, since no
//! CUDA toolkit is installed to include from), cache.
//!
//! cudarc's `nvrtc::sys` resolves each symbol on first use and panics when libnvrtc or the
//! symbol is missing, so [`probe`] runs first and everything here goes through it.

#[cfg(feature = "cuda")]
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;
#[cfg(feature = "cuda")]
use std::sync::OnceLock;

#[cfg(feature = "cuda")]
use cudarc::nvrtc::{result, sys};

use crate::cache::{self, Fnv64};
use crate::KernelError;

/// Every NVRTC symbol this crate calls, directly or through cudarc's result layer.
pub const REQUIRED_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcDestroyProgram",
];

/// Loads libnvrtc (cudarc's candidate names: `libnvrtc.so`, `libnvrtc.so.13`, ... found through
/// the loader's search path, `LD_LIBRARY_PATH` included) and checks it is complete. Returns its
/// version, e.g. `(13, 0)`. The answer is computed once per process. A build without the `cuda`
/// feature answers [`KernelError::NotBuilt`].
#[cfg(not(feature = "cuda"))]
pub fn probe() -> Result<(i32, i32), KernelError> {
    Err(KernelError::not_built())
}

/// Loads libnvrtc (cudarc's candidate names: `libnvrtc.so`, `libnvrtc.so.13`, ... found through
/// the loader's search path, `LD_LIBRARY_PATH` included) and checks it is complete. Returns its
/// version, e.g. `(13, 0)`. The answer is computed once per process.
#[cfg(feature = "cuda")]
pub fn probe() -> Result<(i32, i32), KernelError> {
    static PROBE: OnceLock<Result<(i32, i32), String>> = OnceLock::new();
    PROBE
        .get_or_init(probe_once)
        .clone()
        .map_err(KernelError::unavailable)
}

#[cfg(feature = "cuda")]
fn probe_once() -> Result<(i32, i32), String> {
    // SAFETY: only tries to dlopen cudarc's candidate names for libnvrtc.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "libnvrtc could not be loaded (tried libnvrtc.so, libnvrtc.so.13 and the other \
             names cudarc knows): install the CUDA NVRTC runtime or put it on LD_LIBRARY_PATH"
                .into(),
        );
    }
    // SAFETY: is_culib_present just loaded one of the same names, in the same order, so culib()
    // finds a library instead of panicking.
    let lib = unsafe { sys::culib() };
    let missing: Vec<&str> = REQUIRED_SYMBOLS
        .iter()
        .copied()
        // SAFETY: looking a symbol up runs no code; the pointer is not used.
        .filter(|name| unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(format!("libnvrtc lacks {}", missing.join(", ")));
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: the symbol is present (checked above); writes two ints.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| format!("nvrtcVersion failed: {:?}", e.0))?;
    Ok((major, minor))
}

/// How to compile: the target virtual architecture and any further NVRTC options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompileOptions {
    /// `--gpu-architecture`, e.g. `compute_90`; `None` leaves NVRTC's default.
    pub arch: Option<String>,
    /// Further options, passed as they are (e.g. `-lineinfo`).
    pub extra: Vec<String>,
}

impl CompileOptions {
    /// PTX for a device of this compute capability (the driver JIT-compiles it on load).
    pub fn for_compute_capability(major: i32, minor: i32) -> Self {
        CompileOptions {
            arch: Some(format!("compute_{major}{minor}")),
            extra: Vec::new(),
        }
    }

    /// The option strings NVRTC receives.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec!["--std=c++17".to_string()];
        if let Some(arch) = &self.arch {
            args.push(format!("--gpu-architecture={arch}"));
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// A header NVRTC may `#include` by `name` (there is no toolkit on disk to include from).
#[derive(Clone, Copy, Debug)]
pub struct Header<'a> {
    /// The name `#include "..."` uses.
    pub name: &'a str,
    /// Its text.
    pub source: &'a str,
}

/// Where a [`Ptx`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtxOrigin {
    /// NVRTC compiled it in this call.
    Compiled,
    /// An earlier compilation in this process.
    Memory,
    /// The disk cache.
    Disk,
}

/// Compiled PTX text.
#[derive(Clone, Debug)]
pub struct Ptx {
    text: Arc<str>,
    origin: PtxOrigin,
}

impl Ptx {
    /// The PTX assembly.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Where it came from.
    pub fn origin(&self) -> PtxOrigin {
        self.origin
    }

    /// The kernels it defines (`.entry` names), in order.
    pub fn entry_points(&self) -> Vec<&str> {
        self.text
            .lines()
            .filter_map(|l| {
                let rest = l.trim_start();
                let rest = rest.strip_prefix(".visible ").unwrap_or(rest);
                let rest = rest.strip_prefix(".entry ")?;
                let end = rest
                    .find(|c: char| c == '(' || c.is_whitespace())
                    .unwrap_or(rest.len());
                Some(&rest[..end])
            })
            .collect()
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn to_cudarc(&self) -> cudarc::nvrtc::Ptx {
        cudarc::nvrtc::Ptx::from_src(self.text.to_string())
    }
}

/// Never reached without the `cuda` feature: [`probe`] refuses first.
#[cfg(not(feature = "cuda"))]
fn compile_uncached(
    _name: &str,
    _src: &str,
    _headers: &[Header<'_>],
    _args: &[String],
) -> Result<String, KernelError> {
    Err(KernelError::not_built())
}

/// Compiles `src` (named `name` in diagnostics) with NVRTC, or returns the PTX an earlier
/// compilation of the same program, headers, options and NVRTC version left in this process or
/// in the disk cache.
pub fn compile(
    name: &str,
    src: &str,
    headers: &[Header<'_>],
    opts: &CompileOptions,
) -> Result<Ptx, KernelError> {
    let (major, minor) = probe()?;
    let args = opts.args();
    let mut key = Fnv64::new()
        .field(b"xfabric-kernels ptx v1")
        .field(&major.to_le_bytes())
        .field(&minor.to_le_bytes())
        .field(src.as_bytes());
    for h in headers {
        key = key.field(h.name.as_bytes()).field(h.source.as_bytes());
    }
    for a in &args {
        key = key.field(a.as_bytes());
    }
    let key = key.finish();

    if let Some(text) = cache::memory_get(key) {
        return Ok(Ptx {
            text,
            origin: PtxOrigin::Memory,
        });
    }
    if let Some(text) = cache::disk_get(key) {
        cache::memory_put(key, text.clone());
        return Ok(Ptx {
            text,
            origin: PtxOrigin::Disk,
        });
    }
    let text: Arc<str> = Arc::from(compile_uncached(name, src, headers, &args)?);
    cache::memory_put(key, text.clone());
    cache::disk_put(key, &text);
    Ok(Ptx {
        text,
        origin: PtxOrigin::Compiled,
    })
}

#[cfg(feature = "cuda")]
fn cstring(what: &'static str, s: &str) -> Result<CString, KernelError> {
    CString::new(s)
        .map_err(|_| KernelError::inval("compile", format!("{what} contains a NUL byte")))
}

#[cfg(feature = "cuda")]
fn nvrtc_err(op: &'static str) -> impl FnOnce(result::NvrtcError) -> KernelError {
    move |e| KernelError::Nvrtc {
        op,
        name: format!("{:?}", e.0),
    }
}

#[cfg(feature = "cuda")]
fn text_of(chars: Vec<c_char>) -> String {
    let bytes: Vec<u8> = chars
        .into_iter()
        .map(|c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// One NVRTC program, destroyed on every path out.
#[cfg(feature = "cuda")]
struct Program(sys::nvrtcProgram);

#[cfg(feature = "cuda")]
impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed only here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

#[cfg(feature = "cuda")]
fn compile_uncached(
    name: &str,
    src: &str,
    headers: &[Header<'_>],
    args: &[String],
) -> Result<String, KernelError> {
    let c_src = cstring("the program", src)?;
    let c_name = cstring("the program name", name)?;
    let c_hdr_src = headers
        .iter()
        .map(|h| cstring("a header", h.source))
        .collect::<Result<Vec<_>, _>>()?;
    let c_hdr_names = headers
        .iter()
        .map(|h| cstring("a header name", h.name))
        .collect::<Result<Vec<_>, _>>()?;
    // cudarc's compile_program unwraps CString::new on each option: refuse NULs here instead.
    for a in args {
        cstring("an option", a)?;
    }
    let hdr_src: Vec<*const c_char> = c_hdr_src.iter().map(|c| c.as_ptr()).collect();
    let hdr_names: Vec<*const c_char> = c_hdr_names.iter().map(|c| c.as_ptr()).collect();

    let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is a live C string (or array of them) for the duration of the call;
    // NVRTC copies what it keeps. cudarc's create_program takes no headers, hence the sys call.
    unsafe {
        sys::nvrtcCreateProgram(
            &mut raw,
            c_src.as_ptr(),
            c_name.as_ptr(),
            headers.len() as c_int,
            if headers.is_empty() {
                std::ptr::null()
            } else {
                hdr_src.as_ptr()
            },
            if headers.is_empty() {
                std::ptr::null()
            } else {
                hdr_names.as_ptr()
            },
        )
    }
    .result()
    .map_err(nvrtc_err("nvrtcCreateProgram"))?;
    let prog = Program(raw);

    // SAFETY: `prog` is a live program.
    let compiled = unsafe { result::compile_program(prog.0, args) };
    if let Err(e) = compiled {
        // SAFETY: as above; the log exists after a failed compilation.
        let log = unsafe { result::get_program_log(prog.0) }
            .map(text_of)
            .unwrap_or_else(|le| format!("({:?}; the log could not be read: {:?})", e.0, le.0));
        return Err(KernelError::Compile {
            program: name.to_string(),
            options: args.to_vec(),
            log: if log.trim().is_empty() {
                format!("{:?}", e.0)
            } else {
                log
            },
        });
    }
    // SAFETY: as above, after a successful compilation.
    let ptx = unsafe { result::get_ptx(prog.0) }.map_err(nvrtc_err("nvrtcGetPTX"))?;
    Ok(text_of(ptx))
}
