//! NVRTC, loaded at run time with `dlopen`, in the CUDA major version the driver runs.
//!
//! A cubin (or PTX) from NVRTC 13 is refused by a CUDA 12 driver (550-575, what most 3090 and
//! 4090 boxes run), so NVRTC is picked by the driver's version: `libnvrtc.so.13` under a CUDA
//! 13 driver, else `libnvrtc.so.12` (any CUDA 12.x driver runs what NVRTC 12.y makes for its
//! GPU's `sm_XY`, y > x included, by the minor version compatibility of cubins). moxie binds
//! the dozen NVRTC functions it calls itself, so which library gets loaded is decided here
//! and not by a binding built for one major version.
//!
//! Order: `$MOXIE_NVRTC` (a path; only that), else for each usable major, newest first: the
//! library by soname through the loader's path (LD_LIBRARY_PATH, ldconfig), then in the CUDA
//! toolkits of [`search_dirs`]; last an unversioned `libnvrtc.so` of a usable version.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The CUDA majors moxie's kernels are built and tested with, newest first.
pub(super) const MAJORS: [u32; 2] = [13, 12];

/// `nvrtcResult` values moxie tells apart.
pub(super) const NVRTC_SUCCESS: c_int = 0;
pub(super) const NVRTC_ERROR_INVALID_OPTION: c_int = 5;

type Program = *mut c_void;

type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type IntsFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> c_int;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type BytesFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;

/// The NVRTC functions moxie calls (signatures as in `nvrtc.h`, unchanged since CUDA 11.1).
struct Fns {
    get_error_string: ErrorStringFn,
    version: VersionFn,
    get_num_supported_archs: IntsFn,
    get_supported_archs: IntsFn,
    create_program: CreateFn,
    destroy_program: DestroyFn,
    compile_program: CompileFn,
    get_program_log_size: SizeFn,
    get_program_log: BytesFn,
    get_ptx_size: SizeFn,
    get_ptx: BytesFn,
    get_cubin_size: SizeFn,
    get_cubin: BytesFn,
}

/// A loaded NVRTC library (never unloaded).
pub(super) struct Nvrtc {
    /// What was loaded: a path, or the soname the loader found.
    pub(super) library: String,
    /// Its version (major, minor).
    pub(super) version: (u32, u32),
    fns: Fns,
}

/// A failed NVRTC call: its `nvrtcResult` and NVRTC's text for it.
pub(super) struct CallError {
    pub(super) code: c_int,
    pub(super) text: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (nvrtcResult {})", self.text, self.code)
    }
}

/// What NVRTC is asked for: PTX or a cubin.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Output {
    Ptx,
    Cubin,
}

impl Nvrtc {
    fn check(&self, what: &str, code: c_int) -> Result<(), CallError> {
        if code == NVRTC_SUCCESS {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString takes any result code and returns a static C string
        // (or null for codes it does not know).
        let text = unsafe { (self.fns.get_error_string)(code) };
        let text = if text.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-null: a NUL-terminated static string owned by NVRTC.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Err(CallError {
            code,
            text: format!("{what}: {text}"),
        })
    }

    /// The architectures this NVRTC compiles for (`90` for sm_90); empty if it cannot say.
    pub(super) fn supported_archs(&self) -> Vec<i32> {
        let mut n: c_int = 0;
        // SAFETY: writes one int through a pointer to a live local.
        if unsafe { (self.fns.get_num_supported_archs)(&mut n) } != NVRTC_SUCCESS || n <= 0 {
            return Vec::new();
        }
        let mut archs = vec![0 as c_int; n as usize];
        // SAFETY: NVRTC writes exactly `n` ints (the count it just returned) into `n` slots.
        if unsafe { (self.fns.get_supported_archs)(archs.as_mut_ptr()) } != NVRTC_SUCCESS {
            return Vec::new();
        }
        archs
    }

    /// Compile `source` (program `name`) with `options`; returns the code (PTX without its
    /// NUL, or cubin bytes) and NVRTC's log, or the failed call with the log.
    pub(super) fn compile(
        &self,
        source: &CStr,
        name: &CStr,
        options: &[String],
        output: Output,
    ) -> Result<(Vec<u8>, String), (CallError, String)> {
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: `prog` is a live local NVRTC writes the handle to; `source` and `name` are
        // NUL-terminated and outlive the program (it is destroyed before they drop); no
        // headers.
        let created = unsafe {
            (self.fns.create_program)(
                &mut prog,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        self.check("nvrtcCreateProgram", created)
            .map_err(|e| (e, String::new()))?;
        // Destroys the program on every way out.
        struct Owned<'a>(&'a Nvrtc, Program);
        impl Drop for Owned<'_> {
            fn drop(&mut self) {
                // SAFETY: the program was created above and is destroyed only here.
                unsafe { (self.0.fns.destroy_program)(&mut self.1) };
            }
        }
        let prog = Owned(self, prog);
        let c_options: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()).expect("no NUL in NVRTC options"))
            .collect();
        let ptrs: Vec<*const c_char> = c_options.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `prog.1` is live; `ptrs` holds `ptrs.len()` NUL-terminated strings that
        // live through the call.
        let compiled =
            unsafe { (self.fns.compile_program)(prog.1, ptrs.len() as c_int, ptrs.as_ptr()) };
        let log = self.read(
            prog.1,
            self.fns.get_program_log_size,
            self.fns.get_program_log,
        );
        let log = log
            .map(|b| {
                String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap_or(&[]))
                    .trim()
                    .to_string()
            })
            .unwrap_or_default();
        if let Err(e) = self.check("nvrtcCompileProgram", compiled) {
            return Err((e, log));
        }
        let code = match output {
            Output::Ptx => {
                let mut ptx = self
                    .read(prog.1, self.fns.get_ptx_size, self.fns.get_ptx)
                    .map_err(|e| (e, log.clone()))?;
                let end = ptx.iter().position(|&c| c == 0).unwrap_or(ptx.len());
                ptx.truncate(end);
                ptx
            }
            Output::Cubin => self
                .read(prog.1, self.fns.get_cubin_size, self.fns.get_cubin)
                .map_err(|e| (e, log.clone()))?,
        };
        Ok((code, log))
    }

    /// One of NVRTC's size-then-bytes outputs of a compiled program.
    fn read(&self, prog: Program, size: SizeFn, get: BytesFn) -> Result<Vec<u8>, CallError> {
        let mut n = 0usize;
        // SAFETY: `prog` is a live program; NVRTC writes the size to a live local.
        self.check("nvrtc size query", unsafe { size(prog, &mut n) })?;
        let mut out = vec![0u8; n];
        if n > 0 {
            // SAFETY: the buffer holds exactly the `n` bytes NVRTC reported.
            self.check("nvrtc output", unsafe {
                get(prog, out.as_mut_ptr().cast())
            })?;
        }
        Ok(out)
    }
}

/// The NVRTC to use, loaded once per process (a failure is not remembered, so a later call
/// can find a library that has appeared since). `driver_major`: the CUDA major the driver
/// runs, `None` where there is no driver (compiling only).
pub(super) fn get(driver_major: Option<u32>) -> Result<&'static Nvrtc, String> {
    static LOADED: Mutex<Option<&'static Nvrtc>> = Mutex::new(None);
    let mut held = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = *held {
        return Ok(n);
    }
    let explicit = std::env::var_os("MOXIE_NVRTC").filter(|v| !v.is_empty());
    let mut tried = Vec::new();
    for candidate in candidates(explicit.as_deref().map(Path::new), driver_major) {
        match load(&candidate, driver_major) {
            Ok(n) => {
                let n: &'static Nvrtc = Box::leak(Box::new(n));
                *held = Some(n);
                return Ok(n);
            }
            Err(why) => tried.push(why),
        }
    }
    Err(not_found(explicit.is_some(), driver_major, &tried))
}

/// Where NVRTC may be, in the order it is tried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Candidate {
    /// A soname or file name for `dlopen`'s own search.
    ByName(String),
    /// A file.
    Path(PathBuf),
}

impl std::fmt::Display for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Candidate::ByName(n) => write!(f, "{n} (loader path)"),
            Candidate::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// The CUDA majors whose NVRTC a driver of `driver_major` runs the output of, newest first.
pub(super) fn usable_majors(driver_major: Option<u32>) -> Vec<u32> {
    MAJORS
        .iter()
        .copied()
        .filter(|&m| driver_major.is_none_or(|d| m <= d))
        .collect()
}

/// The candidates, in order: `explicit` alone when given; else per usable major the soname,
/// then that file in each of [`search_dirs`]; then the unversioned name (its version is
/// checked once loaded).
pub(super) fn candidates(explicit: Option<&Path>, driver_major: Option<u32>) -> Vec<Candidate> {
    if let Some(p) = explicit {
        return vec![Candidate::Path(p.to_path_buf())];
    }
    let dirs = search_dirs();
    let mut out = Vec::new();
    for major in usable_majors(driver_major) {
        let soname = format!("libnvrtc.so.{major}");
        out.push(Candidate::ByName(soname.clone()));
        out.extend(
            dirs.iter()
                .map(|d| d.join(&soname))
                .filter(|p| p.is_file())
                .map(Candidate::Path),
        );
    }
    out.push(Candidate::ByName("libnvrtc.so".to_string()));
    out
}

/// Where NVRTC is looked for when the loader cannot find it by name: `lib64`, `lib` and
/// `targets/x86_64-linux/lib` under `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`, the
/// `/usr/local/cuda-13.*` and `cuda-12.*` toolkits (newest first) and `/opt/cuda`.
pub(super) fn search_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|k| std::env::var_os(k).filter(|v| !v.is_empty()))
        .map(PathBuf::from)
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    let mut versioned: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/local")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let version = name.strip_prefix("cuda-")?;
                    let parts: Option<Vec<u32>> =
                        version.split('.').map(|p| p.parse().ok()).collect();
                    Some((parts?, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    // Newest first, by number (cuda-12.10 after cuda-12.9).
    versioned.sort();
    roots.extend(versioned.into_iter().rev().map(|(_, p)| p));
    roots.push(PathBuf::from("/opt/cuda"));
    roots
        .iter()
        .flat_map(|r| {
            ["lib64", "lib", "targets/x86_64-linux/lib"]
                .iter()
                .map(move |l| r.join(l))
        })
        .collect()
}

/// `dlopen` with RTLD_NOW | RTLD_GLOBAL; the handle, or dlerror's text.
fn dlopen(name: &[u8]) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| "a NUL byte in the name".to_string())?;
    // SAFETY: a NUL-terminated name of a shared library meant to be loaded into a process.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns the thread's last dl error as a C string, or null.
        let e = unsafe { libc::dlerror() };
        return Err(if e.is_null() {
            "dlopen failed".to_string()
        } else {
            // SAFETY: non-null: a NUL-terminated string owned by libc, read before the next dl
            // call.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        });
    }
    Ok(handle)
}

/// Load one candidate and check its version against the driver's.
fn load(candidate: &Candidate, driver_major: Option<u32>) -> Result<Nvrtc, String> {
    let library = candidate.to_string();
    let name: Vec<u8> = match candidate {
        Candidate::ByName(n) => n.as_bytes().to_vec(),
        Candidate::Path(p) => {
            if !p.is_file() {
                return Err(format!("{library}: no such file"));
            }
            // NVRTC opens its builtins (`libnvrtc-builtins.so.M.N`) by name when it compiles;
            // loaded first from the same directory, they are found by soname.
            if let Some(dir) = p.parent() {
                preload_builtins(dir);
            }
            p.as_os_str().as_encoded_bytes().to_vec()
        }
    };
    let handle = dlopen(&name).map_err(|e| format!("{library}: {e}"))?;
    let close = |why: String| {
        // SAFETY: `handle` came from dlopen above and nothing of it is in use.
        unsafe { libc::dlclose(handle) };
        why
    };
    let fns = match resolve(handle) {
        Ok(f) => f,
        Err(missing) => {
            return Err(close(format!(
                "{library}: not NVRTC, or too old a one (no {missing})"
            )))
        }
    };
    let (mut ma, mut mi) = (0 as c_int, 0 as c_int);
    // SAFETY: nvrtcVersion writes two ints through pointers to live locals.
    if unsafe { (fns.version)(&mut ma, &mut mi) } != NVRTC_SUCCESS {
        return Err(close(format!("{library}: nvrtcVersion failed")));
    }
    let version = (ma as u32, mi as u32);
    if let Some(d) = driver_major {
        if version.0 > d {
            return Err(close(format!(
                "{library}: NVRTC {ma}.{mi}, newer than the driver's CUDA {d}"
            )));
        }
    }
    if version.0 < *MAJORS.last().unwrap() {
        return Err(close(format!(
            "{library}: NVRTC {ma}.{mi}, older than CUDA {}",
            MAJORS.last().unwrap()
        )));
    }
    Ok(Nvrtc {
        library,
        version,
        fns,
    })
}

fn preload_builtins(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        if name.to_string_lossy().starts_with("libnvrtc-builtins.so.") {
            // A failure shows later as NVRTC's own error, naming the builtins.
            let _ = dlopen(e.path().as_os_str().as_encoded_bytes());
        }
    }
}

/// Look the functions up; the name of the first one missing otherwise.
fn resolve(handle: *mut c_void) -> Result<Fns, &'static str> {
    macro_rules! sym {
        ($name:literal, $ty:ty) => {{
            // SAFETY: `handle` is a live dlopen handle and the name is NUL-terminated.
            let p = unsafe { libc::dlsym(handle, concat!($name, "\0").as_ptr().cast()) };
            if p.is_null() {
                return Err($name);
            }
            // SAFETY: the symbol is the NVRTC function of that name, whose C signature is the
            // field's type (nvrtc.h); a function pointer has the size of a data pointer here.
            unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
        }};
    }
    Ok(Fns {
        get_error_string: sym!("nvrtcGetErrorString", ErrorStringFn),
        version: sym!("nvrtcVersion", VersionFn),
        get_num_supported_archs: sym!("nvrtcGetNumSupportedArchs", IntsFn),
        get_supported_archs: sym!("nvrtcGetSupportedArchs", IntsFn),
        create_program: sym!("nvrtcCreateProgram", CreateFn),
        destroy_program: sym!("nvrtcDestroyProgram", DestroyFn),
        compile_program: sym!("nvrtcCompileProgram", CompileFn),
        get_program_log_size: sym!("nvrtcGetProgramLogSize", SizeFn),
        get_program_log: sym!("nvrtcGetProgramLog", BytesFn),
        get_ptx_size: sym!("nvrtcGetPTXSize", SizeFn),
        get_ptx: sym!("nvrtcGetPTX", BytesFn),
        get_cubin_size: sym!("nvrtcGetCUBINSize", SizeFn),
        get_cubin: sym!("nvrtcGetCUBIN", BytesFn),
    })
}

/// The error when no NVRTC could be used: what was tried and what to install.
fn not_found(explicit: bool, driver_major: Option<u32>, tried: &[String]) -> String {
    let want = match driver_major {
        Some(d) if d >= 13 => "CUDA 13 (or 12)".to_string(),
        Some(12) => {
            "CUDA 12 (the driver runs CUDA 12; NVRTC 13's output would be refused)".to_string()
        }
        Some(d) => format!("CUDA 12 or 13 (the driver runs CUDA {d}: update the driver)"),
        None => "CUDA 12 or 13".to_string(),
    };
    let mut msg = if explicit {
        "NVRTC could not be loaded from $MOXIE_NVRTC".to_string()
    } else {
        format!(
            "NVRTC could not be loaded: none of libnvrtc.so.{{{}}} on the loader's path nor in a \
             CUDA toolkit under $CUDA_HOME, $CUDA_PATH, /usr/local/cuda*, /opt/cuda",
            usable_majors(driver_major)
                .iter()
                .map(|m| m.to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    msg.push_str(&format!(
        ". Install NVRTC for {want}: the toolkit's, or `pip install nvidia-cuda-nvrtc-cu12` \
         (`nvidia-cuda-nvrtc==13.*` for CUDA 13); then put its lib directory on \
         LD_LIBRARY_PATH, set CUDA_HOME, or name the library in MOXIE_NVRTC."
    ));
    let shown: Vec<&String> = tried
        .iter()
        .filter(|t| !t.contains("cannot open"))
        .collect();
    if !shown.is_empty() {
        msg.push_str(" Tried: ");
        msg.push_str(
            &shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        );
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majors_follow_the_driver() {
        assert_eq!(usable_majors(None), [13, 12]);
        assert_eq!(usable_majors(Some(13)), [13, 12]);
        assert_eq!(usable_majors(Some(14)), [13, 12]);
        assert_eq!(usable_majors(Some(12)), [12]);
        assert!(usable_majors(Some(11)).is_empty());
    }

    #[test]
    fn a_cuda_12_driver_never_tries_nvrtc_13() {
        let c = candidates(None, Some(12));
        assert_eq!(c[0], Candidate::ByName("libnvrtc.so.12".into()));
        assert_eq!(c.last(), Some(&Candidate::ByName("libnvrtc.so".into())));
        assert!(!c.iter().any(|c| c.to_string().contains(".so.13")), "{c:?}");
        let c = candidates(None, Some(13));
        let first12 = c.iter().position(|c| c.to_string().contains(".so.12"));
        let last13 = c.iter().rposition(|c| c.to_string().contains(".so.13"));
        assert!(last13 < first12, "{c:?}");
    }

    #[test]
    fn an_explicit_library_is_the_only_candidate() {
        let p = Path::new("/opt/x/libnvrtc.so.12");
        assert_eq!(
            candidates(Some(p), Some(13)),
            [Candidate::Path(p.to_path_buf())]
        );
    }

    #[test]
    fn a_missing_or_foreign_library_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("moxie-nvrtc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("libnvrtc.so.12");
        std::fs::write(&fake, b"not an ELF file").unwrap();
        for (path, says) in [
            (dir.join("absent.so"), "no such file"),
            (fake.clone(), "libnvrtc.so.12"),
        ] {
            let e = load(&Candidate::Path(path.clone()), Some(12))
                .err()
                .expect("not loadable");
            assert!(
                e.contains(&path.display().to_string()) && e.contains(says),
                "{e}"
            );
        }
        // A library that is not NVRTC: loaded, then refused naming the missing function.
        let e = load(&Candidate::ByName("libc.so.6".into()), Some(12))
            .err()
            .expect("libc is not NVRTC");
        assert!(e.contains("nvrtcGetErrorString"), "{e}");
        let msg = not_found(false, Some(12), &[e]);
        assert!(
            msg.contains("libnvrtc.so.{12}") && msg.contains("CUDA 12"),
            "{msg}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
