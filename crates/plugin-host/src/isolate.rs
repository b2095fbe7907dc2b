//! Plugins in a process of their own: a crash, abort, `exit`, stack
//! overflow or endless loop in a plugin becomes an error naming the plugin
//! and the hook, never the end of the host.
//!
//! The host starts a worker (this switchyard's own executable, run as
//! `switchyard plugin-worker PATH`, see [`set_worker_executable`]), which
//! loads the library in process as the host would ([`crate::Library`]) and
//! answers the host's calls, one at a time, over its stdin and stdout.
//! Each call is a frame: its length (u64, little-endian) and its bytes, a
//! tag and the call's arguments; tensors cross as their bytes. They are
//! copied through the pipe rather than shared in memory on purpose: a
//! mapping the plugin could shrink would bring back the SIGBUS isolation
//! exists to keep out. A call the worker does not answer within the
//! plugin's time limit kills it; a worker that died answers every later
//! call with the cause.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use switchyard_core::io::{le_bytes, storage_from_le_bytes};
use switchyard_core::{DType, OutputBuffer, Tensor};
use switchyard_plugin_abi as abi;

use crate::{Calls, Library};

/// The environment variable naming the executable that runs isolated
/// plugins (`switchyard`); it wins over [`set_worker_executable`].
pub const WORKER_ENV: &str = "SWITCHYARD_PLUGIN_WORKER";

/// The time a worker has to answer one call, unless the config gives one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest frame either side accepts (1 TiB): a length beyond it is
/// a broken worker, not data. Frames are read as their bytes arrive, so
/// a claimed length allocates nothing by itself.
const MAX_FRAME: u64 = 1 << 40;

/// Words every error of a plugin whose process is gone contains (a crash,
/// an exit, a kill after its time limit), for callers that stop asking it.
pub const GONE: &str = "its process";

static WORKER: OnceLock<PathBuf> = OnceLock::new();

/// Names the executable that runs isolated plugins: one that answers
/// `plugin-worker PATH` with [`worker_main`]. The `switchyard` command sets
/// itself; a program that embeds switchyard sets a `switchyard` it ships
/// (or `SWITCHYARD_PLUGIN_WORKER`). Only the first call counts.
pub fn set_worker_executable(path: PathBuf) {
    let _ = WORKER.set(path);
}

fn worker_executable() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(WORKER_ENV) {
        return Ok(PathBuf::from(p));
    }
    WORKER.get().cloned().ok_or_else(|| {
        format!(
            "cannot be isolated: no switchyard executable to run it in is known (set {WORKER_ENV} to one)"
        )
    })
}

mod tag {
    pub const INFO: u8 = 1;
    pub const AVAILABILITY: u8 = 2;
    pub const CHECK_OPTIONS: u8 = 3;
    pub const CLAIM: u8 = 4;
    pub const COST: u8 = 5;
    pub const REFINE: u8 = 6;
    pub const COMPILE: u8 = 7;
    pub const RUN: u8 = 8;
    pub const DROP_KERNEL: u8 = 9;
}

/// A frame being written.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn f64(mut self, v: f64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(self, b: &[u8]) -> Self {
        let mut w = self.u64(b.len() as u64);
        w.0.extend_from_slice(b);
        w
    }
    fn meta(mut self, dtype: DType, shape: &[usize]) -> Self {
        self = self.bytes(dtype.name().as_bytes()).u64(shape.len() as u64);
        for &d in shape {
            self = self.u64(d as u64);
        }
        self
    }
    fn opt(self, v: Option<(i32, Vec<u8>)>) -> Self {
        match v {
            None => self.u8(0),
            Some((s, b)) => self.u8(1).i32(s).bytes(&b),
        }
    }
}

/// A frame being read; every read is checked against its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err(format!("a frame ends {} bytes early", n - self.0.len()));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn f64(&mut self) -> Result<f64, String> {
        Ok(f64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u64()?;
        self.take(usize::try_from(n).map_err(|_| format!("a length of {n} bytes"))?)
    }
    fn text(&mut self) -> Result<String, String> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }
    fn meta(&mut self) -> Result<(DType, Vec<usize>), String> {
        let name = self.text()?;
        let dtype = DType::from_name(&name).ok_or_else(|| format!("an unknown dtype `{name}`"))?;
        let rank = self.u64()?;
        if rank > 64 {
            return Err(format!("a rank of {rank}"));
        }
        let shape = (0..rank)
            .map(|_| self.u64().map(|d| d as usize))
            .collect::<Result<Vec<_>, _>>()?;
        let bytes = shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
            .filter(|&b| b <= isize::MAX as usize);
        if bytes.is_none() {
            return Err(format!("a {dtype}{shape:?} tensor, too large to address"));
        }
        Ok((dtype, shape))
    }
    fn opt(&mut self) -> Result<Option<(i32, Vec<u8>)>, String> {
        Ok(match self.u8()? {
            0 => None,
            _ => Some((self.i32()?, self.bytes()?.to_vec())),
        })
    }
}

/// A tensor's bytes, checked against its dtype and shape.
fn tensor_of(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor, String> {
    let want = shape.iter().product::<usize>() * dtype.size();
    if bytes.len() != want {
        return Err(format!(
            "{} bytes for a {dtype}{shape:?} tensor of {want}",
            bytes.len()
        ));
    }
    Tensor::from_storage(storage_from_le_bytes(dtype, bytes), shape).map_err(|e| e.to_string())
}

fn write_frame(w: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(&(bytes.len() as u64).to_le_bytes())?;
    w.write_all(bytes)?;
    w.flush()
}

/// Reads one frame; `None` at the end of the stream.
fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 8];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("a frame of {len} bytes")));
    }
    let mut buf = Vec::new();
    r.take(len).read_to_end(&mut buf)?;
    if buf.len() as u64 != len {
        return Ok(None);
    }
    Ok(Some(buf))
}

/// Serves one plugin to the host that started this process: loads
/// `path`, then answers calls from stdin on stdout until stdin ends.
/// Returns the process's exit code. What the plugin prints to stdout goes
/// to stderr, so that it cannot garble the answers.
pub fn worker_main(path: &Path) -> i32 {
    // The answers go to the stdout this process was given; fd 1 becomes
    // a copy of stderr for whatever the plugin prints.
    // SAFETY: plain descriptor calls on descriptors this process owns.
    let answers_fd = unsafe { libc::dup(1) };
    // SAFETY: as above.
    if answers_fd < 0 || unsafe { libc::dup2(2, 1) } < 0 {
        eprintln!("plugin worker: cannot set up its descriptors");
        return 2;
    }
    // SAFETY: `answers_fd` was just made by `dup` and is owned here alone.
    let mut out = std::io::BufWriter::new(unsafe {
        <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(answers_fd)
    });
    let mut input = std::io::BufReader::new(std::io::stdin().lock());
    let lib = match Library::open(path) {
        Ok(lib) => lib,
        Err(message) => {
            let _ = write_frame(&mut out, &Writer::default().u8(0).bytes(message.as_bytes()).0);
            return 1;
        }
    };
    let mut hello = Writer::default().u8(1).u64(lib.hooks.table_size as u64);
    let missing: Vec<&str> = lib
        .hooks
        .optional()
        .into_iter()
        .filter(|&(_, present)| !present)
        .map(|(name, _)| name)
        .collect();
    hello = hello.bytes(missing.join(",").as_bytes());
    if write_frame(&mut out, &hello.0).is_err() {
        return 1;
    }
    loop {
        let frame = match read_frame(&mut input) {
            Ok(Some(f)) => f,
            _ => return 0,
        };
        let answer = match serve(&lib, &frame) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("plugin worker: a malformed call: {e}");
                return 2;
            }
        };
        if write_frame(&mut out, &answer).is_err() {
            return 0;
        }
    }
}

/// Answers one call.
fn serve(lib: &Library, frame: &[u8]) -> Result<Vec<u8>, String> {
    let mut r = Reader(frame);
    let w = Writer::default();
    Ok(match r.u8()? {
        tag::INFO => {
            let (s, b) = lib.info();
            w.i32(s).bytes(&b)
        }
        tag::AVAILABILITY => w.opt(lib.availability().map(|(s, m)| (s, m.into_bytes()))),
        tag::CHECK_OPTIONS => w.opt(lib.check_options(r.bytes()?).map(|(s, m)| (s, m.into_bytes()))),
        tag::CLAIM => {
            let (s, c, m) = lib.claim(r.bytes()?);
            w.i32(s).f64(c).bytes(m.as_bytes())
        }
        tag::COST => match lib.cost(r.bytes()?) {
            None => w.u8(0),
            Some((s, c, m)) => w.u8(1).i32(s).f64(c).bytes(m.as_bytes()),
        },
        tag::REFINE => w.opt(lib.refine(r.bytes()?)),
        tag::COMPILE => {
            let (s, k, m) = lib.compile(r.bytes()?);
            w.i32(s).u64(k).bytes(m.as_bytes())
        }
        tag::RUN => {
            let kernel = r.u64()?;
            let n = r.u64()?;
            let mut inputs = Vec::new();
            for _ in 0..n {
                let (dtype, shape) = r.meta()?;
                inputs.push(tensor_of(dtype, &shape, r.bytes()?)?);
            }
            let n = r.u64()?;
            let mut outputs = Vec::new();
            for _ in 0..n {
                let (dtype, shape) = r.meta()?;
                outputs.push(OutputBuffer::new(dtype, &shape).map_err(|e| e.to_string())?);
            }
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let (s, m) = lib.run(kernel, &refs, &mut outputs);
            let mut w = w.i32(s).bytes(m.as_bytes()).u64(outputs.len() as u64);
            for o in outputs {
                w = w.bytes(&le_bytes(&o.into_tensor()).map_err(|e| e.to_string())?);
            }
            w
        }
        tag::DROP_KERNEL => {
            lib.drop_kernel(r.u64()?);
            w
        }
        other => return Err(format!("an unknown call {other}")),
    }
    .0)
}

/// The host's end of a worker.
struct Conn {
    child: Child,
    stdin: ChildStdin,
    answers: Receiver<std::io::Result<Option<Vec<u8>>>>,
    /// Why the worker is gone, once it is.
    dead: Option<String>,
}

/// A plugin served by a worker process.
pub(crate) struct Worker {
    conn: Mutex<Conn>,
    timeout: Duration,
    /// The table size and the optional hooks the plugin lacks, as loaded.
    pub(crate) table_size: usize,
    pub(crate) missing: Vec<String>,
}

/// How a worker that stopped answering ended.
fn ended(child: &mut Child) -> String {
    match child.wait() {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(code), _) => format!("its process exited with status {code}"),
                (None, Some(sig)) => format!("its process was killed by signal {sig} ({})", signal_name(sig)),
                _ => format!("its process ended ({status})"),
            }
        }
        Err(e) => format!("its process could not be waited for: {e}"),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV, a segmentation fault",
        libc::SIGABRT => "SIGABRT, an abort",
        libc::SIGBUS => "SIGBUS, a bus error",
        libc::SIGILL => "SIGILL, an illegal instruction",
        libc::SIGFPE => "SIGFPE, an arithmetic fault",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

impl Worker {
    /// Starts a worker for the plugin at `path`, with `timeout` per call.
    pub(crate) fn start(path: &Path, timeout: Duration) -> Result<Worker, String> {
        let exe = worker_executable()?;
        let mut child = Command::new(&exe)
            .arg("plugin-worker")
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start its worker `{}`: {e}", exe.display()))?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
        let (tx, answers) = channel();
        std::thread::Builder::new()
            .name("switchyard-plugin-worker".into())
            .spawn(move || {
                loop {
                    let frame = read_frame(&mut stdout);
                    let last = !matches!(frame, Ok(Some(_)));
                    if tx.send(frame).is_err() || last {
                        return;
                    }
                }
            })
            .map_err(|e| format!("cannot start a thread to read its worker: {e}"))?;
        let mut conn = Conn {
            child,
            stdin,
            answers,
            dead: None,
        };
        let hello = Self::answer(&mut conn, "load", timeout)?;
        let mut r = Reader(&hello);
        if r.u8()? == 0 {
            let why = r.text()?;
            let _ = conn.child.wait();
            return Err(why);
        }
        let table_size = r.u64()? as usize;
        let missing = String::from_utf8_lossy(r.bytes()?)
            .split(',')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        Ok(Worker {
            conn: Mutex::new(conn),
            timeout,
            table_size,
            missing,
        })
    }

    /// Waits for the worker's next frame, up to `timeout`.
    fn answer(conn: &mut Conn, hook: &str, timeout: Duration) -> Result<Vec<u8>, String> {
        let why = match conn.answers.recv_timeout(timeout) {
            Ok(Ok(Some(frame))) => return Ok(frame),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Other => {
                let _ = conn.child.kill();
                format!(
                    "sent a malformed answer to `{hook}` ({e}); {}",
                    ended(&mut conn.child)
                )
            }
            Ok(_) | Err(RecvTimeoutError::Disconnected) => {
                format!("crashed in `{hook}`: {}", ended(&mut conn.child))
            }
            Err(RecvTimeoutError::Timeout) => {
                let _ = conn.child.kill();
                let _ = conn.child.wait();
                format!(
                    "did not answer `{hook}` within {} s, so its process was killed",
                    timeout.as_secs_f64()
                )
            }
        };
        conn.dead = Some(why.clone());
        Err(why)
    }

    /// Sends `frame` (a call of `hook`) and waits for the answer.
    fn call(&self, hook: &str, frame: &[u8]) -> Result<Vec<u8>, String> {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &conn.dead {
            return Err(format!("is not running ({GONE} is gone): it {why}"));
        }
        if write_frame(&mut conn.stdin, frame).is_err() {
            let why = format!("crashed before `{hook}`: {}", ended(&mut conn.child));
            conn.dead = Some(why.clone());
            return Err(why);
        }
        Self::answer(&mut conn, hook, self.timeout)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let conn = self.conn.get_mut().unwrap_or_else(|e| e.into_inner());
        if conn.dead.is_none() {
            // Nothing the worker holds needs flushing: it is killed rather
            // than trusted to end when its stdin closes.
            let _ = conn.child.kill();
        }
        let _ = conn.child.wait();
    }
}

/// A failed call as the hook's status and message.
fn failed(why: String) -> (i32, String) {
    (abi::status::ERROR, why)
}

impl Calls for Worker {
    fn gone(&self) -> Option<String> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).dead.clone()
    }

    fn info(&self) -> (i32, Vec<u8>) {
        let got = self.call("info", &[tag::INFO]).and_then(|a| {
            let mut r = Reader(&a);
            Ok((r.i32()?, r.bytes()?.to_vec()))
        });
        got.unwrap_or_else(|why| (abi::status::ERROR, why.into_bytes()))
    }

    fn availability(&self) -> Option<(i32, String)> {
        let got = self
            .call("availability", &[tag::AVAILABILITY])
            .and_then(|a| Reader(&a).opt());
        match got {
            Ok(v) => v.map(|(s, m)| (s, String::from_utf8_lossy(&m).into_owned())),
            Err(why) => Some(failed(why)),
        }
    }

    fn check_options(&self, json: &[u8]) -> Option<(i32, String)> {
        let frame = Writer::default().u8(tag::CHECK_OPTIONS).bytes(json).0;
        match self.call("check_options", &frame).and_then(|a| Reader(&a).opt()) {
            Ok(v) => v.map(|(s, m)| (s, String::from_utf8_lossy(&m).into_owned())),
            Err(why) => Some(failed(why)),
        }
    }

    fn claim(&self, request: &[u8]) -> (i32, f64, String) {
        let frame = Writer::default().u8(tag::CLAIM).bytes(request).0;
        let got = self.call("claim", &frame).and_then(|a| {
            let mut r = Reader(&a);
            Ok((r.i32()?, r.f64()?, r.text()?))
        });
        got.unwrap_or_else(|why| (abi::status::ERROR, f64::NAN, why))
    }

    fn cost(&self, request: &[u8]) -> Option<(i32, f64, String)> {
        let frame = Writer::default().u8(tag::COST).bytes(request).0;
        let got = self.call("cost", &frame).and_then(|a| {
            let mut r = Reader(&a);
            Ok(match r.u8()? {
                0 => None,
                _ => Some((r.i32()?, r.f64()?, r.text()?)),
            })
        });
        got.unwrap_or_else(|why| Some((abi::status::ERROR, f64::NAN, why)))
    }

    fn refine(&self, request: &[u8]) -> Option<(i32, Vec<u8>)> {
        let frame = Writer::default().u8(tag::REFINE).bytes(request).0;
        match self.call("refine", &frame).and_then(|a| Reader(&a).opt()) {
            Ok(v) => v,
            Err(why) => Some((abi::status::ERROR, why.into_bytes())),
        }
    }

    fn compile(&self, request: &[u8]) -> (i32, u64, String) {
        let frame = Writer::default().u8(tag::COMPILE).bytes(request).0;
        let got = self.call("compile", &frame).and_then(|a| {
            let mut r = Reader(&a);
            Ok((r.i32()?, r.u64()?, r.text()?))
        });
        got.unwrap_or_else(|why| (abi::status::ERROR, 0, why))
    }

    fn run(&self, kernel: u64, inputs: &[&Tensor], outputs: &mut [OutputBuffer]) -> (i32, String) {
        let mut w = Writer::default()
            .u8(tag::RUN)
            .u64(kernel)
            .u64(inputs.len() as u64);
        for t in inputs {
            let bytes = match le_bytes(t) {
                Ok(b) => b,
                Err(e) => return failed(format!("an input could not be sent: {e}")),
            };
            w = w.meta(t.dtype(), t.shape()).bytes(&bytes);
        }
        w = w.u64(outputs.len() as u64);
        for o in outputs.iter() {
            w = w.meta(o.dtype(), o.shape());
        }
        let got = self.call("run", &w.0).and_then(|a| {
            let mut r = Reader(&a);
            let (status, msg) = (r.i32()?, r.text()?);
            if status != abi::status::OK {
                return Ok((status, msg));
            }
            let n = r.u64()?;
            if n != outputs.len() as u64 {
                return Err(format!("answered `run` with {n} outputs for {}", outputs.len()));
            }
            for (k, o) in outputs.iter_mut().enumerate() {
                let bytes = r.bytes()?;
                let want = o.shape().iter().product::<usize>() * o.dtype().size();
                let Some(mut host) = o.data_mut() else {
                    return Err("an output buffer is not on the host".into());
                };
                if bytes.len() != want {
                    return Err(format!(
                        "answered `run` with {} bytes for output {k}, which holds {want}",
                        bytes.len()
                    ));
                }
                // SAFETY: the buffer holds `want` bytes, as many as copied.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), host.as_mut_ptr(), want) };
            }
            Ok((status, msg))
        });
        got.unwrap_or_else(failed)
    }

    fn drop_kernel(&self, kernel: u64) {
        let frame = Writer::default().u8(tag::DROP_KERNEL).u64(kernel).0;
        let _ = self.call("drop_kernel", &frame);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_and_short_ones_are_errors() {
        let w = Writer::default()
            .u8(7)
            .i32(-3)
            .f64(2.5)
            .bytes(b"abc")
            .meta(DType::F32, &[2, 3])
            .opt(Some((1, b"x".to_vec())))
            .opt(None);
        let mut r = Reader(&w.0);
        assert_eq!(r.u8(), Ok(7));
        assert_eq!(r.i32(), Ok(-3));
        assert_eq!(r.f64(), Ok(2.5));
        assert_eq!(r.bytes(), Ok(&b"abc"[..]));
        assert_eq!(r.meta(), Ok((DType::F32, vec![2, 3])));
        assert_eq!(r.opt(), Ok(Some((1, b"x".to_vec()))));
        assert_eq!(r.opt(), Ok(None));
        assert!(r.u8().unwrap_err().contains("ends 1 bytes early"));
        // A length beyond the frame, a huge shape, an unknown dtype.
        let w = Writer::default().u64(u64::MAX);
        assert!(Reader(&w.0).bytes().is_err());
        let w = Writer::default().meta(DType::F32, &[1 << 62, 1 << 62]);
        assert!(Reader(&w.0).meta().unwrap_err().contains("too large"));
        let w = Writer::default().bytes(b"f33").u64(0);
        assert!(Reader(&w.0).meta().unwrap_err().contains("unknown dtype"));
        // A tensor's bytes must fit its shape.
        assert!(tensor_of(DType::F32, &[3], &[0u8; 8]).is_err());
        assert_eq!(
            tensor_of(DType::F32, &[2], &[0, 0, 128, 63, 0, 0, 0, 64])
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            vec![1.0, 2.0]
        );
    }

    #[test]
    fn frames_cross_a_stream_and_a_claimed_length_allocates_nothing() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"hello").unwrap();
        write_frame(&mut buf, b"").unwrap();
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r).unwrap(), Some(b"hello".to_vec()));
        assert_eq!(read_frame(&mut r).unwrap(), Some(Vec::new()));
        assert_eq!(read_frame(&mut r).unwrap(), None);
        // A frame that claims 2^39 bytes and ends: no 512 GiB allocation.
        let mut buf = (1u64 << 39).to_le_bytes().to_vec();
        buf.extend_from_slice(b"short");
        assert_eq!(read_frame(&mut &buf[..]).unwrap(), None);
        let buf = u64::MAX.to_le_bytes();
        assert!(read_frame(&mut &buf[..]).is_err());
    }
}
