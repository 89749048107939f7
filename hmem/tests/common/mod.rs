//! Helpers shared by hmem's integration tests: compiling the C test doubles in
//! `tests/doubles/`, and running one test of this binary as a child process.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::Mutex;
use std::time::Duration;

/// Compiles `tests/doubles/<src>` with `cc -shared -fPIC <defines>` into
/// `$CARGO_TARGET_TMPDIR/doubles/<name>` once per process, and returns a fresh copy named
/// `<copy>`: each copy is a separate file, so `dlopen` gives each test its own instance of the
/// double (its own globals and counters) even when tests run in parallel threads.
pub fn double(src: &str, defines: &[&str], name: &str, copy: &str) -> PathBuf {
    static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("doubles");
    std::fs::create_dir_all(&dir).expect("create the doubles directory");
    let built = {
        let mut map = BUILT.lock().unwrap_or_else(|p| p.into_inner());
        let map = map.get_or_insert_with(HashMap::new);
        map.entry(name.to_string())
            .or_insert_with(|| {
                let src_path = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/doubles")
                    .join(src);
                let out = dir.join(name);
                let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
                let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
                let o = Command::new(&cc)
                    .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
                    .arg(&tmp)
                    .args(defines)
                    .arg(&src_path)
                    .arg("-lpthread")
                    .output()
                    .unwrap_or_else(|e| panic!("running {cc}: {e}"));
                assert!(
                    o.status.success(),
                    "{cc} failed on {}:\n{}",
                    src_path.display(),
                    String::from_utf8_lossy(&o.stderr)
                );
                std::fs::rename(&tmp, &out).expect("move the double into place");
                out
            })
            .clone()
    };
    let dst = dir.join(copy);
    std::fs::create_dir_all(dst.parent().expect("a file name"))
        .expect("create the copy's directory");
    let tmp = dst.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::copy(&built, &tmp).expect("copy the double");
    std::fs::rename(&tmp, &dst).expect("move the copy into place");
    dst
}

/// Counts the double's live objects through its `<symbol>` export (not a driver call).
pub fn live_objects(lib: &Path, symbol: &str) -> i32 {
    // SAFETY: the library is the test double, already loaded by the code under test; the
    // symbol is `int f(void)`.
    unsafe {
        let l = libloading::Library::new(lib).expect("reopen the double");
        let f = l
            .get::<unsafe extern "C" fn() -> i32>(symbol.as_bytes())
            .expect("the double's counter");
        f()
    }
}

/// How long a child may stay silent before the test gives up on it.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// A child process running one test of this binary, with stdin piped and stdout read line by
/// line on a thread (so a silent child fails the test instead of hanging it).
pub struct ChildTest {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Vec<String>,
}

/// Starts this test binary running only `test` (which must return at once unless
/// `XFABRIC_TEST_CHILD` is set), with `env` added.
pub fn spawn_child_test(test: &str, env: &[(&str, &str)]) -> ChildTest {
    let exe = std::env::current_exe().expect("current test binary");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("XFABRIC_TEST_CHILD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn the child test");
    let stdin = child.stdin.take().expect("child stdin");
    let stdout = BufReader::new(child.stdout.take().expect("child stdout"));
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    ChildTest {
        child,
        stdin: Some(stdin),
        lines,
        seen: Vec::new(),
    }
}

impl ChildTest {
    /// Reads lines until one contains `marker` (libtest may print `test name ... ` before it
    /// on the same line); returns what follows the marker.
    pub fn expect_line(&mut self, marker: &str) -> String {
        loop {
            match self.lines.recv_timeout(CHILD_TIMEOUT) {
                Ok(line) => {
                    if let Some(at) = line.find(marker) {
                        return line[at + marker.len()..].trim_end().to_string();
                    }
                    self.seen.push(line);
                }
                Err(e) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!(
                        "no {marker:?} from the child ({e}); it printed:\n{}",
                        self.seen.join("\n")
                    );
                }
            }
        }
    }

    /// Sends one line to the child.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is open until finish");
        writeln!(stdin, "{line}").expect("write to the child");
        stdin.flush().expect("flush to the child");
    }

    /// Closes the child's stdin, waits for it and asserts it succeeded.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait for the child");
        let seen: Vec<String> = self.seen.drain(..).chain(self.lines.try_iter()).collect();
        assert!(
            status.success(),
            "child test failed ({status}); its output:\n{}",
            seen.join("\n")
        );
    }

    /// Kills the child (a test that decided to skip).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildTest {
    fn drop(&mut self) {
        // A test that panicked half-way must not leave its child waiting on stdin.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// True in the child started by `spawn_child_test`.
pub fn is_child() -> bool {
    std::env::var_os("XFABRIC_TEST_CHILD").is_some()
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses `hex`.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// `len` bytes of a recognisable pattern seeded by `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
