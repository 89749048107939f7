//! The CUDA interface, three ways:
//!
//! - here, on a machine without libcuda (CI, developers' machines): CUDA reports unavailable
//!   with a reason, every operation says so, nothing panics;
//! - against a TEST DOUBLE of libcuda (tests/doubles/cuda_double.c: fake devices backed by
//!   host memory), in a child process whose LD_LIBRARY_PATH finds the double first, so
//!   cudarc's run-time loading and every CUDA call xfabric makes run everywhere;
//! - on a real NVIDIA GPU, when selected with `XFABRIC_GPU_TESTS=1` (skipped with a printed
//!   reason otherwise).
//!
//! The double and the GPU run the same checks (`exercise`), cross-process IPC included.

#![cfg(feature = "cuda")]

mod common;

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use common::{double, hex, is_child, live_objects, pattern, spawn_child_test, unhex};
use xfabric_hmem::{Cuda, Hmem, HmemError, HmemIface, Iface, IpcHandle, Owner};

const GPU_ENV: &str = "XFABRIC_GPU_TESTS";
const DOUBLE_ENV: &str = "XFABRIC_CUDA_DOUBLE";
const HANDLE_ENV: &str = "XFABRIC_CUDA_IPC_HANDLE";

#[test]
fn without_libcuda_cuda_is_unavailable_and_nothing_panics() {
    let cuda = Cuda::new();
    let u = match cuda.available() {
        Ok(()) => {
            println!(
                "skipped: libcuda is present here ({} device(s)); the no-driver checks need a \
                 machine without it",
                cuda.devices().len()
            );
            return;
        }
        Err(u) => u,
    };
    println!("CUDA unavailable as expected: {}", u.reason);
    assert_eq!(u.iface, Iface::Cuda);
    assert!(!u.reason.is_empty());
    assert!(cuda.devices().is_empty());
    assert_eq!(cuda.driver_version(), None);

    let host = [0u8; 64];
    let unavailable = |e: HmemError| {
        assert!(
            matches!(&e, HmemError::Unavailable(x) if x.reason == u.reason),
            "{e}"
        );
        assert_eq!(e.errno(), libc::ENOSYS);
        assert!(matches!(
            xfabric_core::Error::from(e),
            xfabric_core::Error::NoSys(_)
        ));
    };
    unavailable(cuda.owns(host.as_ptr()).unwrap_err());
    unavailable(cuda.alloc_device(0, 64).unwrap_err());
    unavailable(cuda.alloc_host_mapped(0, 64).unwrap_err());
    unavailable(cuda.ipc_get(host.as_ptr(), 1).unwrap_err());
    unavailable(cuda.dmabuf(host.as_ptr(), 64).unwrap_err());
    unavailable(cuda.alloc_device_vmm(0, 64, true).unwrap_err());
    unavailable(cuda.vmm_export(host.as_ptr(), 1).unwrap_err());
    let mut back = [0u8; 4];
    // SAFETY: the interface refuses before touching memory.
    unsafe {
        unavailable(cuda.copy_to_host(0, &mut back, host.as_ptr()).unwrap_err());
        unavailable(
            cuda.copy_from_host(0, host.as_ptr() as *mut u8, &back)
                .unwrap_err(),
        );
        unavailable(
            cuda.host_register(host.as_ptr() as *mut u8, 64)
                .unwrap_err(),
        );
    }
    assert!(cuda.take_drop_errors().is_empty());

    let hmem = Hmem::detect();
    assert!(!hmem.device_ifaces().contains(&Iface::Cuda));
    let line = hmem.report()[Iface::Cuda as usize].to_string();
    assert!(line.starts_with("FI_HMEM_CUDA: unavailable: "), "{line}");
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU (and libnvrtc): run with XFABRIC_GPU_TESTS=1 cargo test"
)]
fn gpu_cuda_memory() {
    let cuda = Cuda::new();
    if let Err(u) = cuda.available() {
        panic!("{GPU_ENV}=1 but {u}");
    }
    println!(
        "CUDA driver {:?}, devices: {:?}",
        cuda.driver_version(),
        cuda.devices()
    );
    exercise(&cuda, None);
    // dma-buf export: what this GPU and driver answer (the verbs provider registers CUDA
    // memory by dma-buf where they give one).
    let buf = cuda.alloc_device(0, 2 << 20).unwrap();
    match cuda.dmabuf(buf.as_ptr(), 2 << 20) {
        Ok(d) => println!("dma-buf exported: fd {:?}, offset {}", d.fd, d.offset),
        Err(e) => println!("no dma-buf: {e}"),
    }
    drop(buf);
}

#[test]
fn cuda_double_suite() {
    let lib = double("cuda_double.c", &[], "libcuda_double.so", "cuda/libcuda.so");
    let dir = lib.parent().unwrap().to_str().unwrap().to_string();
    let mut child = spawn_child_test(
        "cuda_double_child",
        &[
            ("LD_LIBRARY_PATH", &dir),
            (DOUBLE_ENV, lib.to_str().unwrap()),
        ],
    );
    assert_eq!(child.expect_line("SUITE "), "OK");
    child.finish();
}

/// Child half of `cuda_double_suite`, where `libcuda.so` is the double: a no-op unless
/// started by it.
#[test]
fn cuda_double_child() {
    let Some(lib) = std::env::var_os(DOUBLE_ENV).filter(|_| is_child()) else {
        return;
    };
    let lib = PathBuf::from(lib);
    let cuda = Cuda::new();
    cuda.available()
        .expect("cudarc finds the double through LD_LIBRARY_PATH");
    assert_eq!(cuda.driver_version(), Some(13000));
    let devices = cuda.devices();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1].name, "xfabric test double cuda device 1");
    let e = cuda.alloc_device(2, 8).unwrap_err();
    assert!(
        e.to_string().contains("no CUDA device 2 (2 present)"),
        "{e}"
    );

    exercise(&cuda, Some(&lib));

    // dma-buf export: the double, as a device without dma-buf support, refuses (it exports
    // vgem dma-bufs only with CUDA_DOUBLE_DMABUF, which the verbs VM test uses); host memory
    // and empty ranges are refused before any call.
    let dev = cuda.alloc_device(0, 8192).unwrap();
    let e = cuda.dmabuf(dev.as_ptr(), 8192).unwrap_err();
    assert!(
        e.to_string()
            .contains("cuMemGetHandleForAddressRange failed: CUDA_ERROR_NOT_SUPPORTED"),
        "{e}"
    );
    let host = [0u8; 64];
    let e = cuda.dmabuf(host.as_ptr(), 64).unwrap_err();
    assert!(e.to_string().contains("not CUDA device memory"), "{e}");
    assert!(cuda.dmabuf(dev.as_ptr(), 0).is_err());
    drop(dev);

    let hmem = Hmem::detect();
    assert!(hmem.device_ifaces().contains(&Iface::Cuda));
    let line = hmem.report()[Iface::Cuda as usize].to_string();
    assert!(
        line.starts_with("FI_HMEM_CUDA: available, 2 device(s)"),
        "{line}"
    );
    let buf = hmem.cuda().alloc_device(1, 64).unwrap();
    assert_eq!(
        hmem.owner(buf.as_ptr()).unwrap(),
        Owner {
            iface: Iface::Cuda,
            device: 1
        }
    );
    drop(buf);
    drop(hmem);
    drop(cuda);
    assert_eq!(
        live_objects(&lib, "cuda_double_live"),
        0,
        "allocations, mappings, registrations, streams and context references are all released"
    );
    println!("SUITE OK");
}

/// Opens the parent's handle in another process: a no-op unless started by `exercise`.
#[test]
fn cuda_ipc_child() {
    let Some(h) = std::env::var(HANDLE_ENV).ok().filter(|_| is_child()) else {
        return;
    };
    let h = IpcHandle::from_bytes(&unhex(&h)).unwrap();
    let cuda = Cuda::new();
    let m = cuda.ipc_open(0, &h).unwrap();
    assert_eq!(m.len(), (h.alloc_len - h.offset) as usize);
    let mut seen = vec![0u8; 100];
    // SAFETY: the mapping is CUDA memory with at least 100 bytes from its address.
    unsafe {
        cuda.copy_to_host(0, &mut seen, m.as_ptr()).unwrap();
        cuda.copy_from_host(0, m.as_ptr(), b"child!!!").unwrap();
    }
    assert_eq!(seen, pattern(1 << 20, 5)[4096..4196]);
    m.close().unwrap();
    // The same allocation claimed longer than it is (a hostile peer's `alloc_len`, the
    // driver's bytes untouched): a copy within the claim would read past the mapping, so the
    // open is refused, nothing left open.
    let long = IpcHandle {
        alloc_len: h.alloc_len * 2,
        ..h.clone()
    };
    let e = cuda.ipc_open(0, &long).unwrap_err();
    assert!(e.to_string().contains("holds"), "{e}");
    if std::env::var_os(DOUBLE_ENV).is_some() {
        // The double's own handle bytes forged longer too (its length at 8..16): it maps no
        // more than the allocation's memfd holds.
        let mut raw = long.raw;
        raw[8..16].copy_from_slice(&long.alloc_len.to_le_bytes());
        let forged = IpcHandle { raw, ..long };
        assert!(cuda.ipc_open(0, &forged).is_err(), "mapped past the memfd");
    }
    assert!(cuda.take_drop_errors().is_empty());
    println!("CHILD OK");
}

/// Virtual-memory-management allocations: made of whole granules, device memory to queries and
/// copies, refused by legacy IPC; exported as a descriptor where made shareable (and not
/// otherwise), imported and mapped from it (here in the same process: the descriptor would
/// travel by SCM_RIGHTS to another; `tests/shm_cuda_ipc.rs` does that), the mapping seeing the
/// same bytes; a descriptor of anything else refused.
fn vmm(cuda: &Cuda) {
    let len = (1 << 20) + 5;
    let buf = cuda.alloc_device_vmm(0, len, true).unwrap();
    assert_eq!(buf.len(), len);
    assert_eq!(
        cuda.owns(buf.as_ptr()).unwrap(),
        Some(Owner {
            iface: Iface::Cuda,
            device: 0
        })
    );
    let data = pattern(len, 11);
    // SAFETY: `buf` is CUDA memory on device 0 of `len` bytes.
    unsafe { cuda.copy_from_host(0, buf.as_ptr(), &data).unwrap() };
    assert!(
        cuda.ipc_get(buf.as_ptr(), len).is_err(),
        "legacy IPC refuses VMM memory"
    );
    // SAFETY: only the address is formed, inside the allocation.
    let inner = unsafe { buf.as_ptr().add(8192) };
    let (h, fd) = cuda.vmm_export(inner, 100).unwrap();
    assert!(h.is_vmm());
    assert_eq!((h.base, h.offset), (buf.addr(), 8192));
    assert!(h.alloc_len >= len as u64);
    assert_ne!(h.alloc_id, 0);
    assert!(
        cuda.vmm_export(inner, h.alloc_len as usize).is_err(),
        "past its end"
    );
    assert!(cuda.ipc_open(0, &h).is_err(), "not a legacy handle");
    let m = cuda.vmm_open(0, &h, fd.as_fd()).unwrap();
    assert_ne!(m.base(), h.base, "mapped anew");
    let mut seen = vec![0u8; 100];
    // SAFETY: the mapping is CUDA memory with at least 100 bytes from its address.
    unsafe { cuda.copy_to_host(0, &mut seen, m.as_ptr()).unwrap() };
    assert_eq!(seen, data[8192..8292]);
    m.close().unwrap();
    // The exporter's memory outlives the importer's mapping, and the other way round.
    let (h, fd) = cuda.vmm_export(buf.as_ptr(), len).unwrap();
    buf.free().unwrap();
    let m = cuda.vmm_open(0, &h, fd.as_fd()).unwrap();
    // SAFETY: as above.
    unsafe { cuda.copy_to_host(0, &mut seen, m.as_ptr()).unwrap() };
    assert_eq!(seen, data[..100]);
    drop(m);

    // A hostile exporter keeps a copy of the descriptor it passed and, once the importer has
    // mapped it, shrinks what it names: it cannot (a driver's allocation has a fixed size; the
    // double's are sealed so), and the importer's copies still read the bytes. A claim longer
    // than what the descriptor names is refused.
    let buf = cuda.alloc_device_vmm(0, len, true).unwrap();
    // SAFETY: `buf` is CUDA memory on device 0 of `len` bytes.
    unsafe { cuda.copy_from_host(0, buf.as_ptr(), &data).unwrap() };
    let (h, fd) = cuda.vmm_export(buf.as_ptr(), len).unwrap();
    let kept = fd.try_clone().unwrap();
    let m = cuda.vmm_open(0, &h, fd.as_fd()).unwrap();
    let shrunk = std::fs::File::from(kept.try_clone().unwrap()).set_len(0);
    assert!(shrunk.is_err(), "the allocation's descriptor shrank");
    // SAFETY: as above.
    unsafe {
        cuda.copy_to_host(0, &mut seen, m.as_ptr().add(len - 100))
            .unwrap()
    };
    assert_eq!(seen, data[len - 100..]);
    drop(m);
    let long = IpcHandle {
        alloc_len: h.alloc_len * 2,
        ..h.clone()
    };
    assert!(
        cuda.vmm_open(0, &long, kept.as_fd()).is_err(),
        "a claim past its end"
    );
    drop(buf);
    if std::env::var_os(DOUBLE_ENV).is_some() {
        // The double's own: a memfd named as its allocations are but made by the peer (not
        // sealed), which it could shrink under the importer, is refused.
        // SAFETY: a NUL-terminated name; the descriptor is owned at once.
        let forged = unsafe {
            use std::os::fd::FromRawFd;
            let fd = libc::memfd_create(c"cuda-double-vmm-999999".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0);
            std::os::fd::OwnedFd::from_raw_fd(fd)
        };
        let f = std::fs::File::from(forged);
        f.set_len(h.alloc_len).unwrap();
        assert!(
            cuda.vmm_open(0, &h, f.as_fd()).is_err(),
            "an unsealed memfd"
        );
    }

    // Not made shareable: not exported, and why.
    let plain = cuda.alloc_device_vmm(0, 4096, false).unwrap();
    let e = cuda.vmm_export(plain.as_ptr(), 1).unwrap_err();
    assert!(
        e.to_string()
            .contains("CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"),
        "{e}"
    );
    drop(plain);
    // cuMemAlloc memory is no VMM allocation.
    let legacy = cuda.alloc_device(0, 4096).unwrap();
    let e = cuda.vmm_export(legacy.as_ptr(), 1).unwrap_err();
    assert!(
        e.to_string()
            .contains("not a virtual-memory-management allocation"),
        "{e}"
    );
    drop(legacy);
    // A descriptor of anything else: the driver refuses it.
    let null = std::fs::File::open("/dev/null").unwrap();
    assert!(cuda.vmm_open(0, &h, null.as_fd()).is_err());
    assert!(cuda.take_drop_errors().is_empty());
}

/// Every CUDA operation, on a GPU or on the double (`double` is its path, for leak counts).
fn exercise(cuda: &Cuda, double: Option<&Path>) {
    let len = (1 << 20) + 3;
    let buf = cuda.alloc_device(0, len).unwrap();
    let owner = Owner {
        iface: Iface::Cuda,
        device: 0,
    };
    assert_eq!(cuda.owns(buf.as_ptr()).unwrap(), Some(owner));
    // SAFETY: only the address is formed, inside the allocation.
    let inner = unsafe { buf.as_ptr().add(4096) };
    assert_eq!(cuda.owns(inner).unwrap(), Some(owner));
    let mut host = vec![0u8; 8192];
    assert_eq!(cuda.owns(host.as_ptr()).unwrap(), None);

    let data = pattern(len, 5);
    let mut back = vec![0u8; len];
    // SAFETY: `buf` is CUDA memory on device 0 of `len` bytes.
    unsafe {
        cuda.copy_from_host(0, buf.as_ptr(), &data).unwrap();
        cuda.copy_to_host(0, &mut back, buf.as_ptr()).unwrap();
    }
    assert_eq!(back, data);

    // Device-visible host memory: zeroed (the double hands out 0xab), host memory to a query.
    let m = cuda.alloc_host_mapped(0, 4096).unwrap();
    assert_ne!(m.device_addr(), 0);
    // SAFETY: 4096 bytes owned by `m`, not yet shared with any device code.
    assert!(unsafe { std::slice::from_raw_parts(m.as_ptr(), 4096) }
        .iter()
        .all(|&b| b == 0));
    m.atomic_u64(0)
        .unwrap()
        .store(7, std::sync::atomic::Ordering::Release);
    assert_eq!(cuda.owns(m.as_ptr()).unwrap(), None);
    m.free().unwrap();

    // Registration of ordinary host memory.
    // SAFETY: `host` stays alive and mapped until unregistered below.
    unsafe {
        cuda.host_register(host.as_mut_ptr(), host.len()).unwrap();
        let e = cuda
            .host_register(host.as_mut_ptr(), host.len())
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
            "{e}"
        );
        assert_eq!(cuda.owns(host.as_ptr()).unwrap(), None);
        cuda.host_unregister(host.as_mut_ptr()).unwrap();
        assert!(cuda.host_unregister(host.as_mut_ptr()).is_err());
    }

    // Asynchronous copies, device to device and device to host, polled to completion: the
    // double holds them until an event recorded after them is found complete.
    let other = cuda.alloc_device(0, 8192).unwrap();
    let mut host_back = vec![0u8; 4096];
    // SAFETY: `inner` has 4096 readable bytes; `other` and `host_back` are written only by
    // the copies, which are polled to completion before anything reads them.
    unsafe {
        let mut d2d = cuda.copy_async(0, other.as_ptr(), inner, 4096).unwrap();
        let mut d2h = cuda
            .copy_async(0, host_back.as_mut_ptr(), other.as_ptr(), 4096)
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !(d2d.poll().unwrap() & d2h.poll().unwrap()) {
            assert!(
                std::time::Instant::now() < deadline,
                "copies never completed"
            );
            std::thread::yield_now();
        }
        assert!(d2d.poll().unwrap(), "done stays done");
        assert!(cuda
            .copy_async(0, other.as_ptr(), inner, 0)
            .unwrap()
            .poll()
            .unwrap());
    }
    assert_eq!(host_back, data[4096..8192]);
    // Each allocation has its own id, which its IPC handles carry.
    let id_other = cuda.ipc_get(other.as_ptr(), 1).unwrap().alloc_id;
    drop(other);

    // IPC: a handle to the allocation, with the offset of the exported address.
    let h = cuda.ipc_get(inner, 100).unwrap();
    assert_ne!(h.alloc_id, 0);
    assert_ne!(h.alloc_id, id_other);
    assert_eq!(
        (h.iface, h.device, h.base, h.offset),
        (Iface::Cuda, 0, buf.addr(), 4096)
    );
    assert!(h.alloc_len >= len as u64);
    assert!(cuda.ipc_get(host.as_ptr(), 1).is_err());
    // In the exporting process the allocation is already mapped: open gives it back.
    let same = cuda.ipc_open(0, &h).unwrap();
    assert_eq!(same.as_ptr(), inner);
    same.close().unwrap();
    // Another process maps it, reads it, and writes into it.
    let mut child = spawn_child_test("cuda_ipc_child", &[(HANDLE_ENV, &hex(&h.to_bytes()))]);
    assert_eq!(child.expect_line("CHILD "), "OK");
    child.finish();
    let mut seen = [0u8; 8];
    // SAFETY: `inner` is CUDA memory with at least 8 bytes after it.
    unsafe { cuda.copy_to_host(0, &mut seen, inner).unwrap() };
    assert_eq!(&seen, b"child!!!");

    vmm(cuda);

    buf.free().unwrap();
    assert!(cuda.take_drop_errors().is_empty());
    if let Some(lib) = double {
        // What remains: device 0's primary context reference and its copy stream.
        assert_eq!(live_objects(lib, "cuda_double_live"), 2);
    }
}
