//! A device for tests whose memory is host memory (`FakeHmem`): what `FI_HMEM` staging, the
//! endpoint's and the engine's, is tested against where no GPU exists. Below everything it
//! serves: it knows the hmem interface only.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::consts::errno::FI_EIO;
use crate::error::{Error, OsError, Result};
use crate::hmem_iface::{HmemOps, Iface, Owner};

/// "Device" memory that is host memory: ranges marked with `add` are CUDA device 0's. Copies
/// are counted, can be made to fail, and copies into the device record in `seen` what the
/// function given to `watch` read then (a counter's value: so a test sees whether data landed
/// before a completion was counted).
#[derive(Default)]
pub struct FakeHmem {
    dev: Mutex<Vec<(usize, usize)>>,
    pub to_host: AtomicUsize,
    pub from_host: AtomicUsize,
    pub fail: AtomicBool,
    watch: Mutex<Option<Watch>>,
    pub seen: Mutex<Vec<u64>>,
}

/// What a copy into the device reads for `seen`.
type Watch = Box<dyn Fn() -> u64 + Send>;

impl FakeHmem {
    /// Calls `read` at every copy into the device from now on, recording its value in `seen`.
    pub fn watch(&self, read: impl Fn() -> u64 + Send + 'static) {
        *self.watch.lock().unwrap() = Some(Box::new(read));
    }

    /// Marks `buf` as device memory.
    pub fn add(&self, buf: &[u8]) {
        self.add_range(buf.as_ptr() as usize, buf.len());
    }

    /// Marks `len` bytes at `addr` as device memory.
    pub fn add_range(&self, addr: usize, len: usize) {
        self.dev.lock().unwrap().push((addr, len));
    }

    /// Copies made so far, both ways.
    pub fn copies(&self) -> usize {
        self.to_host.load(Ordering::Acquire) + self.from_host.load(Ordering::Acquire)
    }

    fn check(&self, what: &str) -> Result<()> {
        if self.fail.load(Ordering::Acquire) {
            return Err(Error::Os {
                op: format!("fake {what}"),
                source: OsError {
                    code: FI_EIO,
                    text: "device copy failed".into(),
                },
            });
        }
        Ok(())
    }
}

impl HmemOps for FakeHmem {
    fn check_iface(&self, _iface: Iface) -> Result<()> {
        Ok(())
    }
    fn owner(&self, addr: usize) -> Result<Owner> {
        let d = self.dev.lock().unwrap();
        Ok(if d.iter().any(|&(a, l)| addr >= a && addr < a + l) {
            Owner {
                iface: Iface::Cuda,
                device: 0,
            }
        } else {
            Owner::SYSTEM
        })
    }
    unsafe fn copy_to_host(&self, _o: Owner, dst: &mut [u8], src: usize) -> Result<()> {
        self.check("copy_to_host")?;
        self.to_host.fetch_add(1, Ordering::AcqRel);
        // SAFETY: the caller's contract: `src` is readable for `dst.len()` bytes.
        dst.copy_from_slice(unsafe { std::slice::from_raw_parts(src as *const u8, dst.len()) });
        Ok(())
    }
    unsafe fn copy_from_host(&self, _o: Owner, dst: usize, src: &[u8]) -> Result<()> {
        self.check("copy_from_host")?;
        self.from_host.fetch_add(1, Ordering::AcqRel);
        if let Some(read) = &*self.watch.lock().unwrap() {
            self.seen.lock().unwrap().push(read());
        }
        // SAFETY: the caller's contract: `dst` is writable for `src.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }
}
