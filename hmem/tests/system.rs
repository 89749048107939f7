//! The host-memory interface, the registry on this machine, the interfaces xfabric does not
//! implement, and `enum fi_hmem_iface` against libfabric's header.

use std::process::Command;
use std::sync::atomic::Ordering;

use xfabric_hmem::{Hmem, HmemError, HmemIface, Iface, IpcHandle, Owner, System};

#[test]
fn system_copies_and_owns_everything() {
    let sys = System::new();
    sys.available().unwrap();
    assert_eq!(sys.devices().len(), 1);
    let src: Vec<u8> = (0..=255).collect();
    let mut dst = vec![0u8; 256];
    assert_eq!(sys.owns(dst.as_ptr()).unwrap(), Some(Owner::SYSTEM));
    // SAFETY: `dst` is host memory of 256 bytes, borrowed only here.
    unsafe { sys.copy_from_host(0, dst.as_mut_ptr(), &src).unwrap() };
    assert_eq!(dst, src);
    let mut back = vec![0u8; 256];
    // SAFETY: `dst` is host memory of 256 bytes.
    unsafe { sys.copy_to_host(0, &mut back, dst.as_ptr()).unwrap() };
    assert_eq!(back, src);
    // SAFETY: the device number is refused before anything is copied.
    let e = unsafe { sys.copy_from_host(1, dst.as_mut_ptr(), &src) }.unwrap_err();
    assert!(e.to_string().contains("only device 0"), "{e}");
    // SAFETY: registration of host memory is a no-op.
    unsafe {
        sys.host_register(dst.as_mut_ptr(), 256).unwrap();
        sys.host_unregister(dst.as_mut_ptr()).unwrap();
    }
}

#[test]
fn system_allocations_are_zeroed_pages() {
    let sys = System::new();
    let m = sys.alloc_host_mapped(0, 100).unwrap();
    assert_eq!(m.as_ptr() as usize % 4096, 0);
    assert_eq!(m.device_addr(), m.as_ptr() as u64);
    assert_eq!((m.len(), m.iface(), m.device()), (100, Iface::System, 0));
    // SAFETY: 100 bytes owned by `m`.
    assert!(unsafe { std::slice::from_raw_parts(m.as_ptr(), 100) }
        .iter()
        .all(|&b| b == 0));
    let bell = m.atomic_u64(11).unwrap();
    assert_eq!(bell.fetch_add(5, Ordering::AcqRel), 0);
    assert!(m.atomic_u64(12).is_none(), "word 12 ends past 100 bytes");
    assert!(m.atomic_u64(usize::MAX).is_none());
    m.free().unwrap();

    let d = sys.alloc_device(0, 10).unwrap();
    assert_eq!(d.addr() as usize % 4096, 0);
    drop(d);
    assert!(sys.take_drop_errors().is_empty());

    assert!(matches!(
        sys.alloc_host_mapped(0, 0),
        Err(HmemError::Inval { .. })
    ));
    assert!(matches!(
        sys.alloc_device(3, 8),
        Err(HmemError::Inval { .. })
    ));
    let e = sys.ipc_get(std::ptr::null(), 1).unwrap_err();
    assert_eq!(e.errno(), libc::EOPNOTSUPP);
}

#[test]
fn unimplemented_interfaces_say_so() {
    let hmem = Hmem::detect();
    for iface in [Iface::Rocr, Iface::Neuron, Iface::SynapseAi] {
        let i = hmem.get(iface);
        assert_eq!(i.iface(), iface);
        let u = i.available().unwrap_err();
        assert_eq!(
            u.reason,
            format!("xfabric does not implement {}", iface.c_name())
        );
        assert!(i.devices().is_empty());
        let e = i.alloc_device(0, 8).unwrap_err();
        assert_eq!(e.errno(), libc::ENOSYS);
        let core: xfabric_core::Error = e.into();
        assert!(matches!(core, xfabric_core::Error::NoSys(_)));
    }
}

/// On a machine without the drivers (this project's CI) the registry still answers: system
/// available, CUDA and Level Zero unavailable with reasons, and host memory owned by System.
#[test]
fn registry_reports_every_interface() {
    let hmem = Hmem::detect();
    let report = hmem.report();
    assert_eq!(report.len(), 6);
    for (line, iface) in report.iter().zip(Iface::ALL) {
        assert_eq!(line.iface, iface);
        println!("{line}");
    }
    assert!(report[0]
        .to_string()
        .starts_with("FI_HMEM_SYSTEM: available, 1 device(s)"));
    for line in &report[1..] {
        if let Err(u) = &line.status {
            assert!(!u.reason.is_empty());
        }
    }
    let host = [1u8; 16];
    assert_eq!(hmem.owner(host.as_ptr()).unwrap(), Owner::SYSTEM);
    let device_ifaces = hmem.device_ifaces();
    assert!(device_ifaces
        .iter()
        .all(|i| i.is_device() && i.is_implemented()));
    assert!(std::ptr::eq(Hmem::global(), Hmem::global()));
}

/// `Iface` values equal `enum fi_hmem_iface` in the installed fi_domain.h.
#[test]
fn iface_values_match_fi_domain_h() {
    if !std::path::Path::new("/usr/include/rdma/fi_domain.h").exists() {
        println!(
            "skipped: /usr/include/rdma/fi_domain.h is absent (apt-get install libfabric-dev)"
        );
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (src, exe) = (dir.join("hmem_iface.c"), dir.join("hmem_iface"));
    let mut c = String::from("#include <stdio.h>\n#include <rdma/fabric.h>\n#include <rdma/fi_domain.h>\nint main(void) {\n");
    for i in Iface::ALL {
        c += &format!("\tprintf(\"{0} %d\\n\", (int){0});\n", i.c_name());
    }
    c += "\treturn 0;\n}\n";
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), Iface::ALL.len());
    for (line, iface) in lines.iter().zip(Iface::ALL) {
        assert_eq!(*line, format!("{} {}", iface.c_name(), iface.as_raw()));
        assert_eq!(Iface::from_raw(iface.as_raw()), Some(iface));
    }
}

/// Bytes at `p`, `len` of them.
fn bytes_at(p: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: every caller passes memory it keeps mapped for `len` bytes during the call.
    unsafe { std::slice::from_raw_parts(p, len) }.to_vec()
}

#[test]
fn host_mapped_memory_exports_and_maps_in_this_process() {
    let sys = System::new();
    let m = sys.alloc_host_mapped(0, 3 * 4096 + 100).unwrap();
    // SAFETY: `m` owns these bytes; nothing else touches them yet.
    let all = unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), m.len()) };
    all.iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i * 7) as u8);
    // SAFETY: 5000 lies inside the allocation.
    let at = unsafe { m.as_ptr().add(5000) };
    let h = sys.ipc_get(at, 100).unwrap();
    assert_eq!(
        (h.iface, h.pid, h.device),
        (Iface::System, std::process::id(), 0)
    );
    assert_eq!(
        (h.base, h.offset, h.alloc_len),
        (m.as_ptr() as u64, 5000, 4 * 4096)
    );
    assert_eq!(sys.export(at, 100), Some(h.clone()));
    assert!(sys.exportable(at, 100) && !sys.exportable(at, 0));
    assert_eq!(IpcHandle::from_bytes(&h.to_bytes()).unwrap(), h);

    let mapped = sys.ipc_open(0, &h).unwrap();
    assert_ne!(mapped.base(), h.base, "a second mapping of the same pages");
    assert_eq!(mapped.len(), 4 * 4096 - 5000);
    assert_eq!(bytes_at(mapped.as_ptr(), 100), bytes_at(at, 100));
    // Shared pages: a store through the allocation shows through the mapping.
    all[5000] = 0xEE;
    assert_eq!(bytes_at(mapped.as_ptr(), 1)[0], 0xEE);
    mapped.close().unwrap();

    // The whole allocation, and no byte more.
    assert!(sys.ipc_get(m.as_ptr(), 4 * 4096).is_ok());
    let e = sys.ipc_get(m.as_ptr(), 4 * 4096 + 1).unwrap_err();
    assert!(matches!(e, HmemError::Inval { .. }), "{e}");
    assert!(sys.export(m.as_ptr(), 4 * 4096 + 1).is_none());
    assert!(!sys.exportable(m.as_ptr(), 4 * 4096 + 1));
    assert!(matches!(sys.ipc_get(at, 0), Err(HmemError::Inval { .. })));

    let heap = [0u8; 64];
    let e = sys.ipc_get(heap.as_ptr(), 64).unwrap_err();
    assert_eq!(e.errno(), libc::EOPNOTSUPP, "{e}");
    // Staging pages are not shared either.
    let d = sys.alloc_device(0, 4096).unwrap();
    assert!(sys.export(d.as_ptr(), 1).is_none());

    let base = m.as_ptr();
    m.free().unwrap();
    assert!(
        sys.export(base, 1).is_none(),
        "a freed allocation is not exported"
    );
    assert!(sys.take_drop_errors().is_empty());
}

/// A memfd of `len` bytes made here, sealed with `seals` (0: none), for handles that name it.
fn memfd(len: i64, seals: libc::c_int) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: plain calls; each result is checked.
    unsafe {
        let fd = libc::memfd_create(
            c"test".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, len), 0);
        if seals != 0 {
            assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, seals), 0);
        }
        std::os::fd::OwnedFd::from_raw_fd(fd)
    }
}

/// A handle naming descriptor `fd` of this process, with its true inode and device.
fn handle_of(fd: i32, alloc_len: u64) -> IpcHandle {
    // SAFETY: a zeroed stat is valid; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
    let mut raw = [0u8; 64];
    raw[0..4].copy_from_slice(&fd.to_le_bytes());
    raw[8..16].copy_from_slice(&st.st_ino.to_le_bytes());
    raw[16..24].copy_from_slice(&st.st_dev.to_le_bytes());
    IpcHandle {
        iface: Iface::System,
        pid: std::process::id(),
        device: 0,
        alloc_id: 0,
        base: 0x1000,
        alloc_len,
        offset: 0,
        raw,
    }
}

#[test]
fn hostile_host_handles_are_refused_with_reasons() {
    use std::os::fd::AsRawFd;
    let sys = System::new();
    let refused = |h: &IpcHandle, part: &str| {
        let e = sys.ipc_open(0, h).unwrap_err();
        assert!(e.to_string().contains(part), "{part:?} not in {e}");
        e
    };
    let sealed = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    let good = memfd(8192, sealed);
    let h = handle_of(good.as_raw_fd(), 8192);
    sys.ipc_open(0, &h).unwrap().close().unwrap();

    let mut bad = h.clone();
    bad.raw[8] ^= 1;
    assert_eq!(refused(&bad, "not the handle's").errno(), libc::EINVAL);
    let mut bad = h.clone();
    bad.alloc_len = 8193;
    refused(&bad, "less than the handle's 8193");
    let mut bad = h.clone();
    bad.alloc_len = 0;
    refused(&bad, "length 0");
    let mut bad = h.clone();
    bad.offset = 8193;
    refused(&bad, "lies past");
    let mut bad = h.clone();
    bad.raw[0..4].copy_from_slice(&999_999i32.to_le_bytes());
    assert_eq!(refused(&bad, "/proc/").errno(), libc::ENOENT);
    let mut bad = h.clone();
    bad.raw[0..4].copy_from_slice(&(-3i32).to_le_bytes());
    refused(&bad, "descriptor -3");
    let mut bad = h.clone();
    bad.raw[40] = 1;
    refused(&bad, "reserved bytes");
    let mut bad = h.clone();
    bad.pid = 0;
    refused(&bad, "pid 0");
    let mut bad = h.clone();
    bad.pid = u32::MAX;
    refused(&bad, "pid");
    let mut bad = h.clone();
    bad.iface = Iface::Cuda;
    refused(&bad, "a cuda handle given to host memory");
    assert!(sys.ipc_open(1, &h).is_err());

    let unsealed = memfd(8192, 0);
    refused(&handle_of(unsealed.as_raw_fd(), 8192), "not sealed");

    // A FIFO's read end: opened with O_PATH, never waiting for a writer, and refused by its
    // mount (pipefs) before anything asks it.
    let mut p = [0i32; 2];
    // SAFETY: `p` holds two descriptors.
    assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    refused(&handle_of(p[0], 8192), "not the memfds'");
    // SAFETY: the pipe's descriptors, closed once.
    unsafe {
        libc::close(p[0]);
        libc::close(p[1]);
    }

    // A process that is gone.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let mut bad = h.clone();
    bad.pid = dead;
    refused(&bad, &format!("/proc/{dead}/fd"));
}

const CHILD_ENV: &str = "XFABRIC_TEST_IPC_HANDLE";

/// Another process maps this one's allocation from its handle alone and reads what was
/// written there; and refuses the handle once its inode is wrong.
#[test]
fn another_process_maps_a_host_allocation() {
    if let Ok(hex) = std::env::var(CHILD_ENV) {
        let b: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let h = IpcHandle::from_bytes(&b).unwrap();
        let sys = System::new();
        let m = sys.ipc_open(0, &h).unwrap();
        let sum: u64 = bytes_at(m.as_ptr(), m.len())
            .iter()
            .map(|&b| b as u64)
            .sum();
        println!("child-sum {sum}");
        let mut bad = h.clone();
        bad.raw[8] ^= 1;
        println!("child-wrong-inode {}", sys.ipc_open(0, &bad).is_err());
        return;
    }
    let sys = System::new();
    let m = sys.alloc_host_mapped(0, 64 << 10).unwrap();
    // SAFETY: `m` owns these bytes.
    let all = unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), m.len()) };
    all.iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i % 251) as u8);
    // SAFETY: inside the allocation.
    let h = sys.ipc_get(unsafe { m.as_ptr().add(4096) }, 1000).unwrap();
    let want: u64 = all[4096..].iter().map(|&b| b as u64).sum();
    let hex: String = h.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "another_process_maps_a_host_allocation",
            "--nocapture",
        ])
        .env(CHILD_ENV, hex)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&format!("child-sum {want}")), "{text}");
    assert!(text.contains("child-wrong-inode true"), "{text}");
}
