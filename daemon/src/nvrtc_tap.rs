//! CUDA builds on Linux: this executable defines the NVRTC calls MLX compiles with, so libmlx's
//! references bind here first (the build exports them); each one calls NVRTC's own (the next
//! definition) and notes what a custom kernel's compile produced: its module name, its kernels'
//! mangled names and its code. When MLX destroys the program, the module is written where MLX
//! reads modules back ([`mlxcel_daemon::backend::cuda::kernel_modules`]), so the next start loads it instead
//! of compiling it again. A failure to note or write anything changes nothing of the compile.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Mutex, OnceLock};

use mlxcel_daemon::backend::cuda::kernel_modules;

type Program = *mut c_void;
type NvrtcResult = c_int;
const SUCCESS: NvrtcResult = 0;
/// `NVRTC_ERROR_INTERNAL_ERROR`: NVRTC itself is not there.
const MISSING: NvrtcResult = 11;

/// What one custom kernel's compile produced so far.
#[derive(Default)]
struct Compiled {
    module: String,
    kernels: Vec<(String, String)>,
    code: Vec<u8>,
}

fn compiles() -> &'static Mutex<HashMap<usize, Compiled>> {
    static COMPILES: OnceLock<Mutex<HashMap<usize, Compiled>>> = OnceLock::new();
    COMPILES.get_or_init(Default::default)
}

/// NVRTC's own definition of `name` (the next one after this executable's).
fn next(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlsym with a NUL-terminated name; a null result is None.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    (!f.is_null()).then_some(f)
}

macro_rules! nvrtc {
    ($name:literal, fn($($t:ty),* $(,)?)) => {{
        static F: OnceLock<Option<usize>> = OnceLock::new();
        // SAFETY: the symbol NVRTC exports under this name has this signature.
        F.get_or_init(|| next($name).map(|f| f as usize))
            .map(|f| unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> NvrtcResult>(f) })
    }};
}

fn with_compile(prog: Program, note: impl FnOnce(&mut Compiled)) {
    if let Ok(mut all) = compiles().lock() {
        if let Some(c) = all.get_mut(&(prog as usize)) {
            note(c);
        }
    }
}

/// # Safety
/// NVRTC's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcCreateProgram(
    prog: *mut Program,
    src: *const c_char,
    name: *const c_char,
    headers: c_int,
    sources: *const *const c_char,
    includes: *const *const c_char,
) -> NvrtcResult {
    let Some(f) = nvrtc!(
        c"nvrtcCreateProgram",
        fn(
            *mut Program,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        )
    ) else {
        return MISSING;
    };
    // SAFETY: forwarded as given.
    let r = unsafe { f(prog, src, name, headers, sources, includes) };
    if r == SUCCESS && !prog.is_null() && !name.is_null() {
        // SAFETY: NVRTC filled `prog`; `name` is the caller's C string.
        let (p, name) = unsafe { (*prog, CStr::from_ptr(name).to_string_lossy()) };
        if let (Some(module), Ok(mut all)) =
            (kernel_modules::custom_module(&name), compiles().lock())
        {
            all.insert(
                p as usize,
                Compiled {
                    module: module.to_string(),
                    ..Default::default()
                },
            );
        }
    }
    r
}

/// # Safety
/// NVRTC's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcGetLoweredName(
    prog: Program,
    expression: *const c_char,
    lowered: *mut *const c_char,
) -> NvrtcResult {
    let Some(f) = nvrtc!(
        c"nvrtcGetLoweredName",
        fn(Program, *const c_char, *mut *const c_char)
    ) else {
        return MISSING;
    };
    // SAFETY: forwarded as given.
    let r = unsafe { f(prog, expression, lowered) };
    if r == SUCCESS && !expression.is_null() && !lowered.is_null() {
        // SAFETY: NVRTC set `*lowered` to a C string the program owns; copied at once.
        let (e, l) = unsafe {
            let l = *lowered;
            if l.is_null() {
                return r;
            }
            (CStr::from_ptr(expression), CStr::from_ptr(l))
        };
        let pair = (
            e.to_string_lossy().into_owned(),
            l.to_string_lossy().into_owned(),
        );
        with_compile(prog, |c| c.kernels.push(pair));
    }
    r
}

type CodeFn = unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult;

/// A program's compiled code (PTX or cubin) into `out` by NVRTC's `get`, noted (`size` bytes by
/// NVRTC's `size`) for a custom kernel's module.
fn code_into(
    prog: Program,
    out: *mut c_char,
    get: Option<CodeFn>,
    size: Option<SizeFn>,
) -> NvrtcResult {
    let Some(get) = get else {
        return MISSING;
    };
    // SAFETY: forwarded as given.
    let r = unsafe { get(prog, out) };
    let mut n = 0usize;
    // SAFETY: NVRTC's size call on the caller's program; `out` holds the `n` bytes NVRTC wrote.
    if r == SUCCESS && !out.is_null() && size.is_some_and(|f| unsafe { f(prog, &mut n) } == SUCCESS)
    {
        let code = unsafe { std::slice::from_raw_parts(out.cast::<u8>(), n) }.to_vec();
        with_compile(prog, |c| c.code = code);
    }
    r
}

/// # Safety
/// NVRTC's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcGetCUBIN(prog: Program, cubin: *mut c_char) -> NvrtcResult {
    let get = nvrtc!(c"nvrtcGetCUBIN", fn(Program, *mut c_char));
    code_into(
        prog,
        cubin,
        get,
        nvrtc!(c"nvrtcGetCUBINSize", fn(Program, *mut usize)),
    )
}

/// # Safety
/// NVRTC's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcGetPTX(prog: Program, ptx: *mut c_char) -> NvrtcResult {
    let get = nvrtc!(c"nvrtcGetPTX", fn(Program, *mut c_char));
    code_into(
        prog,
        ptx,
        get,
        nvrtc!(c"nvrtcGetPTXSize", fn(Program, *mut usize)),
    )
}

/// # Safety
/// NVRTC's contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvrtcDestroyProgram(prog: *mut Program) -> NvrtcResult {
    let Some(f) = nvrtc!(c"nvrtcDestroyProgram", fn(*mut Program)) else {
        return MISSING;
    };
    if !prog.is_null() {
        // SAFETY: the caller's program handle.
        let p = unsafe { *prog } as usize;
        let done = compiles().lock().ok().and_then(|mut all| all.remove(&p));
        if let (Some(c), Some(dir)) = (done, kernel_modules::ptx_dir()) {
            match kernel_modules::save(&dir, &c.module, &c.kernels, &c.code) {
                Ok(true) => {
                    tracing::debug!(module = %c.module, bytes = c.code.len(), "custom kernel's module kept")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(module = %c.module, error = %e, "cannot keep a custom kernel's module")
                }
            }
        }
    }
    // SAFETY: forwarded as given.
    unsafe { f(prog) }
}
