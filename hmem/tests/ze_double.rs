//! The Level Zero interface against a TEST DOUBLE of the loader (tests/doubles/ze_double.c:
//! fake devices backed by host memory), so the real FFI path runs without an Intel GPU:
//! loading and symbol resolution, zeInit/driver/device discovery, host and device
//! allocations, pointer queries, copies through an immediate command list, IPC handles in
//! one process and across two, and the unavailable cases.

#![cfg(feature = "ze")]

mod common;

use std::path::PathBuf;

use common::{double, hex, is_child, live_objects, pattern, spawn_child_test, unhex};
use xfabric_hmem::{Hmem, HmemError, HmemIface, Iface, IpcHandle, Owner, Ze};

/// A private copy of the double for one test.
fn ze_double(test: &str) -> PathBuf {
    double(
        "ze_double.c",
        &[],
        "libze_double.so",
        &format!("libze_double_{test}.so"),
    )
}

fn live(lib: &std::path::Path) -> i32 {
    live_objects(lib, "ze_double_live")
}

#[test]
fn discovers_the_doubles_devices() {
    let lib = ze_double("discover");
    let ze = Ze::with_loader(lib.to_str().unwrap());
    ze.available().expect("the double is a usable loader");
    let devices = ze.devices();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1].index, 1);
    assert_eq!(devices[1].name, "xfabric test double ze device 1");
    assert_eq!(ze.loader(), lib.to_str().unwrap());
    assert_eq!(live(&lib), 1, "one context");
    drop(ze);
    assert_eq!(live(&lib), 0, "the context is destroyed with the interface");
}

#[test]
fn missing_loader_is_unavailable_and_nothing_panics() {
    let ze = Ze::with_loader("/nonexistent/libze_loader.so.1");
    let u = ze.available().unwrap_err();
    assert_eq!(u.iface, Iface::Ze);
    assert!(
        u.reason
            .contains("cannot load /nonexistent/libze_loader.so.1"),
        "{u}"
    );
    assert!(ze.devices().is_empty());
    let e = ze.alloc_device(0, 64).unwrap_err();
    assert!(matches!(e, HmemError::Unavailable(_)), "{e}");
    assert_eq!(e.errno(), libc::ENOSYS);
    assert!(ze.owns(std::ptr::null()).is_err());
    let (mut buf, src) = ([0u8; 4], [0u8; 4]);
    // SAFETY: nothing is copied; the interface refuses first.
    assert!(unsafe { ze.copy_to_host(0, &mut buf, src.as_ptr()) }.is_err());
}

#[test]
fn failed_zeinit_is_unavailable_with_the_drivers_code() {
    let lib = double(
        "ze_double.c",
        &["-DZE_DOUBLE_FAIL_INIT"],
        "libze_double_noinit.so",
        "libze_double_noinit_test.so",
    );
    let u = Ze::with_loader(lib.to_str().unwrap())
        .available()
        .unwrap_err();
    assert!(
        u.reason
            .contains("zeInit failed: ZE_RESULT_ERROR_UNINITIALIZED"),
        "{u}"
    );
}

#[test]
fn a_library_without_the_entry_points_is_unavailable() {
    let u = Ze::with_loader("libc.so.6").available().unwrap_err();
    assert!(u.reason.contains("libc.so.6 lacks zeInit"), "{u}");
}

#[test]
fn device_memory_copies_and_pointer_queries() {
    let lib = ze_double("device");
    let ze = Ze::with_loader(lib.to_str().unwrap());
    let len = 3 * 4096 + 5;
    let buf = ze.alloc_device(1, len).unwrap();
    assert_eq!((buf.iface(), buf.device(), buf.len()), (Iface::Ze, 1, len));

    let owner = Owner {
        iface: Iface::Ze,
        device: 1,
    };
    assert_eq!(ze.owns(buf.as_ptr()).unwrap(), Some(owner));
    // SAFETY: only the address is formed, inside the allocation.
    assert_eq!(
        ze.owns(unsafe { buf.as_ptr().add(len - 1) }).unwrap(),
        Some(owner)
    );
    let host = [0u8; 64];
    assert_eq!(
        ze.owns(host.as_ptr()).unwrap(),
        None,
        "host memory is not Level Zero's"
    );

    let data = pattern(len, 7);
    let mut back = vec![0u8; len];
    // SAFETY: `buf` is device memory of this interface on device 1, `len` bytes long.
    unsafe {
        ze.copy_from_host(1, buf.as_ptr(), &data).unwrap();
        ze.copy_to_host(1, &mut back, buf.as_ptr()).unwrap();
    }
    assert_eq!(back, data);

    // SAFETY: the device number is refused before any copy.
    let e = unsafe { ze.copy_from_host(2, buf.as_ptr(), &data) }.unwrap_err();
    assert!(
        e.to_string().contains("no Level Zero device 2 (2 present)"),
        "{e}"
    );
    assert!(matches!(
        ze.alloc_device(0, 0),
        Err(HmemError::Inval { .. })
    ));

    // The context, a command list for device 1, the allocation.
    assert_eq!(live(&lib), 3);
    buf.free().unwrap();
    assert_eq!(live(&lib), 2);
    assert!(ze.take_drop_errors().is_empty());
    drop(ze);
    assert_eq!(
        live(&lib),
        0,
        "lists and context are destroyed with the interface"
    );
}

#[test]
fn host_mapped_memory_is_zeroed_host_memory_with_atomic_words() {
    let lib = ze_double("host_mapped");
    let ze = Ze::with_loader(lib.to_str().unwrap());
    let m = ze.alloc_host_mapped(0, 64).unwrap();
    assert_eq!(m.device_addr(), m.as_ptr() as u64);
    assert_eq!(
        ze.owns(m.as_ptr()).unwrap(),
        None,
        "host allocations are host memory"
    );
    // SAFETY: 64 bytes of host memory owned by `m`.
    assert!(unsafe { std::slice::from_raw_parts(m.as_ptr(), 64) }
        .iter()
        .all(|&b| b == 0));
    let w = m.atomic_u64(7).unwrap();
    w.store(42, std::sync::atomic::Ordering::Release);
    assert!(m.atomic_u64(8).is_none());
    // SAFETY: reads word 7, inside the allocation.
    assert_eq!(unsafe { m.as_ptr().cast::<u64>().add(7).read() }, 42);
    // Host registration is a no-op for Level Zero.
    // SAFETY: the memory stays mapped until unregistered.
    unsafe {
        ze.host_register(m.as_ptr(), 64).unwrap();
        ze.host_unregister(m.as_ptr()).unwrap();
    }
    drop(m);
    assert_eq!(live(&lib), 1);
}

#[test]
fn ipc_handles_in_one_process() {
    let lib = ze_double("ipc_local");
    let ze = Ze::with_loader(lib.to_str().unwrap());
    let buf = ze.alloc_device(0, 3 * 4096).unwrap();
    let data = pattern(3 * 4096, 3);
    // SAFETY: `buf` is this interface's device memory, 3 pages.
    unsafe { ze.copy_from_host(0, buf.as_ptr(), &data).unwrap() };

    // SAFETY: only the address is formed, inside the allocation.
    let inner = unsafe { buf.as_ptr().add(4096) };
    let h = ze.ipc_get(inner, 100).unwrap();
    assert_eq!(
        (h.iface, h.device, h.offset, h.alloc_len),
        (Iface::Ze, 0, 4096, 3 * 4096)
    );
    assert_eq!(h.base, buf.addr());
    let h = IpcHandle::from_bytes(&h.to_bytes()).unwrap();

    let m = ze.ipc_open(1, &h).unwrap();
    assert_ne!(m.base(), buf.addr(), "the double maps the allocation again");
    assert_eq!(m.len(), 2 * 4096);
    let mut seen = vec![0u8; 100];
    // SAFETY: the mapping is device memory of this interface with 2 pages from `addr`.
    unsafe { ze.copy_to_host(1, &mut seen, m.as_ptr()).unwrap() };
    assert_eq!(seen, data[4096..4196]);
    // SAFETY: as above; then read back through the exporter's own address.
    unsafe {
        ze.copy_from_host(1, m.as_ptr(), b"through the mapping")
            .unwrap();
        ze.copy_to_host(0, &mut seen[..19], inner).unwrap();
    }
    assert_eq!(&seen[..19], b"through the mapping");
    m.close().unwrap();

    let host = [0u8; 8];
    let e = ze.ipc_get(host.as_ptr(), 8).unwrap_err();
    assert!(
        e.to_string().contains("is not Level Zero device memory"),
        "{e}"
    );
    let e = ze.ipc_get(inner, 2 * 4096 + 1).unwrap_err();
    assert!(
        e.to_string().contains("run past the 12288-byte allocation"),
        "{e}"
    );
    let wrong = IpcHandle {
        iface: Iface::Cuda,
        ..h
    };
    assert!(matches!(
        ze.ipc_open(0, &wrong),
        Err(HmemError::Inval { .. })
    ));
    assert!(matches!(
        xfabric_hmem::System::new().ipc_get(inner, 1),
        Err(HmemError::Unsupported { .. })
    ));
    drop(buf);
    assert_eq!(live(&lib), 3, "context and both devices' command lists");
}

/// Child half of `ipc_handles_across_processes`: a no-op unless started by it.
#[test]
fn ze_ipc_child() {
    if !is_child() {
        return;
    }
    // XFABRIC_ZE_LOADER, set by the parent, points the registry at the double.
    let hmem = Hmem::detect();
    let report = hmem.report();
    println!("REPORT {}", report[Iface::Ze as usize]);
    let ze = hmem.ze();
    let buf = ze.alloc_device(0, 8192).unwrap();
    // SAFETY: `buf` is device memory of this interface, 8192 bytes.
    unsafe {
        ze.copy_from_host(0, buf.as_ptr(), &pattern(8192, 11))
            .unwrap()
    };
    // SAFETY: address inside the allocation.
    let h = ze.ipc_get(unsafe { buf.as_ptr().add(8) }, 4000).unwrap();
    println!("HANDLE {}", hex(&h.to_bytes()));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "done");
    let mut got = [0u8; 8];
    // SAFETY: as above.
    unsafe { ze.copy_to_host(0, &mut got, buf.as_ptr().add(8)).unwrap() };
    assert_eq!(
        &got, b"parent!!",
        "the parent's write reached this allocation"
    );
    println!("CHILD OK");
}

#[test]
fn ipc_handles_across_processes() {
    let lib = ze_double("ipc_cross");
    let mut child = spawn_child_test(
        "ze_ipc_child",
        &[("XFABRIC_ZE_LOADER", lib.to_str().unwrap())],
    );
    let report = child.expect_line("REPORT ");
    assert!(
        report.contains("FI_HMEM_ZE: available, 2 device(s); 0: xfabric test double ze device 0"),
        "{report}"
    );
    let h = IpcHandle::from_bytes(&unhex(&child.expect_line("HANDLE "))).unwrap();
    assert_ne!(h.pid, std::process::id());

    let ze = Ze::with_loader(lib.to_str().unwrap());
    let m = match ze.ipc_open(0, &h) {
        Ok(m) => m,
        Err(e @ HmemError::Os { .. }) if matches!(e.errno(), libc::EPERM | libc::ENOSYS) => {
            println!("skipped: this kernel or sandbox refuses pidfd_getfd ({e})");
            child.kill();
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let mut seen = vec![0u8; 4000];
    // SAFETY: the mapping holds 8184 bytes from its address.
    unsafe { ze.copy_to_host(0, &mut seen, m.as_ptr()).unwrap() };
    assert_eq!(seen, pattern(8192, 11)[8..4008]);
    // SAFETY: as above.
    unsafe { ze.copy_from_host(0, m.as_ptr(), b"parent!!").unwrap() };
    m.close().unwrap();
    child.send("done");
    assert_eq!(child.expect_line("CHILD "), "OK");
    child.finish();
}
