//! xfabric's warnings in this test process, captured by a subscriber of the test's own, so that
//! a test can check that something hostile was logged (and how often).

use std::io::Write;
use std::sync::{Mutex, Once};

static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures warnings from here on (the first call installs the process's subscriber).
pub fn capture() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(|| Capture)
            .finish();
        let _ = tracing::subscriber::set_global_default(sub);
    });
}

/// How many captured lines so far contain `what`.
pub fn count(what: &str) -> usize {
    let log = LOG.lock().unwrap();
    String::from_utf8_lossy(&log).matches(what).count()
}
